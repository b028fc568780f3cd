"""What the slow calls of a loop of 4-byte allreduces meet: each rank pins its calling thread
to a CPU of its own, times 20000 calls (CLOCK_MONOTONIC), and the analysis lists the kernel
events that `perf record` saw on the CPUs inside each call slower than twice the median.

    perf record -q -o /tmp/slow.data -a --clockid=CLOCK_MONOTONIC -e sched:sched_switch \\
        -e irq_vectors:local_timer_entry -e irq_vectors:local_timer_exit \\
        -e irq:irq_handler_entry -e irq:softirq_entry -- \\
        env NANOCCL_SOCKET_IFNAME=lo torchrun --nproc-per-node 2 bench/latency/slow_calls.py
    perf script -i /tmp/slow.data -F cpu,time,event,trace --ns > /tmp/slow.txt
    python bench/latency/slow_calls.py --analyze /tmp/slow.txt
"""
import bisect
import collections
import json
import os
import re
import statistics
import sys
import time

CALLS = 20000
OUT = "/tmp/slow_calls_rank{}.json"


def loop() -> None:
    import torch
    import torch.distributed as dist
    import nanoccl  # noqa: F401  (registers the backend)

    dist.init_process_group("nanoccl")
    rank = dist.get_rank()
    os.sched_setaffinity(0, {rank % os.cpu_count()})  # this thread only
    t = torch.ones(1)
    for _ in range(500):
        dist.all_reduce(t)
    spans = []
    for _ in range(CALLS):
        start = time.monotonic_ns()
        dist.all_reduce(t)
        spans.append((start, time.monotonic_ns()))
    with open(OUT.format(rank), "w") as f:
        json.dump(spans, f)
    dist.destroy_process_group()


def parse(path: str) -> list[tuple[int, int, str, str]]:
    events = []
    for line in open(path):
        m = re.match(r"\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)", line)
        if not m:
            continue
        cpu, ts, name, rest = int(m.group(1)), round(float(m.group(2)) * 1e9), m.group(3), m.group(4)
        if name == "sched:sched_switch":
            s = re.search(r"prev_comm=(.*?) prev_pid.*next_comm=(.*?) next_pid", rest)
            rest = f"{s.group(1)} -> {s.group(2)}"
        else:
            s = re.search(r"(?:name|action)=(\S+)", rest)
            rest = s.group(1).strip("]") if s else ""
        events.append((ts, cpu, name.split(":")[1], rest))
    events.sort()
    return events


def analyze(path: str) -> None:
    r0, r1 = (json.load(open(OUT.format(r))) for r in (0, 1))
    per = [((a[1] - a[0]) + (b[1] - b[0])) / 2000 for a, b in zip(r0, r1)]
    median = statistics.median(per)
    ordered = sorted(per)
    print(f"{len(per)} calls: mean {statistics.fmean(per):.2f} us, median {median:.2f}, "
          f"p99 {ordered[int(len(per) * .99)]:.2f}")
    events = parse(path)
    times = [e[0] for e in events]
    seen: collections.Counter = collections.Counter()
    slow = with_event = others_with_event = 0
    for i, t in enumerate(per):
        lo, hi = min(r0[i][0], r1[i][0]), max(r0[i][1], r1[i][1])
        inside = [e for e in events[bisect.bisect_left(times, lo):bisect.bisect_right(times, hi)]
                  if e[2] != "local_timer_exit"]
        if t > 2 * median:
            slow += 1
            with_event += bool(inside)
            seen.update((e[2], e[3]) for e in inside)
        else:
            others_with_event += bool(inside)
    print(f"{slow} calls over twice the median; {with_event} of them with a kernel event inside "
          f"(other calls: {others_with_event} of {len(per) - slow})")
    for (name, what), n in seen.most_common(12):
        print(f"  {n:5d}  {name} {what}")
    entry: dict[int, int] = {}
    spent = []
    for ts, cpu, name, _ in events:
        if name == "local_timer_entry":
            entry[cpu] = ts
        elif name == "local_timer_exit" and cpu in entry:
            spent.append((ts - entry.pop(cpu)) / 1000)
    spent.sort()
    if spent:
        print(f"local timer interrupt: {len(spent)}, median {spent[len(spent) // 2]:.1f} us, "
              f"p90 {spent[int(len(spent) * .9)]:.1f} us")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--analyze":
        analyze(sys.argv[2])
    else:
        loop()
