"""One training run of the study: a model, a strategy, a backend (run under torchrun).

    torchrun --nproc-per-node 2 -m trainers.train --model gpt2-tiny --strategy dp \\
        --backend gloo --steps 20 --batch 16
    python -m trainers.train --model gpt2-tiny --strategy single --steps 5   # one rank

Prints one line per step (time, loss) from the rank that sees the loss and, at the end,
one JSON line (``"kind": "nanoccl_train_result"``) with samples/s (tokens/s for GPT,
images/s for ResNet), mean/std step time, the final loss, peak memory (maxrss), and the
bytes moved: nanoccl.stats() when the backend is nanoccl, and the node's network interface
counters (/sys/class/net/<if>/statistics) when the ranks run in emulated nodes.

Held-out loss (--eval-every N, GPT on single/dp/zero1/diloco): before the first step, every
N steps and after the last, the mean token loss over a fixed set of held-out sequences
(--eval-sequences of them: windows of --eval-data, or of the --data corpus folder's held-out
split, bench/corpus.py; synthetic data: another seed's draws); diloco evaluates its global
parameters (the snapshot swapped in, its local ones restored after). The result's
"held_out" field carries the curve: per evaluation the step, the tokens trained on
(step x global batch x sequence length), the training time so far (the sum of the slowest
rank's step times: evaluations left out), the loss and the evaluated parameters' SHA-256.
An evaluation first waits for the communication still running in the background (diloco's
exchanges in flight), a wait counted in the last step's time and in the window; its own
time, barrier to barrier, is taken out of the timed window.

Timing: the first --warmup-steps steps are left out; the timed window opens and closes
with a barrier on a separate gloo group, throughput = global samples x timed steps /
window. Step time per step is the slowest rank's. With --min-window-s, the ranks agree when
the window opens (the slowest rank's fastest warm-up step, one allreduce before the window) on
enough timed steps to fill about that many seconds: a few steps of 40 ms measure noise.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a file (torchrun trainers/train.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from trainers import backends  # noqa: E402
from trainers.data import held_out, make_source  # noqa: E402
from trainers.models import MODEL_NAMES, gpt_config, gpt_flops_per_token, is_gpt  # noqa: E402
from trainers.strategies import (BATCH_SPLIT, STRATEGIES, StrategyError,  # noqa: E402
                                 TrainConfig, check_batch, env_int, make_strategy)

RESULT_KIND = "nanoccl_train_result"
MAX_TIMED_STEPS = 400  # --min-window-s's bound on a run's timed steps


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainers.train",
                                description="One study training run (DP/TP/PP/ZeRO/DiLoCo) under "
                                            "torchrun.")
    p.add_argument("--model", default="gpt2-tiny", choices=MODEL_NAMES)
    p.add_argument("--strategy", default="dp", choices=STRATEGIES)
    p.add_argument("--backend", default="gloo",
                   help="gloo | nccl | nanoccl | nanoccl+<codec>[+qwz|+qwz4] (default gloo)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps, warm-up included")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="steps left out of the timing (default min(2, steps - 1))")
    p.add_argument("--min-window-s", type=float, default=0.0,
                   help="more timed steps than --steps gives, when needed to time about this "
                        "many seconds (estimated from the fastest warm-up step; at most "
                        f"{MAX_TIMED_STEPS} timed steps, diloco's rounded up to whole "
                        "--sync-every cycles; needs a warm-up step; default 0: off)")
    p.add_argument("--batch", type=int, default=None,
                   help="global batch in samples (default 16 for GPT, 32 for ResNet)")
    p.add_argument("--seq-len", type=int, default=None, help="GPT context (default: the model's)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--bucket-cap-mb", type=_bucket_cap, default=None,
                   help="DDP bucket size in MB (dp, zero1), or 'tuned': nanoccl chooses it from "
                        "the link profile (NANOCCL_TUNING, default here: cached)")
    p.add_argument("--microbatches", type=int, default=None,
                   help="pipeline microbatches (default: the number of stages)")
    p.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b"), help="pp schedule")
    p.add_argument("--fsdp-overlap", default="off", choices=("on", "off"),
                   help="FSDP2 strategies on CPU: overlap the reduce-scatters (hsdp: the "
                        "cross-node allreduces) and all-gathers with compute, as a GPU's "
                        "streams do (nanoccl.hooks.overlap_fsdp, any backend); default off, "
                        "FSDP2's own calls in place")
    p.add_argument("--hsdp-step", default="forward", choices=("forward", "backward"),
                   help="hsdp with a codec: 'forward' (default) gathers each unit's averaged "
                        "gradient across nodes and steps the unit in its next forward; "
                        "'backward' all-reduces it in the backward, one optimizer step after")
    p.add_argument("--sync-every", type=int, default=50, metavar="H",
                   help="diloco: inner steps between two outer steps of a fragment (default 50)")
    p.add_argument("--fragments", type=int, default=1, metavar="F",
                   help="diloco: parameter-order fragments synchronised at staggered steps "
                        "(Streaming DiLoCo; default 1)")
    p.add_argument("--overlap-steps", type=int, default=0, metavar="TAU",
                   help="diloco: inner steps each cross-node exchange runs behind, in the "
                        "background (0 <= TAU < H; default 0)")
    p.add_argument("--outer-lr", type=float, default=0.7, help="diloco: outer Nesterov SGD lr")
    p.add_argument("--outer-momentum", type=float, default=0.9,
                   help="diloco: outer Nesterov SGD momentum")
    p.add_argument("--probe-one-rank", action="store_true",
                   help="let tp run on one rank (nothing split, DTensor's dispatch kept): how "
                        "nanoccl-advise --probe-framework times the framework's own work")
    p.add_argument("--data", default=None,
                   help="real data: a text file (GPT, bytes as tokens) or a folder of .npy "
                        "images (ResNet); default synthetic")
    p.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="held-out loss before the first step, every N steps and after the "
                        "last (GPT; single, dp, zero1, diloco; default 0: none)")
    p.add_argument("--eval-data", default=None,
                   help="held-out text (bytes as tokens) or a corpus folder (its held-out "
                        "split); default: the --data corpus folder's held-out split, or for "
                        "synthetic data another seed's sequences")
    p.add_argument("--eval-sequences", type=int, default=256,
                   help="held-out sequences of --seq-len tokens per evaluation (default 256)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per rank (default OMP_NUM_THREADS, else 1)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda for nccl, else cpu)")
    p.add_argument("--timeout", type=float, default=600.0, help="process group timeout, s")
    p.add_argument("--netif", default=None,
                   help="interface whose counters measure the node's traffic (default "
                        "GLOO_SOCKET_IFNAME unless it is lo)")
    p.add_argument("--standalone", action="store_true",
                   help="one rank on its own, ignoring a surrounding torchrun's environment")
    p.add_argument("--json", default=None, help="also write the result here (rank 0)")
    p.add_argument("--print-every", type=int, default=1, help="step lines every N steps (0: none)")
    return p


def _read_counters(ifname: str | None) -> tuple[int, int] | None:
    if not ifname:
        return None
    base = Path("/sys/class/net") / ifname / "statistics"
    try:
        return int((base / "tx_bytes").read_text()), int((base / "rx_bytes").read_text())
    except (OSError, ValueError):
        return None


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _bucket_cap(text: str) -> float | str:
    if text == "tuned":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a size in MB or 'tuned'") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.steps_asked = args.steps  # --min-window-s may run more
    try:
        spec = backends.parse_backend(args.backend)
    except ValueError as exc:
        print(f"train: {exc}", file=sys.stderr)
        return 2
    gpt = is_gpt(args.model)
    batch = args.batch or (16 if gpt else 32)
    seq_len = args.seq_len or (gpt_config(args.model).block_size if gpt else 0)
    if gpt and seq_len > gpt_config(args.model).block_size:
        print(f"train: --seq-len {seq_len} exceeds {args.model}'s context "
              f"{gpt_config(args.model).block_size}", file=sys.stderr)
        return 2
    warmup = args.warmup_steps if args.warmup_steps is not None else min(2, args.steps - 1)
    if args.steps < 1 or not 0 <= warmup < args.steps:
        print("train: need --steps >= 1 and 0 <= --warmup-steps < --steps", file=sys.stderr)
        return 2
    if not 0 <= args.min_window_s < math.inf or (args.min_window_s > 0 and warmup < 1):
        print(f"train: --min-window-s {args.min_window_s}: must be a finite number >= 0, "
              "and > 0 needs a warm-up step (--warmup-steps >= 1) to estimate a step",
              file=sys.stderr)
        return 2
    if args.eval_every < 0 or args.eval_sequences < 1:
        print("train: need --eval-every >= 0 and --eval-sequences >= 1", file=sys.stderr)
        return 2
    if args.eval_every and not gpt:
        print(f"train: --eval-every is for the GPT models, not {args.model}", file=sys.stderr)
        return 2
    threads = args.threads or env_int("OMP_NUM_THREADS", 1)
    torch.set_num_threads(max(1, threads))
    device = args.device or ("cuda" if spec.name == "nccl" else "cpu")
    local_rank = env_int("LOCAL_RANK", 0)
    if args.standalone and args.strategy != "single":
        print("train: --standalone runs strategy 'single' only", file=sys.stderr)
        return 2
    if device == "cuda":
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(local_rank)

    tuning = None
    if args.bucket_cap_mb == "tuned":
        if (not spec.is_nanoccl or args.strategy not in ("dp", "zero1") or args.standalone
                or env_int("WORLD_SIZE", 1) < 2):
            print("train: --bucket-cap-mb tuned needs --backend nanoccl[+codec], strategy dp "
                  "or zero1 (DDP) and at least 2 ranks (a link to tune for)", file=sys.stderr)
            return 2
        # The tuner needs a link profile: the saved one when it fits, else measured.
        tuning = None if os.environ.get("NANOCCL_TUNING") else "cached"
    try:
        backends.init(spec, args.timeout, standalone=args.standalone, tuning=tuning)
    except backends.BackendUnavailable as exc:
        print(f"train: {exc}", file=sys.stderr)
        return 2
    try:
        return _run(args, spec, batch, seq_len, warmup, threads, device, local_rank)
    except StrategyError as exc:
        print(f"train: {exc}", file=sys.stderr)
        return 3
    finally:
        # The strategy's objects (DDP, ZeroRedundancyOptimizer, ...) hold the process group
        # in reference cycles; freed at interpreter exit, gloo's threads outlive Python and
        # the process aborts ("terminate called without an active exception"). Free them
        # now, before the group goes.
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()


def _run(args: argparse.Namespace, spec: backends.BackendSpec, batch: int, seq_len: int,
         warmup: int, threads: int, device: str, local_rank: int) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = world if args.standalone else env_int("LOCAL_WORLD_SIZE", world)
    nodes = max(1, world // max(1, local_world))
    check_batch(args.strategy, batch, world)
    ctrl = dist.new_group(backend="gloo") if spec.name != "gloo" else None
    gpt = is_gpt(args.model)
    vocab = gpt_config(args.model).vocab_size if gpt else 0
    source = make_source(args.model, batch, seq_len, vocab, args.seed, args.data)
    held: Any = None
    if args.eval_every:
        try:
            held = held_out(seq_len, vocab, args.seed, args.data, args.eval_data,
                            args.eval_sequences)
        except ValueError as exc:
            raise StrategyError(str(exc)) from None
    cfg = TrainConfig(model=args.model, strategy=args.strategy, global_batch=batch,
                      seq_len=seq_len, lr=args.lr, seed=args.seed,
                      bucket_cap_mb=args.bucket_cap_mb, microbatches=args.microbatches,
                      schedule=args.schedule, device=device, local_world=local_world,
                      codec=spec.codec, gather_codec=spec.gather_codec,
                      timeout_s=args.timeout, nanoccl=spec.is_nanoccl,
                      fsdp_overlap=args.fsdp_overlap == "on", hsdp_step=args.hsdp_step,
                      probe_one_rank=args.probe_one_rank, sync_every=args.sync_every,
                      fragments=args.fragments, overlap_steps=args.overlap_steps,
                      outer_lr=args.outer_lr, outer_momentum=args.outer_momentum)
    strategy = make_strategy(cfg, source, rank, world)
    if held is not None and not strategy.evaluates:
        raise StrategyError(f"--eval-every: {args.strategy} has no held-out evaluation (the "
                            "strategies that hold the whole model on every rank have: "
                            "single, dp, zero1, diloco)")
    unit = "tokens" if gpt else "images"
    per_sample = seq_len if gpt else 1
    reporter = world - 1 if args.strategy == "pp" else 0
    if rank == 0:
        print(f"train: {args.model} ({strategy.params / 1e6:.2f} M params), "
              f"{strategy.describe()}, backend {spec.text}, {world} rank(s) on {nodes} node(s), "
              f"global batch {batch}" + (f" x {seq_len} tokens" if gpt else " images")
              + f", {args.steps} steps ({warmup} warm-up), {threads} thread(s)/rank", flush=True)

    ifname = args.netif
    if ifname is None:
        candidate = os.environ.get("GLOO_SOCKET_IFNAME", "")
        ifname = candidate if candidate and candidate != "lo" else None
    count_link = local_rank == 0 and ifname is not None

    step_s: list[float] = []
    losses: list[float | None] = []
    t_start = t_end = 0.0
    counters_start = counters_end = None
    stats_start = stats_end = None
    step = 0
    evals: list[tuple[int, float, str]] = []  # (steps done, held-out loss, parameters' digest)
    eval_in_window = 0.0  # seconds of evaluation inside the timed window (taken out)
    while True:
        if held is not None and (step % args.eval_every == 0 or step == args.steps):
            # Background communication (diloco's exchanges in flight) finishes first, its
            # wait counted as the last step's time, as the step that applies it would count it.
            waited = time.perf_counter()
            strategy.quiesce()
            if step_s:
                step_s[-1] += time.perf_counter() - waited
            dist.barrier(group=ctrl)
            began = time.perf_counter()
            evals.append((step, *strategy.held_out_loss(held[0][0], held[0][1], ctrl)))
            dist.barrier(group=ctrl)
            if step > warmup:
                eval_in_window += time.perf_counter() - began
            if rank == reporter and args.print_every > 0:
                print(f"eval at step {step}: held-out loss {evals[-1][1]:.4f}", flush=True)
        if step >= args.steps:
            break
        if step == warmup:
            if args.min_window_s > 0:  # agree on the timed steps (also the window's barrier)
                slowest = torch.tensor([min(step_s)], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=ctrl)
                timed = timed_steps_for(args.min_window_s, float(slowest), args.steps - warmup)
                if args.strategy == "diloco":  # whole H-step cycles: its steady state
                    timed = -(-timed // args.sync_every) * args.sync_every
                args.steps = warmup + timed
            else:
                dist.barrier(group=ctrl)
            counters_start = _read_counters(ifname) if count_link else None
            stats_start = backends.nanoccl_stats(spec, strategy.comm_groups())
            t_start = time.perf_counter()
        begin = time.perf_counter()
        loss = strategy.train_step(step)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - begin
        step_s.append(elapsed)
        losses.append(loss)
        if (rank == reporter and args.print_every > 0
                and ((step + 1) % args.print_every == 0 or step + 1 == args.steps)):
            shown = f"{loss:.4f}" if loss is not None else "-"
            print(f"step {step + 1}/{args.steps} loss {shown} time {elapsed * 1000:.1f} ms"
                  + (" (warm-up)" if step < warmup else ""), flush=True)
        step += 1
    # What the strategy leaves pending (hsdp: the last step's gathers and updates, run in the
    # next forward): after a warm-up the window's first forward ran the warm-up's, so the last
    # step's are not timed; without one they are. Either way the window holds its steps' work.
    if warmup == 0:
        strategy.finish()
    dist.barrier(group=ctrl)
    t_end = time.perf_counter()
    counters_end = _read_counters(ifname) if count_link else None
    stats_end = backends.nanoccl_stats(spec, strategy.comm_groups())
    if warmup > 0:
        strategy.finish()

    link: tuple[int, int] | None = None
    if counters_start is not None and counters_end is not None:
        link = (counters_end[0] - counters_start[0], counters_end[1] - counters_start[1])
    moved: dict[str, int] | None = None
    if stats_start is not None and stats_end is not None:
        # An op first used after the warm-up has no count at its start.
        moved = {k: stats_end[k] - stats_start.get(k, 0) for k in stats_end}
    mine = {"rank": rank, "step_s": step_s, "losses": losses, "peak_rss_mb": _peak_rss_mb(),
            "link": link, "ifname": ifname if count_link else None, "nanoccl": moved,
            "window_s": t_end - t_start - eval_in_window, "eval_s": eval_in_window,
            "cuda_peak_mb": (torch.cuda.max_memory_allocated() / 2**20
                             if device.startswith("cuda") else None)}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine, group=ctrl)
    if rank == 0:
        result = summarize(args, spec, strategy, gathered, batch, seq_len, warmup, unit,
                           per_sample, nodes, local_world, threads)
        result["held_out"] = held_out_doc(args, held, evals, result["step_time_s"],
                                          batch * per_sample,
                                          max(g["eval_s"] for g in gathered))
        line = json.dumps(result)
        print(line, flush=True)
        if args.json:
            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(line + "\n")
    dist.barrier(group=ctrl)
    return 0


def held_out_doc(args: argparse.Namespace, held: Any, evals: list[tuple[int, float, str]],
                 step_time_s: list[float], tokens_per_step: int,
                 eval_s: float) -> dict[str, Any] | None:
    """The result's "held_out" field: what was evaluated and the curve, one point per
    evaluation: steps done, tokens trained on, training time so far (the slowest rank's
    step times summed, evaluations left out), the held-out loss and the SHA-256 of the
    evaluated parameters on rank 0 (16 hex digits: runs that trained the same bits agree)."""
    if held is None:
        return None
    curve = [{"step": s, "tokens": s * tokens_per_step, "time_s": math.fsum(step_time_s[:s]),
              "loss": loss, "params_sha256": digest} for s, loss, digest in evals]
    return {"every": args.eval_every, "sequences": int(held[0][0].shape[0]),
            "tokens": int(held[0][1].numel()), "data": held[1],
            "eval_s_in_window": eval_s, "final_loss": evals[-1][1] if evals else None,
            "curve": curve}


def timed_steps_for(min_window_s: float, step_s: float, at_least: int) -> int:
    """Timed steps to fill about min_window_s at step_s a step: at least `at_least`, at most
    MAX_TIMED_STEPS (or `at_least` if that is more)."""
    wanted = math.ceil(min_window_s / step_s) if step_s > 0 else MAX_TIMED_STEPS
    return max(at_least, min(wanted, MAX_TIMED_STEPS))


def combine_losses(strategy: str, per_rank: list[list[float | None]]) -> list[float | None]:
    """The global loss per step: the mean over data-parallel ranks (equal slices),
    the one value tensor/pipeline ranks agree on."""
    steps = len(per_rank[0])
    out: list[float | None] = []
    for s in range(steps):
        values = [r[s] for r in per_rank if r[s] is not None]
        if not values:
            out.append(None)
        elif BATCH_SPLIT.get(strategy) == "split" or strategy == "single":
            out.append(statistics.fmean(values))  # type: ignore[arg-type]
        else:
            out.append(values[0])
    return out


def summarize(args: argparse.Namespace, spec: backends.BackendSpec, strategy: Any,
              gathered: list[dict[str, Any]], batch: int, seq_len: int, warmup: int, unit: str,
              per_sample: int, nodes: int, local_world: int, threads: int) -> dict[str, Any]:
    steps = args.steps
    timed = steps - warmup
    step_max = [max(g["step_s"][s] for g in gathered) for s in range(steps)]
    timed_steps = step_max[warmup:]
    window = max(g["window_s"] for g in gathered)
    samples_per_s = batch * timed / window if window > 0 else 0.0
    losses = combine_losses(args.strategy, [g["losses"] for g in gathered])
    links = [g for g in gathered if g["link"] is not None]
    link_doc = None
    if links:
        tx = sum(g["link"][0] for g in links)
        rx = sum(g["link"][1] for g in links)
        link_doc = {"ifname": links[0]["ifname"], "tx_bytes": tx, "rx_bytes": rx,
                    "per_node": [{"rank": g["rank"], "tx_bytes": g["link"][0],
                                  "rx_bytes": g["link"][1]} for g in links]}
    moved = [g["nanoccl"] for g in gathered if g["nanoccl"] is not None]
    nanoccl_doc = None
    if moved:
        keys = sorted({k for m in moved for k in m})  # ranks may differ in their ops
        nanoccl_doc = {k: sum(m.get(k, 0) for m in moved) for k in keys}
    gpt = unit == "tokens"
    flops = None
    if gpt:
        flops = gpt_flops_per_token(gpt_config(args.model), seq_len) * batch * seq_len
    return {
        "kind": RESULT_KIND,
        "model": args.model, "strategy": args.strategy, "backend": spec.text,
        "world_size": len(gathered), "nodes": nodes, "procs_per_node": local_world,
        "params": strategy.params, "description": strategy.describe(),
        "global_batch": batch, "seq_len": seq_len if gpt else None, "unit": unit,
        "steps": steps, "warmup_steps": warmup, "timed_steps": timed, "threads": threads,
        "min_window_s": args.min_window_s, "steps_asked": args.steps_asked,
        "microbatches": getattr(strategy, "microbatches", None),
        "schedule": args.schedule if args.strategy == "pp" else None,
        "bucket_cap_mb": getattr(strategy.cfg, "bucket_cap_mb", args.bucket_cap_mb),
        "bucket_tuned": bool(getattr(strategy, "tuned", False)), "data": args.data or "synthetic",
        "diloco": ({"sync_every": args.sync_every, "fragments": args.fragments,
                    "overlap_steps": args.overlap_steps, "outer_lr": args.outer_lr,
                    "outer_momentum": args.outer_momentum}
                   if args.strategy == "diloco" else None),
        "window_s": window,
        "samples_per_s": samples_per_s,
        f"{unit}_per_s": samples_per_s * per_sample,
        "units_per_s": samples_per_s * per_sample,
        "step_time_mean_s": statistics.fmean(timed_steps),
        "step_time_std_s": statistics.pstdev(timed_steps) if len(timed_steps) > 1 else 0.0,
        "step_time_s": step_max,
        "flops_per_step": flops,
        "final_loss": next((v for v in reversed(losses) if v is not None), None),
        "losses": losses,
        "peak_rss_mb_max": max(g["peak_rss_mb"] for g in gathered),
        "peak_rss_mb_sum": sum(g["peak_rss_mb"] for g in gathered),
        "cuda_peak_mb_max": max((g["cuda_peak_mb"] or 0.0) for g in gathered) or None,
        "nanoccl_bytes": nanoccl_doc,
        "link_bytes": link_doc,
        "torch": torch.__version__,
    }


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's finalization: main destroyed the process groups, but a
    # Gloo worker thread can still hold a reference to a Python object then and drop it after
    # Python is gone, which aborts the rank ("terminate called without an active exception":
    # a CI run's rank exited -6 this way after refusing hsdp's layout with exit code 3).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
