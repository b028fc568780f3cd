"""nanoccl-tune: measure this cluster's links and save the link profile (docs/tuning.md).

Run it like a training job, one process per GPU (or per rank) on every node:

    torchrun --nnodes 2 --nproc-per-node 2 --node-rank NODE_RANK --master-addr NODE0 \
        --master-port 29500 -m nanoccl.tune        (NODE_RANK: 0 on the first node, 1, ...)

Rank 0 prints the profile (latency and bandwidth per link class, reduce and codec rates) and
saves it where NANOCCL_TUNING=cached finds it (NANOCCL_TUNING_FILE, else
~/.cache/nanoccl/link_profile.txt). `nanoccl-tune --show` prints a saved profile without
measuring anything.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from typing import Any, Callable, Sequence

from nanoccl.cli import OneLineParser


# DDP bucket sizes the tuner chooses from (MB, as DDP's bucket_cap_mb counts: 2^20 bytes).
BUCKET_CANDIDATES_MB = (1, 2, 5, 10, 25, 50, 100, 200)


def ddp_bucket_sizes(grads: Sequence[tuple[int, Any]], cap_bytes: int,
                     first_bytes: int | None = None) -> list[tuple[int, Any, int]]:
    """The buckets DDP builds from `grads` ((bytes, dtype) per parameter, in the model's order)
    with a bucket cap of `cap_bytes`, in the order they become ready: (bytes, dtype,
    ready_bytes), where ready_bytes is how many gradient bytes backward has produced when the
    bucket is complete.

    DDP's rule (the reducer's compute_bucket_assignment_by_size, used when it rebuilds its
    buckets after the first step): parameters in reverse order (the order backward produces
    them), one open bucket per dtype; a bucket closes as soon as it holds at least its limit,
    `first_bytes` for a dtype's first bucket and `cap_bytes` after it. `first_bytes` (default:
    `cap_bytes`) is DDP's first-bucket cap: torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
    (1 MiB) only when bucket_cap_mb is left at its default, else the cap itself.
    """
    first = cap_bytes if first_bytes is None else first_bytes
    open_: dict[Any, int] = {}
    closed: set[Any] = set()  # dtypes whose first bucket has closed
    out: list[tuple[int, Any, int]] = []
    produced = 0
    for nbytes, dtype in reversed(grads):
        produced += nbytes
        open_[dtype] = open_.get(dtype, 0) + nbytes
        limit = cap_bytes if dtype in closed else first
        if open_[dtype] >= limit:
            out.append((open_.pop(dtype), dtype, produced))
            closed.add(dtype)
    out.extend((n, d, produced) for d, n in open_.items() if n > 0)
    return out


def ddp_step_seconds(bucket_seconds: Sequence[float], ready_bytes: Sequence[int],
                     total_bytes: int, backward_seconds: float) -> float:
    """When the last bucket's allreduce ends, counted from the start of backward: bucket i is
    ready once backward has produced ready_bytes[i] of the total_bytes of gradients (at an
    even pace over backward_seconds), and the allreduces run one after another in bucket
    order."""
    end = 0.0
    for seconds, ready in zip(bucket_seconds, ready_bytes):
        at = backward_seconds * ready / total_bytes if total_bytes else 0.0
        end = max(end, at) + seconds
    return end


def measure_backward_seconds(model: Any, loss_of: Callable[[], Any], repeats: int = 3) -> float:
    """The median time of `repeats` backward passes of `loss_of()` (a closure that runs the
    model's forward on a typical batch and returns the loss), after one warm-up pass: the
    `backward_seconds` of ddp_bucket_cap_mb. Run it on the bare model, before DDP wraps it
    (no communication in the time). Leaves the model as it found it: gradients None, its
    buffers (BatchNorm's running statistics) and the random number generators restored."""
    import statistics
    import time

    import torch

    if repeats < 1:
        raise ValueError(f"measure_backward_seconds: repeats must be >= 1, got {repeats}")
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.is_cuda})
    cuda = bool(devices)
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    times = []
    with torch.random.fork_rng(devices=devices):
        for i in range(repeats + 1):
            model.zero_grad(set_to_none=True)
            loss = loss_of()
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            loss.backward()
            if cuda:
                torch.cuda.synchronize()
            if i:
                times.append(time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for live, saved in buffers:
            live.copy_(saved)
    return statistics.median(times)


def ddp_bucket_cap_mb(model: Any, group: Any = None, backward_seconds: float = 0.0,
                      candidates: Sequence[float] = BUCKET_CANDIDATES_MB,
                      codec: str | None = None) -> float:
    """The `bucket_cap_mb` for DDP(model, ...) that the cost model predicts fastest.

    A collective: call it on every rank of `group` (it takes the largest `backward_seconds`
    of the ranks, so that all of them choose the same size; DDP needs the same buckets on
    every rank).

    DDP allreduces the gradients in buckets (``ddp_bucket_sizes``: DDP's own rule), each as
    soon as backward has produced it, one after another. With the group's link profile
    (docs/tuning.md; the group needs NANOCCL_TUNING=cached or measure, or compression=auto)
    the planner predicts each bucket's allreduce: as the group would run it, or, with `codec`
    (the error-feedback hook's), compressed with that codec. Buckets become ready as backward
    produces their gradients, at an even pace over `backward_seconds` (one backward pass
    without communication, ``measure_backward_seconds``; 0: communication-bound, the sum of
    the buckets' times decides), and the step's communication ends when the last bucket's
    allreduce does (``ddp_step_seconds``). Small buckets pay the per-call cost more often;
    large ones leave more communication after backward. Returns the best of `candidates` (MB;
    ties go to the smaller). Raises RuntimeError when the group has no link profile (a
    one-rank group has none: nothing to tune).
    """
    import torch
    import torch.distributed as dist

    import nanoccl

    pg = nanoccl.get_backend(group)
    if pg.link_profile() is None:
        raise RuntimeError("ddp_bucket_cap_mb needs a link profile: create the group with "
                           "NANOCCL_TUNING=cached (or Options(tuning='cached')); a one-rank "
                           "group has none (nothing to tune)")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("ddp_bucket_cap_mb: the model has no parameters that require grad")
    grads = [(p.numel() * p.element_size(), p.dtype) for p in params]
    total = sum(n for n, _ in grads)
    if total == 0:
        raise ValueError("ddp_bucket_cap_mb: the model's gradients are empty")
    usable = [c for c in candidates if c > 0]
    if not usable:
        raise ValueError("ddp_bucket_cap_mb: no candidate bucket size > 0")
    # Agree first, check after: a rank that raised before the allreduce would leave the
    # others waiting for it until the group's timeout.
    bad = not (isinstance(backward_seconds, (int, float)) and backward_seconds >= 0.0)
    agreed = torch.tensor([0.0 if bad else float(backward_seconds), float(bad)],
                          dtype=torch.float64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
    if agreed[1].item() > 0:
        raise ValueError("ddp_bucket_cap_mb: backward_seconds must be a number >= 0 on every "
                         f"rank (this rank passed {backward_seconds!r})")
    backward = float(agreed[0].item())

    cache: dict[tuple[int, Any], float] = {}

    def predict(nbytes: int, dtype: Any) -> float:
        count = max(1, nbytes // torch.empty((), dtype=dtype).element_size())
        if (count, dtype) not in cache:
            cache[(count, dtype)] = pg.predict_allreduce(count, dtype, codec or "")[2]
        return cache[(count, dtype)]

    def finish(cap_mb: float) -> float:
        buckets = ddp_bucket_sizes(grads, max(1, int(cap_mb * (1 << 20))))
        return ddp_step_seconds([predict(n, d) for n, d, _ in buckets],
                                [r for _, _, r in buckets], total, backward)

    return min(usable, key=lambda c: (finish(c), c))


def format_profile(p: dict[str, Any]) -> str:
    """The profile as the table nanoccl-tune prints."""
    lines = [f"# link profile: {p['shape']} (nodes x ranks per node) over {p['transport']} "
             f"with {p['nsocks']} socket(s) per peer, measured {p['measured']}",
             f"{'link':<11} {'latency':>10} {'one pair':>12} {'a node':>12}"]
    for name, key in (("inter-node", "inter"), ("intra-node", "intra")):
        c = p[key]
        if c is None:
            lines.append(f"{name:<11} {'(none in this shape)':>36}")
        else:
            lines.append(f"{name:<11} {c['alpha_us']:>7.1f} us {c['pair_MBps']:>7.0f} MB/s "
                         f"{c['node_MBps']:>7.0f} MB/s")
            if c.get("one_socket_MBps"):
                lines.append(f"{'':<11} {'one socket a peer:':>23} {c['one_socket_MBps']:>7.0f} MB/s"
                             "  (used unless all sockets are 10% faster)")
    lines.append(f"float32 reduce (one core): {p['reduce_MBps']:.0f} MB/s; each rank counts on "
                 f"{p['cpu_share']:.2f} of a core")
    lines.append(f"{'codec':<11} {'encode':>10} {'decode':>12} {'decode+add':>12}   "
                 "(MB/s of float32 input)")
    for name, c in p["codecs"].items():
        lines.append(f"{name:<11} {c['encode_MBps']:>10.0f} {c['decode_MBps']:>12.0f} "
                     f"{c['accumulate_MBps']:>12.0f}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="nanoccl-tune",
        description="Measure the links between the ranks of a job (run under torchrun on every "
                    "node) and save the link profile that NANOCCL_TUNING=cached uses.")
    p.add_argument("--file", default=None,
                   help="where to save (or, with --show, read) the profile; default: "
                        "NANOCCL_TUNING_FILE, else ~/.cache/nanoccl/link_profile.txt")
    p.add_argument("--show", action="store_true",
                   help="print the saved profile and exit (no job, nothing measured)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for every rank to join (default 120)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import nanoccl
    from nanoccl import _C

    settings = {"tuning_file": args.file} if args.file else {}
    try:
        path = _C.link_profile_path(settings)
    except ValueError as exc:
        print(f"nanoccl-tune: {exc}", file=sys.stderr)
        return 2
    if args.show:
        try:
            profile = _C.load_link_profile(path)
        except ValueError as exc:
            print(f"nanoccl-tune: {exc}", file=sys.stderr)
            return 1
        if profile is None:
            print(f"nanoccl-tune: no link profile at {path} (run nanoccl-tune under torchrun "
                  "on every node first)", file=sys.stderr)
            return 1
        print(format_profile(profile))
        print(f"# from {path}")
        return 0

    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        print("nanoccl-tune: measures the links between ranks: run it with at least 2 ranks, "
              "e.g. torchrun --nnodes 2 --nproc-per-node 2 --node-rank NODE_RANK "
              "--master-addr NODE0 --master-port 29500 -m nanoccl.tune on every node "
              "(README: Quickstart)", file=sys.stderr)
        return 2

    import torch.distributed as dist

    options = nanoccl.Options(tuning="measure", **settings)
    dist.init_process_group("nanoccl", pg_options=options,
                            timeout=datetime.timedelta(seconds=args.timeout))
    try:
        profile = nanoccl.link_profile()
        if dist.get_rank() == 0:
            if profile is None:
                print("nanoccl-tune: the group has no link profile", file=sys.stderr)
                return 1
            print(format_profile(profile))
            try:
                saved = _C.load_link_profile(path)
            except ValueError:
                saved = None
            if saved is not None and saved["text"] == profile["text"]:
                print(f"# saved to {path} by rank 0 (NANOCCL_TUNING=cached uses it)")
            else:
                print(f"nanoccl-tune: could not save the profile to {path} (see rank 0's "
                      "warning; --file picks another place)", file=sys.stderr)
                return 1
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
