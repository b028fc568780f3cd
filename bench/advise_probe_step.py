"""One device's training step of a reference model, measured here, for nanoccl-advise --probe
(nanoccl.advise_probe.probe_step_seconds runs this as a program: the package imports nothing
from the trainers).

    python bench/advise_probe_step.py --model gpt2-tiny --batch 16 --steps 3 --small-batch 4

The reference model (trainers/models.py: real weights on CPU, or on the first CUDA device),
the trainers' AdamW (strategies.make_optimizer), random data; the medians of `--steps` after
one warm-up step of the whole step and of the optimizer's part of it. With --small-batch the
step is measured at that batch too, and forward and backward are taken as a fixed part plus a
part proportional to the batch, through the two points. The last line of the output is JSON:
{"step_s", "optimizer_s", "fixed_s"}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import trainers.models as models  # noqa: E402
import trainers.strategies as strategies  # noqa: E402


def measure_step(model_name: str, gpt: tuple[int, int, int, int, int] | None, batch: int,
                 steps: int, small_batch: int | None) -> dict[str, float]:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if gpt is not None:
        layers, heads, hidden, vocab, seq = gpt
        model = models.GPT(models.GPTConfig(layers, heads, hidden, vocab, seq)).to(dev)
        loss_fn = models.gpt_loss
    else:
        model = models.build_model(model_name, 0).to(dev)
        loss_fn = torch.nn.functional.cross_entropy
    optim = strategies.make_optimizer(model.parameters(), 1e-4)

    def data(n: int) -> tuple[Any, Any]:
        if gpt is not None:
            x = torch.randint(0, gpt[3], (n, gpt[4]), device=dev)
            return x, x
        return (torch.randn(n, 3, 32, 32, device=dev), torch.randint(0, 10, (n,), device=dev))

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def measure(n: int) -> tuple[float, float]:
        x, y = data(n)
        times, optimizer = [], []
        for i in range(steps + 1):
            start = time.perf_counter()
            optim.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            sync()
            mid = time.perf_counter()
            optim.step()
            sync()
            if i:
                end = time.perf_counter()
                times.append(end - start)
                optimizer.append(end - mid)
        return statistics.median(times), statistics.median(optimizer)

    step, opt = measure(batch)
    if not small_batch or not 1 <= small_batch < batch:
        return {"step_s": step, "optimizer_s": opt, "fixed_s": 0.0}
    small, _ = measure(small_batch)
    per_sample = max(0.0, (step - small) / (batch - small_batch))
    fixed = max(0.0, step - opt - per_sample * batch)  # at most step - opt
    return {"step_s": step, "optimizer_s": opt, "fixed_s": fixed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a name of trainers/models.py, or a label")
    p.add_argument("--gpt", default=None, metavar="L,H,E,V,T",
                   help="a GPT of these layers, heads, hidden size, vocabulary and sequence")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--small-batch", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch's threads (default: its own)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    gpt = None
    if args.gpt:
        gpt = tuple(int(v) for v in args.gpt.split(","))
        if len(gpt) != 5:
            p.error("--gpt takes five numbers: layers,heads,hidden,vocab,seq")
    elif models.is_gpt(args.model):
        cfg = models.gpt_config(args.model)
        gpt = (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.block_size)
    print(json.dumps(measure_step(args.model, gpt, args.batch, args.steps, args.small_batch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
