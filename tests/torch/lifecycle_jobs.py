"""Scenarios of dist_jobs.py on a group's life around the collectives.

lifecycle: double init, Options, stats, no thread or socket left after destroy, use after
destroy; device_map: a group mapping CPU and CUDA to different backends; torchrun: started by
torchrun; destroy_race: destroy and exit right after the last call.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist

import nanoccl
from job_harness import RO, Checks, expect_error, init, make, quiesce, reduce_local


# ---- scenario: lifecycle, options, stats, leaks -------------------------------------------------


def threads_and_sockets() -> tuple[int, int]:
    sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                sockets += 1
        except OSError:
            pass
    return len(os.listdir("/proc/self/task")), sockets


def settle(baseline: tuple[int, int], seconds: float = 5.0) -> tuple[int, int]:
    deadline = time.monotonic() + seconds
    now = threads_and_sockets()
    while now != baseline and time.monotonic() < deadline:
        time.sleep(0.05)
        now = threads_and_sockets()
    return now


def scenario_lifecycle(a: argparse.Namespace, ck: Checks) -> None:
    init(a)
    rank, world = dist.get_rank(), dist.get_world_size()

    # Double init.
    def double() -> None:
        init(a)

    expect_error(ck, "double init", double, [], 10, (ValueError, RuntimeError))
    t = torch.ones(3)
    dist.all_reduce(t)
    ck.same("default group after double init", t, torch.full((3,), float(world)))

    # Options: validated at once; applied to a group.
    expect_error(ck, "Options(nsocks=0)", lambda: nanoccl.Options(nsocks=0), [], 5, (ValueError,))
    expect_error(ck, "Options(bogus=1)", lambda: nanoccl.Options(bogus=1), [], 5, (ValueError,))
    expect_error(ck, "Options(tcp_engine=...)", lambda: nanoccl.Options(tcp_engine="x"), [], 5,
                 (ValueError,))
    # Transports come from the transport table: unknown ones, and shm between nodes, raise.
    for bad in ("bogus", "shm"):
        expect_error(ck, f"Options(transport={bad!r})",
                     lambda bad=bad: nanoccl.Options(transport=bad), [], 5, (ValueError,))
    ck.expect("Options(transport='tcp')",
              nanoccl.Options(transport="tcp").settings == {"transport": "tcp"})
    expect_error(ck, "pg_options of the wrong type",
                 lambda: dist.new_group(backend="nanoccl", pg_options=object()), [], 10,
                 (TypeError, RuntimeError, ValueError))
    opts = nanoccl.Options(nsocks=1, tcp_engine="epoll", chunk_bytes=65536)
    ck.expect("Options.settings", opts.settings == {"nsocks": "1", "tcp_engine": "epoll",
                                                    "chunk_bytes": "65536"}, repr(opts))
    dist.barrier()

    # A subgroup's threads and sockets go away with it.
    baseline = threads_and_sockets()
    sub = dist.new_group(backend="nanoccl", pg_options=opts)
    x = make(torch.float32, rank, (300000,), 5)
    dist.all_reduce(x, group=sub)
    ck.same("subgroup with options", x,
            reduce_local([make(torch.float32, r, (300000,), 5) for r in range(world)], RO.SUM))
    during = threads_and_sockets()
    backend = nanoccl.get_backend(sub)
    s = nanoccl.stats(sub)
    payload = 300000 * 4
    ck.expect("stats per_op allreduce", s["per_op"].get("allreduce", {}).get("bytes_sent", 0) > 0
              or world == 1, str(s["per_op"]))
    if world > 1:
        ck.expect("stats bytes sent", s["bytes_sent"] >= payload * (world - 1) // world,
                  str(s))
        ck.expect("stats one node: intra-node",
                  s["per_link"]["intra-node"]["bytes_sent"] == s["bytes_sent"] and
                  s["per_link"]["inter-node"]["bytes_sent"] == 0, str(s["per_link"]))
    dist.barrier()
    dist.destroy_process_group(sub)
    after = settle(baseline)
    ck.data["threads_sockets"] = {"before": baseline, "during": during, "after": after}
    ck.expect("no thread left after destroy", after[0] <= baseline[0],
              f"before {baseline}, during {during}, after {after}")
    ck.expect("no socket left after destroy", after[1] <= baseline[1],
              f"before {baseline}, during {during}, after {after}")

    # Use after destroy.
    expect_error(ck, "use after destroy (torch)", lambda: dist.all_reduce(torch.ones(2),
                                                                          group=sub),
                 [], 5, (ValueError, RuntimeError))
    expect_error(ck, "use after destroy (backend)", lambda: sub.allreduce([torch.ones(2)]),
                 [rank], 5, (RuntimeError,))
    del backend

    # A group of one's own (nanoccl.new_process_group, as torchft builds them): it works over
    # a fresh store prefix; bad options and ranks are refused where it is made.
    store = dist.distributed_c10d._get_default_store()
    own = nanoccl.new_process_group(dist.PrefixStore("own", store), rank, world,
                                    datetime.timedelta(seconds=a.pg_timeout))
    z = torch.full((1000,), float(rank))
    opts_sum = dist.AllreduceOptions()
    opts_sum.reduceOp = dist.ReduceOp.SUM
    own.allreduce([z], opts_sum).wait()
    ck.same("new_process_group all_reduce", z, torch.full((1000,), float(sum(range(world)))))
    expect_error(ck, "new_process_group options of the wrong type",
                 lambda: nanoccl.new_process_group(dist.PrefixStore("bad1", store), rank, world,
                                                   options={"nsocks": 2}), [], 5, (TypeError,))
    expect_error(ck, "new_process_group rank out of range",
                 lambda: nanoccl.new_process_group(dist.PrefixStore("bad2", store), world, world),
                 [], 5, (ValueError,))
    dist.barrier()
    del own

    # Node ids: from NANOCCL_NODE_ID at the group's creation; different nodes -> inter-node.
    os.environ["NANOCCL_NODE_ID"] = f"node{rank}"
    split = dist.new_group(backend="nanoccl")
    os.environ.pop("NANOCCL_NODE_ID")
    y = torch.ones(1000)
    dist.all_reduce(y, group=split)
    s2 = nanoccl.stats(split)
    ck.data["stats_split"] = s2
    if world > 1:
        ck.expect("stats several nodes: inter-node",
                  s2["per_link"]["inter-node"]["bytes_sent"] == s2["bytes_sent"] > 0 and
                  s2["per_link"]["intra-node"]["bytes_sent"] == 0, str(s2["per_link"]))
        ck.expect("stats peer link", all(p["link"] == ("self" if p["rank"] == rank
                                                         else "inter-node")
                                         for p in s2["per_peer"]), str(s2["per_peer"]))
    ck.expect("stats node", s2["node"] == f"node{rank}", s2["node"])

    # Malformed settings are refused where the group is made, on every rank: those read by
    # their own modules (logging, the reduction kernels) and the algorithm's name too; a bad
    # setting is a ValueError (backend/errors.h).
    expect_error(ck, "Options(algo='nonsense')", lambda: nanoccl.Options(algo="nonsense"), [], 5,
                 (ValueError,))
    for var, bad in (("NANOCCL_DEBUG", "LOUD"), ("NANOCCL_REDUCE_ISA", "avx9000"),
                     ("NANOCCL_ALGO", "nonsense")):
        os.environ[var] = bad
        try:
            msg = expect_error(ck, f"{var}={bad} at group creation",
                               lambda: dist.new_group(backend="nanoccl"), [], 10, (ValueError,))
            ck.expect(f"{var}={bad} named", var in msg or bad in msg, msg)
        finally:
            os.environ.pop(var)

    # Wrong group for stats.
    gloo = dist.new_group(backend="gloo")
    expect_error(ck, "stats of a gloo group", lambda: nanoccl.stats(gloo), [], 5, (ValueError,))
    dist.barrier()
    quiesce(gloo)
    dist.destroy_process_group()


def scenario_device_map(a: argparse.Namespace, ck: Checks) -> None:
    init(a, "cpu:gloo,cuda:nanoccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(5)
    dist.all_reduce(t)  # CPU: Gloo
    ck.same("cpu all_reduce on gloo", t, torch.full((5,), float(world)))
    backend = nanoccl.get_backend()
    ck.expect("cuda backend is nanoccl", backend.name() == "nanoccl", backend.name())
    s = nanoccl.stats()
    ck.expect("nanoccl moved nothing", s["bytes_sent"] == 0, str(s))
    # And the reverse map: nanoccl for CPU tensors in a group that also names gloo for cuda.
    g = dist.new_group(backend="cpu:nanoccl,cuda:gloo")
    u = torch.ones(5)
    dist.all_reduce(u, group=g)
    ck.same("cpu all_reduce on nanoccl", u, torch.full((5,), float(world)))
    if world > 1:
        ck.expect("nanoccl moved bytes", nanoccl.stats(g)["bytes_sent"] > 0)
    dist.barrier()
    dist.destroy_process_group()


def scenario_torchrun(a: argparse.Namespace, ck: Checks) -> None:
    # Under torchrun: env:// from its variables; node from GROUP_RANK.
    dist.init_process_group("nanoccl", timeout=datetime.timedelta(seconds=a.pg_timeout))
    world = dist.get_world_size()
    t = torch.ones(100)
    dist.all_reduce(t)
    ck.same("torchrun all_reduce", t, torch.full((100,), float(world)))
    s = nanoccl.stats()
    ck.expect("node from GROUP_RANK", s["node"] == f"group_rank:{os.environ['GROUP_RANK']}",
              s["node"])
    ck.expect("all intra-node", s["per_link"]["inter-node"]["bytes_sent"] == 0, str(s))
    quiesce(dist.new_group(backend="gloo"))
    dist.destroy_process_group()


def scenario_destroy_race(a: argparse.Namespace, ck: Checks) -> None:
    # The last call, then destroy and exit at once: a peer still finishing must not fail.
    init(a)
    world = dist.get_world_size()
    t = torch.ones(100)
    dist.all_reduce(t)
    ck.same("last all_reduce", t, torch.full((100,), float(world)))
    dist.destroy_process_group()
