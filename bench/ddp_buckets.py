#!/usr/bin/env python3
"""DDP bucket sizes side by side in one launch: the tuned size against fixed ones.

The reference trainers' model (trainers/models.py: a GPT or ResNet-18, same seed, same
global batches) is trained once per bucket size, every model under DDP on the same nanoccl
group, steps interleaved (one step of each size in a shuffled order, then the next step), so
that machine drift hits every size alike. One of the sizes is the tuner's:
nanoccl.tune.ddp_bucket_cap_mb from the group's link profile (measured at group creation,
NANOCCL_TUNING=measure by default here), the model's gradients and its backward time measured
on this rank. When the tuned size is one of the fixed ones it is trained once and counted for
both. Reports each size's median step time (the slowest rank's, per step) and the tuned
size's time over the best fixed one.

Run under torchrun, e.g. on the emulated 2x2 cluster at 1 Gbit/s:

    python bench/emucluster.py --nodes 2 --procs-per-node 2 --rate 1gbit -- \\
        bench/ddp_buckets.py --model resnet18 --json results/tuning/ddp_resnet18_2x2.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "torch_ext"))  # behind an installed nanoccl, the source tree's

from trainers.data import make_source, shard  # noqa: E402
from trainers.models import MODEL_NAMES, build_model, gpt_config, is_gpt  # noqa: E402
from trainers.strategies import (TrainConfig, loss_fn_for, make_optimizer,  # noqa: E402
                                 wrap_ddp)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2-tiny", choices=MODEL_NAMES)
    p.add_argument("--caps", default="1,5,25,100", help="fixed bucket sizes, MB (comma list)")
    p.add_argument("--codec", default=None,
                   help="compress across nodes with this codec (Options(compression=...)) and "
                        "average through nanoccl.hooks' error-feedback hook")
    p.add_argument("--tuning", default="measure", choices=("measure", "cached"),
                   help="where the link profile comes from (default: measured at creation, "
                        "into a file of this run's unless NANOCCL_TUNING_FILE is set)")
    p.add_argument("--steps", type=int, default=12, help="steps per size, warm-up included")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--batch", type=int, default=None, help="global batch (default: 16 GPT, 32 "
                                                           "ResNet)")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=float, default=600.0, help="process group timeout, s")
    p.add_argument("--json", default=None, help="write the results here (rank 0)")
    args = p.parse_args(argv)
    try:
        args.caps = [float(c) for c in args.caps.split(",") if c.strip()]
    except ValueError:
        p.error(f"--caps {args.caps!r}: a comma list of sizes in MB")
    if not args.caps or min(args.caps) <= 0:
        p.error("--caps: at least one size, each > 0")
    if not 0 <= args.warmup_steps < args.steps:
        p.error("need 0 <= --warmup-steps < --steps")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import nanoccl
    from nanoccl.tune import ddp_bucket_cap_mb, measure_backward_seconds

    if "RANK" not in os.environ:
        print("ddp_buckets: run it under torchrun or bench/emucluster.py (it needs >= 2 ranks)",
              file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=args.timeout)
    # A run's own profile file unless NANOCCL_TUNING_FILE names one: the user's saved profile
    # (maybe of other links) is neither used nor overwritten.
    options: dict[str, str] = {"tuning": args.tuning, "tuning_file": os.environ.get(
        "NANOCCL_TUNING_FILE") or os.path.join(tempfile.mkdtemp(prefix="ddp_buckets_"),
                                               "link_profile.txt")}
    if args.codec:
        options["compression"] = args.codec
    dist.init_process_group("nanoccl", timeout=timeout,
                            pg_options=nanoccl.Options(**options))
    try:
        return _run(args, ddp_bucket_cap_mb, measure_backward_seconds)
    finally:
        dist.destroy_process_group()


def _run(args: argparse.Namespace, ddp_bucket_cap_mb: Any,
         measure_backward_seconds: Any) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    ctrl = dist.new_group(backend="gloo")
    gpt = is_gpt(args.model)
    batch = args.batch or (16 if gpt else 32)
    seq_len = args.seq_len or (gpt_config(args.model).block_size if gpt else 0)
    vocab = gpt_config(args.model).vocab_size if gpt else 0
    source = make_source(args.model, batch, seq_len, vocab, args.seed, None)
    loss_fn = loss_fn_for(args.model)

    def rank_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return shard(source.global_batch(step), rank, world)

    probe = build_model(args.model, args.seed)
    x0, y0 = rank_batch(0)
    backward_s = measure_backward_seconds(probe, lambda: loss_fn(probe(x0), y0))
    tuned = ddp_bucket_cap_mb(probe, None, backward_s, codec=args.codec)
    grad_mib = sum(p.numel() * p.element_size() for p in probe.parameters()) / 2**20
    del probe
    caps = list(dict.fromkeys(args.caps + [tuned]))

    # The trainers' DDP set-up (dp strategy): bucket size, error-feedback hook with the codec,
    # AdamW.
    cfg = TrainConfig(model=args.model, strategy="dp", global_batch=batch, seq_len=seq_len,
                      seed=args.seed, codec=args.codec)
    sides = []
    for cap in caps:
        ddp = wrap_ddp(build_model(args.model, args.seed), replace(cfg, bucket_cap_mb=cap))
        sides.append((cap, ddp, make_optimizer(ddp.parameters(), cfg.lr)))
    if rank == 0:
        print(f"ddp_buckets: {args.model} ({grad_mib:.1f} MiB of gradients), {world} ranks, "
              f"global batch {batch}, codec {args.codec or 'none'}; backward {backward_s * 1e3:.0f}"
              f" ms on rank 0; tuned bucket {tuned:g} MB; sizes {', '.join(f'{c:g}' for c in caps)}"
              f"; {args.steps} steps each ({args.warmup_steps} warm-up)", flush=True)

    times = [[0.0] * args.steps for _ in sides]
    losses = [[0.0] * args.steps for _ in sides]
    order = list(range(len(sides)))
    shuffle = random.Random(args.seed)  # the same order on every rank
    dist.barrier(group=ctrl)
    for step in range(args.steps):
        x, y = rank_batch(step)
        shuffle.shuffle(order)
        for k in order:
            _, ddp, optim = sides[k]
            dist.barrier(group=ctrl)  # each step starts together: its time is its own
            start = time.perf_counter()
            optim.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()  # DDP's bucket allreduces complete in here
            optim.step()
            times[k][step] = time.perf_counter() - start
            losses[k][step] = float(loss.detach())
        if rank == 0:
            print(f"ddp_buckets: step {step + 1}/{args.steps} " + "  ".join(
                f"{caps[k]:g}MB {times[k][step] * 1e3:.0f} ms" for k in range(len(sides))),
                flush=True)

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (times, losses, backward_s), group=ctrl)
    if rank == 0:
        rows = []
        for k, cap in enumerate(caps):
            slowest = [max(g[0][k][s] for g in gathered) for s in range(args.steps)]
            timed = slowest[args.warmup_steps:]
            rows.append({"bucket_cap_mb": cap, "tuned": cap == tuned, "fixed": cap in args.caps,
                         "median_step_s": statistics.median(timed),
                         "mean_step_s": statistics.fmean(timed), "step_s": slowest,
                         "final_loss": statistics.fmean(g[1][k][-1] for g in gathered)})
        best = min((r for r in rows if r["fixed"]), key=lambda r: r["median_step_s"])
        mine = next(r for r in rows if r["tuned"])
        ratio = mine["median_step_s"] / best["median_step_s"]
        print(f"{'bucket MB':>10} {'median step ms':>15} {'mean ms':>9} {'final loss':>11}")
        for r in rows:
            mark = " tuned" if r["tuned"] else ""
            mark += " best fixed" if r is best else ""
            print(f"{r['bucket_cap_mb']:>10g} {r['median_step_s'] * 1e3:>15.1f} "
                  f"{r['mean_step_s'] * 1e3:>9.1f} {r['final_loss']:>11.4f}{mark}")
        print(f"ddp_buckets: tuned {tuned:g} MB / best fixed {best['bucket_cap_mb']:g} MB: "
              f"{ratio:.3f} (median step time)")
        if args.json:
            doc = {"tool": "ddp_buckets", "model": args.model, "world_size": world,
                   "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", world)),
                   "codec": args.codec, "global_batch": batch, "steps": args.steps,
                   "warmup_steps": args.warmup_steps, "grad_mib": grad_mib,
                   "backward_s": [g[2] for g in gathered], "tuned_mb": tuned,
                   "best_fixed_mb": best["bucket_cap_mb"], "tuned_over_best": ratio,
                   "rows": rows, "link_profile": _profile_text(),
                   "torch": torch.__version__}
            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc, indent=1))
    dist.barrier(group=ctrl)
    return 0


def _profile_text() -> str | None:
    import nanoccl

    profile = nanoccl.link_profile()
    return None if profile is None else profile["text"]


if __name__ == "__main__":
    sys.exit(main())
