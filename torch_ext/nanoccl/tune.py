"""nanoccl-tune: measure this cluster's links and save the link profile (README "Tuning").

Run it like a training job, one process per GPU (or per rank) on every node:

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
        -m nanoccl.tune

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
from typing import Any, Sequence


# DDP bucket sizes the tuner chooses from (MB, as DDP's bucket_cap_mb counts: 2^20 bytes).
BUCKET_CANDIDATES_MB = (1, 2, 5, 10, 25, 50, 100, 200)


def ddp_bucket_cap_mb(model: Any, group: Any = None, backward_seconds: float = 0.0,
                      candidates: Sequence[float] = BUCKET_CANDIDATES_MB) -> float:
    """The `bucket_cap_mb` for DDP(model, ...) that the cost model predicts fastest.

    DDP allreduces the gradients in buckets of about that size, each as soon as backward has
    produced it, one after another. With the group's link profile (README "Tuning"; the
    group needs NANOCCL_TUNING=cached or measure, or compression=auto) the planner predicts
    each bucket's allreduce, codec included; the step's communication then ends at
        max(backward + the last bucket's time, the first bucket's ready time + all buckets' times)
    where buckets become ready evenly over `backward_seconds` (0: communication-bound, the
    sum of the buckets' times decides). Small buckets pay the per-call cost more often; large
    ones leave more communication after backward. Returns the best of `candidates` (MB);
    every rank gets the same answer from the same model and profile. Raises RuntimeError
    when the group has no link profile.
    """
    import nanoccl

    pg = nanoccl.get_backend(group)
    if pg.link_profile() is None:
        raise RuntimeError("ddp_bucket_cap_mb needs a link profile: create the group with "
                           "NANOCCL_TUNING=cached (or Options(tuning='cached'))")
    grads = [p for p in model.parameters() if p.requires_grad]
    if not grads:
        raise ValueError("ddp_bucket_cap_mb: the model has no parameters that require grad")
    dtype = grads[0].dtype
    elem = grads[0].element_size()
    total = sum(p.numel() for p in grads) * elem
    if total == 0:
        raise ValueError("ddp_bucket_cap_mb: the model's gradients are empty")
    cache: dict[int, float] = {}

    def predict(nbytes: int) -> float:
        count = max(1, nbytes // elem)
        if count not in cache:
            cache[count] = pg.predict_allreduce(count, dtype)[2]
        return cache[count]

    def finish(cap_mb: float) -> float:
        cap = max(elem, int(cap_mb * (1 << 20)))
        full, rest = divmod(total, cap)
        sizes = [cap] * full + ([rest] if rest else [])
        times = [predict(b) for b in sizes]
        first_ready = backward_seconds * sizes[0] / total
        return max(backward_seconds + times[-1], first_ready + sum(times))

    usable = [c for c in candidates if c > 0]
    if not usable:
        raise ValueError("ddp_bucket_cap_mb: no candidate bucket size > 0")
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
    lines.append(f"float32 reduce (one core): {p['reduce_MBps']:.0f} MB/s; each rank counts on "
                 f"{p['cpu_share']:.2f} of a core")
    lines.append(f"{'codec':<11} {'encode':>10} {'decode':>12} {'decode+add':>12}   "
                 "(MB/s of float32 input)")
    for name, c in p["codecs"].items():
        lines.append(f"{name:<11} {c['encode_MBps']:>10.0f} {c['decode_MBps']:>12.0f} "
                     f"{c['accumulate_MBps']:>12.0f}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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
              "e.g. torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d "
              "--rdzv-endpoint HOST:29500 "
              "-m nanoccl.tune (one command per node)", file=sys.stderr)
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
