"""A plain torch.distributed loop of 4-byte allreduces, nothing else between the calls:
3000 timed after 200 untimed; rank 0 prints mean, median and p99 of one call.

    NANOCCL_SOCKET_IFNAME=lo torchrun --nproc-per-node 4 bench/latency/allreduce_loop.py
    NANOCCL_ALGO=recursive_doubling NANOCCL_SOCKET_IFNAME=lo torchrun ... (messages instead)
"""
import os
import time

import torch
import torch.distributed as dist

import nanoccl  # noqa: F401  (registers the backend)

dist.init_process_group("nanoccl")
rank = dist.get_rank()
t = torch.ones(1)
for _ in range(200):
    dist.all_reduce(t)
times = []
for _ in range(3000):
    start = time.perf_counter()
    dist.all_reduce(t)
    times.append(time.perf_counter() - start)
times.sort()
if rank == 0:
    print(f"{os.environ.get('NANOCCL_ALGO', 'auto')}: mean {1e6 * sum(times) / len(times):.1f} "
          f"median {1e6 * times[len(times) // 2]:.1f} p99 {1e6 * times[int(len(times) * .99)]:.1f} us")
dist.destroy_process_group()
