#!/usr/bin/env python3
"""A short DDP training with two backends in one launch (run under torchrun).

The same MLP (same seed, same initial weights, same synthetic batches) is
trained side by side: once through DDP on the backend under test (the
default group; "nanoccl" when it imports, else gloo), once on the reference
backend (a group made with new_group(backend=--ab)) and, with --hook-codec,
once more the way nanoccl is meant for slow links: a nanoccl group that
compresses across nodes, DDP's buckets averaged through nanoccl.hooks'
error-feedback hook, and the bucket size the tuner chooses
(nanoccl.tune.ddp_bucket_cap_mb, from the group's link profile measured at its
creation). Steps alternate A, B, C, A, B, C ... so that machine drift hits all
alike. Reports mean / median step time, samples/s, the final loss and how far
the first two models' parameters ended apart (lossless backends: reordering
error only).

    torchrun --nproc-per-node 2 bench/ab_ddp.py --ab gloo --steps 40 --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

REPO = Path(__file__).resolve().parents[1]
# Behind an installed nanoccl, the source tree's package as a fallback.
sys.path.append(str(REPO / "torch_ext"))


def nanoccl_status() -> tuple[bool, str]:
    """(usable, where-or-why) for the nanoccl backend; same rule as nanoccl-perf."""
    try:
        import nanoccl  # noqa: F401  registers the "nanoccl" backend
    except Exception as exc:  # a missing or broken extension means "not available"
        return False, f"import nanoccl failed: {type(exc).__name__}: {exc}"
    if "nanoccl" not in dist.Backend.backend_list:
        return False, "nanoccl imported but did not register a 'nanoccl' backend (not built?)"
    return True, str(getattr(sys.modules["nanoccl"], "__file__", "nanoccl"))


def make_model(width: int, depth: int, in_dim: int, out_dim: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(in_dim, width), nn.GELU()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), nn.GELU()]
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


class SyntheticData:
    """Deterministic regression data: y = tanh(x @ W), x ~ N(0, 1) per (seed, rank, step)."""

    def __init__(self, in_dim: int, out_dim: int, batch: int, seed: int, rank: int) -> None:
        gen = torch.Generator().manual_seed(seed + 1_000_003)
        self.teacher = torch.randn(in_dim, out_dim, generator=gen) / in_dim ** 0.5
        self.in_dim, self.batch, self.seed, self.rank = in_dim, batch, seed, rank

    def batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 7919 + self.rank * 104_729 + step)
        x = torch.randn(self.batch, self.in_dim, generator=gen)
        return x, torch.tanh(x @ self.teacher)


@dataclass
class SideResult:
    label: str
    backend: str
    bucket_cap_mb: float | None  # None: DDP's default
    tuned: bool  # the bucket size is nanoccl.tune's choice (the --hook-codec side)
    step_ms: list[float]  # per step, mean over ranks
    losses: list[float]  # per step, mean over ranks
    mean_step_ms: float = 0.0
    median_step_ms: float = 0.0
    samples_per_s: float = 0.0
    final_loss: float = 0.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default=None, help="backend under test (default nanoccl if it "
                                                   "imports, else gloo)")
    p.add_argument("--ab", default="gloo", help="reference backend ('' for none; default gloo)")
    p.add_argument("--hook-codec", default=None, metavar="CODEC",
                   help="add a side: nanoccl compressing across nodes with CODEC, DDP through "
                        "the error-feedback hook, bucket size tuned")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup-steps", type=int, default=3, help="steps left out of the timing")
    p.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    p.add_argument("--width", type=int, default=1536)
    p.add_argument("--depth", type=int, default=4, help="linear layers")
    p.add_argument("--in-dim", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=float, default=300.0, help="process group timeout, s")
    p.add_argument("--json", default=None, help="write results here (rank 0)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.steps <= args.warmup_steps:
        raise SystemExit("--steps must exceed --warmup-steps")
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    usable, where = nanoccl_status()
    backend = args.backend or ("nanoccl" if usable else "gloo")
    if ("nanoccl" in (backend, args.ab) or args.hook_codec) and not usable:
        print(f"ab_ddp: nanoccl requested but {where}", file=sys.stderr)
        return 2
    timeout = datetime.timedelta(seconds=args.timeout)
    if "MASTER_ADDR" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
    dist.init_process_group(backend=backend, timeout=timeout)
    try:
        return _train(args, backend, usable, where, rank, world, local_world, timeout)
    finally:
        dist.destroy_process_group()


def _train(args: argparse.Namespace, backend: str, usable: bool, where: str, rank: int,
           world: int, local_world: int, timeout: datetime.timedelta) -> int:
    torch.set_num_threads(1)
    ctrl = dist.new_group(backend="gloo", timeout=timeout)
    sides: list[tuple[str, str, Any]] = [(backend, backend, dist.group.WORLD)]
    if args.ab:
        label = args.ab if args.ab != backend else f"{args.ab}(ref)"
        sides.append((label, args.ab, dist.new_group(backend=args.ab, timeout=timeout)))
    out_dim = args.in_dim
    data = SyntheticData(args.in_dim, out_dim, args.batch, args.seed, rank)
    loss_fn = nn.MSELoss()
    caps: list[float | None] = [None] * len(sides)  # None: DDP's default (25 MB)
    hooked = None
    if args.hook_codec:
        import nanoccl
        from nanoccl import hooks
        from nanoccl.tune import ddp_bucket_cap_mb, measure_backward_seconds

        # Measured now, into a file of this run's (a saved profile may be of other links, and
        # the user's is left alone) unless NANOCCL_TUNING_FILE names one.
        profile_file = os.environ.get("NANOCCL_TUNING_FILE") or os.path.join(
            tempfile.mkdtemp(prefix="ab_ddp_"), "link_profile.txt")
        group = dist.new_group(backend="nanoccl", timeout=timeout, pg_options=nanoccl.Options(
            compression=args.hook_codec, tuning="measure", tuning_file=profile_file))
        probe = make_model(args.width, args.depth, args.in_dim, out_dim, args.seed)
        x0, y0 = data.batch_at(0)
        cap = ddp_bucket_cap_mb(probe, group, measure_backward_seconds(
            probe, lambda: loss_fn(probe(x0), y0)), codec=args.hook_codec)
        hooked = len(sides)
        sides.append((f"nanoccl+{args.hook_codec}+EF,{cap:g}MB", "nanoccl", group))
        caps.append(cap)
    models, optims = [], []
    for k, (_, _, group) in enumerate(sides):
        kwargs = {} if caps[k] is None else {"bucket_cap_mb": caps[k]}
        model = DistributedDataParallel(
            make_model(args.width, args.depth, args.in_dim, out_dim, args.seed),
            process_group=group, **kwargs)
        if k == hooked:
            model.register_comm_hook(hooks.ErrorFeedbackState(codec=args.hook_codec),
                                     hooks.error_feedback_hook)
        models.append(model)
        optims.append(torch.optim.Adam(model.parameters(), lr=args.lr))
    params = sum(p.numel() for p in models[0].parameters())
    if rank == 0:
        print(f"ab_ddp: {world} rank(s), MLP {args.depth}x{args.width} "
              f"({params / 1e6:.2f} M params, "
              f"{params * 4 / 2**20:.1f} MiB of gradients per step), batch {args.batch}/rank, "
              f"{args.steps} steps, backends {' vs '.join(s[0] for s in sides)}", flush=True)
    times = [[0.0] * args.steps for _ in sides]
    losses = [[0.0] * args.steps for _ in sides]
    dist.barrier(group=ctrl)
    for step in range(args.steps):
        x, y = data.batch_at(step)
        for k, (model, optim) in enumerate(zip(models, optims)):
            start = time.perf_counter()
            optim.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()  # DDP's allreduce of the gradients completes in here
            optim.step()
            times[k][step] = (time.perf_counter() - start) * 1000.0
            losses[k][step] = float(loss.detach())
        if rank == 0 and (step + 1) % 10 == 0:
            print(f"ab_ddp: step {step + 1}/{args.steps} " + "  ".join(
                f"{sides[k][0]} loss {losses[k][step]:.5f} {times[k][step]:.0f} ms"
                for k in range(len(sides))), flush=True)

    # Parameters of the two runs: identical inputs, so only the reduction order may differ.
    max_diff = 0.0
    if args.ab:  # the reference side is models[1]; a lossy --hook-codec side is not compared
        for pa, pb in zip(models[0].parameters(), models[1].parameters()):
            max_diff = max(max_diff, float((pa.detach() - pb.detach()).abs().max()))
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (times, losses, max_diff), group=ctrl)
    if rank == 0:
        results = []
        for k, (label, name, _) in enumerate(sides):
            step_ms = [statistics.fmean(g[0][k][s] for g in gathered) for s in range(args.steps)]
            loss = [statistics.fmean(g[1][k][s] for g in gathered) for s in range(args.steps)]
            timed = step_ms[args.warmup_steps:]
            res = SideResult(label, name, caps[k], k == hooked, step_ms, loss)
            res.mean_step_ms = statistics.fmean(timed)
            res.median_step_ms = statistics.median(timed)
            res.samples_per_s = args.batch * world / (res.mean_step_ms / 1000.0)
            res.final_loss = loss[-1]
            results.append(res)
        diff = max(g[2] for g in gathered)
        for res in results:
            print(f"ab_ddp: {res.label:>10}: mean step {res.mean_step_ms:8.1f} ms, median "
                  f"{res.median_step_ms:8.1f} ms, {res.samples_per_s:8.1f} samples/s, "
                  f"final loss {res.final_loss:.6f}")
        if len(results) > 1:
            print(f"ab_ddp: speedup ({results[1].label} step time / {results[0].label} step time) "
                  f"{results[1].mean_step_ms / results[0].mean_step_ms:.3f}; "
                  "max |param A - param B| "
                  f"{diff:.3g}")
            for res in results[2:]:
                print(f"ab_ddp: speedup ({results[1].label} step time / {res.label} step time) "
                      f"{results[1].mean_step_ms / res.mean_step_ms:.3f}")
        if args.json:
            doc = {"tool": "ab_ddp", "meta": {
                       "world_size": world, "local_world_size": local_world, "params": params,
                       "grad_bytes": params * 4, "steps": args.steps,
                       "warmup_steps": args.warmup_steps, "batch_per_rank": args.batch,
                       "width": args.width, "depth": args.depth, "in_dim": args.in_dim,
                       "nanoccl_available": usable, "nanoccl": where, "torch": torch.__version__},
                   "sides": [asdict(r) for r in results], "max_param_diff": diff}
            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc, indent=1))
    dist.barrier(group=ctrl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
