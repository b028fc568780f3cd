"""CPU used by an idle nanoccl process group: 200 small calls, then 0.5 s to settle, then the
process's CPU time over 3 s of sleep (torchrun --nproc-per-node 2 bench/latency/idle_cpu.py)."""
import time

import torch
import torch.distributed as dist

import nanoccl  # noqa: F401  registers the backend

dist.init_process_group("nanoccl")
t = torch.ones(1)
for _ in range(200):
    dist.all_reduce(t)
time.sleep(0.5)
cpu0, wall0 = time.process_time(), time.perf_counter()
time.sleep(3.0)
cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
out = [None] * dist.get_world_size()
dist.all_gather_object(out, 100 * cpu / wall)
if dist.get_rank() == 0:
    print("idle process group, % of one core per rank over 3 s: "
          + ", ".join(f"rank {r}: {p:.2f}%" for r, p in enumerate(out)))
dist.destroy_process_group()
