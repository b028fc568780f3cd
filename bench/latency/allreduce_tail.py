"""The tail of a loop of 4-byte allreduces, each rank's calling thread bound to a CPU of its own:
mean, median, p99 and the share of calls over twice the mean, per call as nanoccl-perf counts
it (the mean of the ranks' times for that call), and the period (from one timed call's start
to the next one's, within a block: what the machine's noise has to miss). Variants of the
loop, to tell which part of nanoccl-perf's back-to-back mode adds to the tail:

    NANOCCL_SOCKET_IFNAME=lo torchrun --nproc-per-node 2 bench/latency/allreduce_tail.py
    REFILL=1 ...  a tensor copy before each call (nanoccl-perf refills its input)
    BLOCKS=1 ...  timed blocks of 50 calls, each after 1000 untimed ones (its lead-in)
    N=50000 ...   calls timed (20000)
"""
import os
import statistics
import time

import torch
import torch.distributed as dist

import nanoccl  # noqa: F401  (registers the backend)

dist.init_process_group("nanoccl")
rank, world = dist.get_rank(), dist.get_world_size()
cpus = sorted(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
n = int(os.environ.get("N", "20000"))
refill = os.environ.get("REFILL") == "1"
blocks = os.environ.get("BLOCKS") == "1"
t, pristine = torch.ones(1), torch.ones(1)


def refill_input() -> None:
    if refill:
        t.copy_(pristine)


for _ in range(2000):
    refill_input()
    dist.all_reduce(t)
times: list[int] = []
periods: list[int] = []
while len(times) < n:
    if blocks:
        for _ in range(1000):
            refill_input()
            dist.all_reduce(t)
    last = 0
    for _ in range(min(50 if blocks else n, n - len(times))):
        refill_input()
        start = time.perf_counter_ns()
        dist.all_reduce(t)
        times.append(time.perf_counter_ns() - start)
        if last:
            periods.append(start - last)
        last = start
gathered: list = [None] * world
dist.all_gather_object(gathered, times)
if rank == 0:
    per = [sum(g[i] for g in gathered) / world / 1000 for i in range(n)]
    mean, ordered = statistics.fmean(per), sorted(per)
    p99 = ordered[int(0.99 * n)]
    over = sum(1 for x in per if x > 2 * mean)
    print(f"refill={int(refill)} blocks={int(blocks)} {n} calls: mean {mean:.2f} us, median "
          f"{ordered[n // 2]:.2f}, p99 {p99:.2f} ({p99 / mean:.2f}x the mean), "
          f"{100 * over / n:.2f}% of calls over twice the mean; period "
          f"{statistics.median(periods) / 1000:.2f} us (median)")
dist.destroy_process_group()
