#!/usr/bin/env python3
"""The tuner against a grid of static settings, in one launch (issue 12's check).

Every rank creates one nanoccl process group per static setting (algorithm x codec x chunk
size x sockets per peer, only the combinations that change what runs), one with the tuner
(`compression=auto`, the link profile measured when it is created, into a temporary file), and
a Gloo group;
then, size by size, it times one float32 allreduce per group in turn, `-n` times or more
(--budget). Rank 0 prints, per size, every setting's median time (of the slowest rank's), the
best static one, the tuner's time and choice (nanoccl.stats()["modelled"]: what it ran and what
it predicted), and Gloo's.

The best of many noisy medians is biased low (on 2 cores the same plan's medians spread by
5-20% between settings that run it identically), so a second round (--finalists, --final-iters)
times the best few static settings and the tuner again, interleaved, with more calls each: the
tuner is compared with the best finalist of that round, all measured with the same precision.
That finalist's median is again the lowest of several, so a third round times it and the
tuner alone on fresh calls, in pairs (one call each, one right after the other, each first
in every other pair), and the paired ratio is the figure (paired_ratio; the selection and the
comparison on separate samples, a slow spell of the machine on both calls of a pair;
--no-confirm leaves it out). Fresh calls are not enough where the machine, not the link, sets
the pace: there a group keeps its own speed for the whole run (at 10 Gbit/s on 2 cores, two
groups running the same plan differed by 9%), so the best of 28 groups is also the luckiest
group. The third round therefore runs on --fresh new pairs of groups, one with the finalist's
setting and one with the tuner's (on the profile the tuner measured), and the figure is the
geometric mean of their paired ratios (--fresh 0: the round-two groups themselves). Each timed
call follows a barrier of its group (--mode barrier), so that no rank's refill or late finish
runs into the others' timers.

    python bench/emucluster.py --nodes 2 --procs-per-node 2 --rate 1gbit -- \\
        bench/tune_grid.py -b 1M -e 256M -f 4 -n 3 --json results/tuning/grid_2x2_1gbit.json

Run it under torchrun or the emulated cluster (bench/emucluster.py); a group per setting
means a few hundred MB of scratch memory per rank at 256 MB.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.distributed as dist

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


@dataclass
class Setting:
    label: str
    backend: str
    options: dict[str, Any] = field(default_factory=dict)
    group: Any = None
    times: dict[int, list[float]] = field(default_factory=dict)


def static_grid(nodes: int, per_node: int, allow: list[str], chunks: list[int],
                socks: list[int]) -> list[Setting]:
    """The static settings whose combination changes what an allreduce runs."""
    hierarchical = nodes > 1 and per_node > 1
    out = []
    for nsocks in socks:
        for algo in ("ring", "recursive_doubling", "tree", "hierarchical", "compressed"):
            if algo == "hierarchical" and not hierarchical:
                continue
            if algo == "compressed" and (hierarchical or nodes < 2):
                continue
            lossy = algo in ("hierarchical", "compressed")
            for codec in allow if lossy else ["none"]:
                if algo == "compressed" and codec == "none":
                    continue
                chunked = algo in ("ring", "hierarchical")
                for chunk in chunks if chunked else [chunks[len(chunks) // 2]]:
                    opts: dict[str, Any] = {"algo": algo, "compression": codec,
                                            "compression_min_bytes": 0, "chunk_bytes": chunk,
                                            "nsocks": nsocks}
                    label = f"{algo}/{codec}/c{chunk >> 10}K/s{nsocks}"
                    out.append(Setting(label, "nanoccl", opts))
    return out


MODES = ("barrier", "back-to-back")


def make_group(s: Setting, timeout: datetime.timedelta) -> Any:
    """A new process group of every rank with `s`'s backend and options."""
    opts = None
    if s.backend == "nanoccl":
        import nanoccl
        opts = nanoccl.Options(**s.options)
    return dist.new_group(backend=s.backend, pg_options=opts, timeout=timeout)


def fresh_twins(best: Setting, tuned: Setting, timeout: datetime.timedelta) -> list[Setting]:
    """New groups with `best`'s setting and `tuned`'s, the tuner's on the link profile it
    measured at its creation (read back from its file: the same choices, a fresh group)."""
    auto = dict(tuned.options)
    if auto.get("tuning") == "measure":
        auto["tuning"] = "cached"
    pair = [Setting(best.label, best.backend, dict(best.options)),
            Setting(tuned.label, tuned.backend, auto)]
    for s in pair:
        s.group = make_group(s, timeout)
    return pair


def time_groups(groups: list[Setting], buf: torch.Tensor, size: int, iters: int, world: int,
                seed: int, mode: str = "barrier", paired: bool = False) -> list[Any]:
    """Times `iters` allreduces of `buf` per group, the groups in a new shuffled order each
    round (the same on every rank: each group's calls must meet; no group always runs right
    after the same other one). Returns per group the median over the calls of the slowest
    rank's time (a collective ends there; a median, because a 2-core machine's scheduling
    hiccups would sway a mean of few calls). Appends the calls' times to each group's
    `times[size]`. `paired`: per group, the slowest rank's time of every call instead, round by
    round (for paired_ratio).

    mode "barrier": each call after a barrier of its group, outside the timer, so that no rank
    is still refilling its buffer (a 256 MB fill is tens of ms here) or finishing the previous
    group's call while the others' timers run; with more ranks than cores that skew otherwise
    lands in whichever group runs next. "back-to-back": the calls follow each other."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    local: list[list[float]] = [[] for _ in groups]
    for it in range(iters):
        order = list(range(len(groups)))
        random.Random(seed + it).shuffle(order)
        if paired and len(groups) == 2:
            order = [0, 1] if it % 2 == 0 else [1, 0]  # each order in every other round
        for k in order:
            buf.fill_(1.0)
            if mode == "barrier":
                dist.barrier(group=groups[k].group)
            start = time.perf_counter()
            dist.all_reduce(buf, group=groups[k].group)
            local[k].append(time.perf_counter() - start)
    for g, t in zip(groups, local):
        g.times.setdefault(size, []).extend(t)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, local)
    slowest = [[max(g[i][k] for g in gathered) for k in range(iters)] for i in range(len(groups))]
    if paired:
        return slowest
    return [statistics.median(calls) for calls in slowest]


def paired_ratio(first: list[float], second: list[float]) -> float:
    """first / second from calls timed in pairs, one right after the other, `first` first in
    the even rounds and second in the odd ones (time_groups with two groups, paired): a slow
    spell of the machine (other VMs, 2 cores shared by 4 ranks) lands on both calls of a pair
    alike. The median of the ratios per order, and the geometric mean of the two: where the
    second call of a pair runs faster or slower than the first, the two orders' ratios differ
    by that, and the mean cancels it (one median of all the ratios would fall on whichever
    order happened to win: 0.938 against medians 0.993 in one 1 MB run)."""
    even = [a / b for a, b in zip(first[0::2], second[0::2])]
    odd = [a / b for a, b in zip(first[1::2], second[1::2])]
    if not odd:
        return statistics.median(even)
    return math.sqrt(statistics.median(even) * statistics.median(odd))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tune_grid", description=__doc__.split("\n\n")[0])
    p.add_argument("-b", "--minbytes", default="1M")
    p.add_argument("-e", "--maxbytes", default="256M")
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-n", "--iters", type=int, default=3)
    p.add_argument("-w", "--warmup", type=int, default=1)
    p.add_argument("--budget", default="64M",
                   help="more calls for small sizes: up to 50, as many as make this many bytes")
    p.add_argument("--chunks", default="256K,1M,4M", help="chunk sizes of the grid")
    p.add_argument("--socks", default="1,2", help="sockets per peer of the grid")
    p.add_argument("--allow", default=os.environ.get("NANOCCL_COMPRESSION_ALLOW",
                                                     "none,bf16,int8"),
                   help="codecs of the grid and of the tuner (NANOCCL_COMPRESSION_ALLOW)")
    p.add_argument("--finalists", type=int, default=4,
                   help="static settings timed again with the tuner per size (0: no second "
                        "round)")
    p.add_argument("--final-iters", type=int, default=10,
                   help="calls per group in the second round (or more, --budget)")
    p.add_argument("--no-confirm", dest="confirm", action="store_false",
                   help="no third round (the best finalist and the tuner timed again on fresh "
                        "calls: the finalist's second-round median is the lowest of several, "
                        "biased low)")
    p.add_argument("--fresh", type=int, default=3,
                   help="pairs of new groups (the best finalist's setting, the tuner's) the "
                        "third round compares, each pair's calls paired (0: the second "
                        "round's groups)")
    p.add_argument("--mode", default="barrier", choices=MODES,
                   help="barrier: each timed call after a barrier of its group (default); "
                        "back-to-back: calls follow each other (how the 2026-11-24 tables were "
                        "measured)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import nanoccl
    from nanoccl.perf import modelled_since

    sizes = []
    size = parse_size(args.minbytes)
    while size <= parse_size(args.maxbytes):
        sizes.append(size)
        size *= args.stepfactor
    timeout = datetime.timedelta(seconds=600)
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = max(1, world // per_node)
    allow = [c.strip() for c in args.allow.split(",") if c.strip()]
    chunks = [parse_size(c) for c in args.chunks.split(",")]
    socks = [int(s) for s in args.socks.split(",")]

    settings = static_grid(nodes, per_node, allow, chunks, socks)
    # Measured now (a saved profile may be of another link: the emulator's rate changes), into
    # a file of this run's own, so that the user's saved profile is left alone.
    scratch = tempfile.mkdtemp(prefix="tune_grid_")
    tuned = Setting("auto", "nanoccl", {"compression": "auto", "compression_allow": ",".join(allow),
                                        "compression_min_bytes": 0, "tuning": "measure",
                                        "tuning_file": os.path.join(scratch, f"profile{rank}.txt")})
    gloo = Setting("gloo", "gloo")
    everyone = settings + [tuned, gloo]
    for s in everyone:
        s.group = make_group(s, timeout)
    profile = nanoccl.link_profile(tuned.group)
    if rank == 0:
        print(f"# tune_grid: {world} ranks ({nodes} nodes x {per_node}), {len(settings)} static "
              f"settings, allow {','.join(allow)}, mode {args.mode}, torch {torch.__version__}",
              flush=True)
        if profile is not None:
            print("# link profile: " + " | ".join(
                ln for ln in profile["text"].splitlines() if not ln.startswith("#")), flush=True)

    doc: dict[str, Any] = {"meta": {"world": world, "nodes": nodes, "per_node": per_node,
                                    "allow": allow, "chunks": chunks, "socks": socks,
                                    "mode": args.mode, "confirm": args.confirm,
                                    "profile": profile["text"] if profile else None},
                           "sizes": []}
    worst = float("inf")
    for size in sizes:
        count = size // 4
        buf = torch.ones(count, dtype=torch.float32)
        for s in everyone:  # warm-up (and the first call's connection set-up)
            for _ in range(args.warmup):
                dist.all_reduce(buf, group=s.group)
        before = dict(nanoccl.stats(tuned.group)["modelled"])
        iters = max(args.iters, min(50, parse_size(args.budget) // size))
        median = time_groups(everyone, buf, size, iters, world, seed=size * 1000,
                             mode=args.mode)
        # The allreduces only (barrier mode adds the group's barriers to its counts).
        chose = [c for c in modelled_since(before, nanoccl.stats(tuned.group)["modelled"])
                 if c["what"].startswith("allreduce")]
        static = median[:len(settings)]
        best = min(range(len(settings)), key=lambda i: static[i])
        t_auto, t_gloo = median[len(settings)], median[len(settings) + 1]
        entry: dict[str, Any] = {
            "bytes": size, "auto_s": t_auto, "gloo_s": t_gloo, "best": settings[best].label,
            "best_s": static[best], "auto_vs_best": static[best] / t_auto, "auto_ran": chose,
            "static": {s.label: t for s, t in zip(settings, static)}}
        if rank == 0:
            print(f"\n# {size} B: best static {settings[best].label} {static[best] * 1e3:.2f} ms; "
                  f"auto {t_auto * 1e3:.2f} ms = {static[best] / t_auto:.3f} of the best's speed; "
                  f"gloo {t_gloo * 1e3:.2f} ms (auto {t_gloo / t_auto:.2f}x gloo)", flush=True)
            for c in chose:
                print(f"#   auto ran {c['what']} x{c['calls']}: predicted "
                      f"{c['predicted_s'] * 1e3:.2f} ms, measured {c['measured_s'] * 1e3:.2f} ms",
                      flush=True)
            for st, t in sorted(zip(settings, static), key=lambda x: x[1])[:8]:
                print(f"#   {st.label:<40} {t * 1e3:10.2f} ms", flush=True)
        ratio = entry["auto_vs_best"]
        if args.finalists > 0:
            ranked = sorted(range(len(settings)), key=lambda i: static[i])[:args.finalists]
            final = [settings[i] for i in ranked] + [tuned]
            f_iters = max(args.final_iters, min(50, 4 * parse_size(args.budget) // size))
            f_median = time_groups(final, buf, size, f_iters, world, seed=size * 1000 + 7,
                                   mode=args.mode)
            f_best = min(range(len(final) - 1), key=lambda i: f_median[i])
            ratio = f_median[f_best] / f_median[-1]
            entry["final"] = {"iters": f_iters, "auto_s": f_median[-1],
                              "best": final[f_best].label, "best_s": f_median[f_best],
                              "auto_vs_best": ratio,
                              "static": {st.label: t for st, t in zip(final, f_median)}}
            if rank == 0:
                print(f"#   second round, {f_iters} calls each: best {final[f_best].label} "
                      f"{f_median[f_best] * 1e3:.2f} ms; auto {f_median[-1] * 1e3:.2f} ms = "
                      f"{ratio:.3f} of the best's speed", flush=True)
                for st, t in zip(final[:-1], f_median):
                    print(f"#     {st.label:<38} {t * 1e3:10.2f} ms", flush=True)
            if args.confirm:
                # The best finalist was picked as the lowest of several noisy medians, of
                # groups that each keep their own speed: time its setting and the tuner's again
                # on fresh calls of fresh groups (or of these, --fresh 0). Paired, round by
                # round (the two in turn first), twice the calls.
                c_iters = 2 * f_iters
                pairs = []
                for j in range(max(1, args.fresh)):
                    pair = ([final[f_best], tuned] if args.fresh == 0 else
                            fresh_twins(final[f_best], tuned, timeout))
                    if args.fresh > 0:
                        for s in pair:  # connections, scratch memory
                            for _ in range(max(2, args.warmup)):
                                dist.all_reduce(buf, group=s.group)
                    before = dict(nanoccl.stats(pair[1].group)["modelled"])
                    calls = time_groups(pair, buf, size, c_iters, world,
                                        seed=size * 1000 + 13 + j, mode=args.mode, paired=True)
                    ran = [c for c in modelled_since(before,
                                                     nanoccl.stats(pair[1].group)["modelled"])
                           if c["what"].startswith("allreduce")]
                    if args.fresh > 0:
                        for s in pair:
                            dist.destroy_process_group(s.group)
                    pairs.append({"best_s": statistics.median(calls[0]),
                                  "auto_s": statistics.median(calls[1]),
                                  "auto_vs_best": paired_ratio(calls[0], calls[1]),
                                  "auto_ran": ran, "calls_s": calls})
                ratio = math.prod(q["auto_vs_best"] for q in pairs) ** (1 / len(pairs))
                best_s = statistics.median(q["best_s"] for q in pairs)
                auto_s = statistics.median(q["auto_s"] for q in pairs)
                entry["confirm"] = {"iters": c_iters, "fresh": args.fresh,
                                    "best": final[f_best].label, "best_s": best_s,
                                    "auto_s": auto_s, "auto_vs_best": ratio, "pairs": pairs}
                if rank == 0:
                    where = (f"{args.fresh} fresh pairs of groups" if args.fresh > 0 else
                             "the same groups")
                    each = ", ".join(f"{q['auto_vs_best']:.3f}" for q in pairs)
                    print(f"#   third round, {c_iters} paired calls each, {where}: "
                          f"{final[f_best].label} {best_s * 1e3:.2f} ms; auto "
                          f"{auto_s * 1e3:.2f} ms; auto at {ratio:.3f} of its speed (paired "
                          f"ratios: {each})", flush=True)
        worst = min(worst, ratio)
        doc["sizes"].append(entry)
    if rank == 0:
        which = (" (third rounds)" if args.finalists > 0 and args.confirm else
                 " (second rounds)" if args.finalists > 0 else "")
        print(f"\n# worst auto / best static over the sizes{which}: {worst:.3f}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
