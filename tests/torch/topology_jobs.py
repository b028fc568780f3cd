"""Rank programs of test_topologies.py: nanoccl on emulated topologies, against Gloo.

    python topology_jobs.py SCENARIO --rank R --world-size N --init-method URL --result FILE
        [--group NAME=RANKS:IDS ...] [--ids IDS --victim R] [--stale SEGMENT]

The command line is job_harness.py's (as for every program job_runner.run_job starts), and so
are the helpers (Checks, make, reduce_local...): a failed check is recorded, not raised, and the
rank writes {"failures": [...], "checks": n, ...} to FILE.

A topology is emulated by node ids: ranks with equal ids are one node. The default group takes
its ids from NANOCCL_NODE_ID (set per rank by the test); every --group is a further nanoccl
group over RANKS (global ranks) whose node ids come from Options(node_id=...), so that one job
(one torch import per rank, the slow part on a small machine) covers several topologies.

The scenarios and their table are here; the checks they run are in topology_collectives.py
(Group, the sizes, one check per collective) and topology_plan_checks.py (stats, link bytes,
forced algorithms, mismatches, check_group).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import job_harness
import nanoccl
from job_harness import (
    RO,
    Checks,
    expect_error,
    make,
    quiesce,
    reduce_local,
)
from topology_collectives import (
    CHUNK,
    HIERARCHICAL_OPS,
    LOW_THRESHOLD,
    SMALL,
    Group,
    gather_objects,
    parse_group,
)
from topology_plan_checks import (
    check_default_planner,
    check_forced_algo,
    check_group,
    check_huge,
    check_inter_node_bytes,
    check_mismatch,
    check_stats,
)


# ---- scenario: every collective on several topologies -------------------------------------------


def scenario_topologies(a: argparse.Namespace, ck: Checks) -> None:
    init_default(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    timeout = datetime.timedelta(seconds=a.pg_timeout)
    gloo_world = dist.new_group(backend="gloo", timeout=timeout)
    # Non-members of a group wait for its members here: as long as the job may take.
    idle = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=a.deadline))
    world_ids = gather_objects(os.environ["NANOCCL_NODE_ID"], gloo_world, world)
    world_group = Group("world", list(range(world)), world_ids, dist.group.WORLD, gloo_world)
    check_default_planner(ck, world_group)
    check_inter_node_bytes(ck, world_group, count=256 * 1024)  # 1 MiB at the default threshold
    check_huge(ck, world_group)
    check_forced_algo(ck, world_group, timeout)
    check_mismatch(ck, world_group, timeout)
    check_stats(ck, world_group, ops_run=HIERARCHICAL_OPS)

    groups = []
    for spec in a.group:
        name, ranks, ids = parse_group(spec)
        # Every rank takes part in creating every group (torch's rule); members use them.
        opts = nanoccl.Options(small_message_bytes=LOW_THRESHOLD, chunk_bytes=CHUNK)
        if rank in ranks:
            opts.set("node_id", ids[ranks.index(rank)])
        nano = dist.new_group(ranks, backend="nanoccl", pg_options=opts, timeout=timeout)
        gloo = dist.new_group(ranks, backend="gloo", timeout=timeout)
        g = Group(name, ranks, ids, nano, gloo)
        if g.hierarchical:
            opts.set("algo", "hierarchical")
            g.forced = dist.new_group(ranks, backend="nanoccl", pg_options=opts, timeout=timeout)
        groups.append(g)
    # Every group is set up: each intra-node segment was unlinked once its peers mapped it.
    ck.expect("no segment name left in /dev/shm after setup", not own_segments(os.getpid()),
              str(own_segments(os.getpid())))
    for g in groups:
        if rank in g.ranks:
            check_group(ck, g)
        dist.barrier(group=idle)  # keeps the non-members from running ahead
    quiesce(gloo_world)
    dist.destroy_process_group()


def init_default(a: argparse.Namespace, store: Any = None) -> None:
    dist.init_process_group(
        "nanoccl",
        init_method=None if store is not None else a.init_method,
        store=store,
        rank=a.rank,
        world_size=a.world_size,
        timeout=datetime.timedelta(seconds=a.pg_timeout),
    )


# ---- scenarios: a rank killed while shared-memory segments exist, then the next run ----------


def own_segments(pid: int) -> list[str]:
    return sorted(glob.glob(f"/dev/shm/nanoccl-*-{pid}"))


class KillingStore(dist.Store):
    """The job's store, seen through a wrapper that kills this rank at one chosen moment.

    Armed, it waits, after this rank publishes its address with a shared-memory segment in it
    ("<tcp address>|<segment>": its group routes a node's collectives through shared memory),
    until every rank of every multi-rank node has published its own (so every rank's listen(),
    which removes stale segments, has run), then SIGKILLs its own process: its segment is left
    behind in /dev/shm, which only the next run may clean.
    """

    ADDR = re.compile(r"^(.*)/addr/(\d+)$")

    def __init__(self, inner: dist.Store, routed_ranks: list[int], timeout: float):
        super().__init__()
        self.inner = inner
        self.routed_ranks = routed_ranks  # the ranks of multi-rank nodes
        self.wait_s = timeout
        self.armed = False

    def set(self, key: str, value: Any) -> None:
        self.inner.set(key, value)
        match = self.ADDR.match(key)
        if not (self.armed and match):
            return
        address = value.decode() if isinstance(value, bytes) else str(value)
        if "|" not in address:
            return
        prefix = match.group(1)
        keys = [f"{prefix}/addr/{r}" for r in self.routed_ranks]
        self.inner.wait(keys, datetime.timedelta(seconds=self.wait_s))
        name = address.split("|", 1)[1]
        print(f"VICTIM pid={os.getpid()} segment={name} exists={os.path.exists('/dev/shm' + name)}",
              flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def wait(self, keys: list[str], *timeout: Any) -> None:
        self.inner.wait(keys, *timeout)


# The rest of the Store interface goes straight to the job's store. (Methods of the class,
# not __getattr__: the C++ side looks for Python overrides on the type.)
for _method in ("get", "add", "check", "compare_set", "delete_key", "num_keys", "set_timeout"):
    setattr(KillingStore, _method,
            lambda self, *args, _m=_method: getattr(self.inner, _m)(*args))


def routed_ranks_of(ids: list[str]) -> list[int]:
    """The ranks of multi-rank nodes: those whose group routes through shared memory."""
    return [r for r, i in enumerate(ids) if ids.count(i) > 1]


def scenario_killed_in_shm(a: argparse.Namespace, ck: Checks) -> None:
    rank, world = a.rank, a.world_size
    ids = a.ids.split(",")
    victim = a.victim
    inner = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          rank == 0, timeout=datetime.timedelta(seconds=a.pg_timeout + 30))
    store = KillingStore(inner, routed_ranks_of(ids), a.pg_timeout)
    init_default(a, store)
    inner.set(f"pid/{rank}", str(os.getpid()))
    pids = [int(inner.get(f"pid/{r}")) for r in range(world)]
    ck.data["pids"] = pids

    # The default group works, over shared memory inside node ids[0]; once set up, no segment
    # name is left in /dev/shm, even for a job about to be killed.
    x = make(torch.int64, rank, (200_000,), 1)
    dist.all_reduce(x)
    ck.same("all_reduce before the kill", x,
            reduce_local([make(torch.int64, r, (200_000,), 1) for r in range(world)], RO.SUM))
    s = nanoccl.stats()
    ck.expect("hierarchical before the kill", s["per_algorithm"].get("allreduce/hierarchical", 0)
              == 1, str(s["per_algorithm"]))
    inner.set(f"ready/{rank}", "1")
    inner.wait([f"ready/{r}" for r in range(world)])
    ck.expect("no segment name left after setup", not own_segments(os.getpid()),
              str(own_segments(os.getpid())))

    # A second group: the victim dies in its intra-node setup, with its segment published.
    if rank == victim:
        store.armed = True
    timeout = datetime.timedelta(seconds=a.pg_timeout)
    limit = a.pg_timeout + 8
    msg = expect_error(ck, "new group with a rank killed in its setup",
                       lambda: dist.new_group(backend="nanoccl", timeout=timeout), [], limit)
    if rank == victim:
        ck.fail("victim", "still alive after the group setup: no intra-node address key "
                "matched KillingStore.ADDR (did the store key layout change?)")
        return
    ck.data["new_group_error"] = msg
    # What the next run must remove (unless another nanoccl process on this host does first).
    ck.data["victim_segments"] = own_segments(pids[victim])
    same_node = ids[rank] == ids[victim]
    if same_node:
        # Its node peer never hears from it: the group's network handshake (which runs first,
        # routed.cc) names it when the setup's deadline passes.
        ck.expect("the node peer names the dead rank",
                  re.search(rf"rank(\(s\))? {victim}\b", msg) is not None, msg[:600])
    # The group set up before the kill fails too, with an error and in time, on every survivor.
    err = expect_error(ck, "all_reduce on the group set up before the kill",
                       lambda: dist.all_reduce(torch.ones(100_000)), [], limit)
    ck.data["all_reduce_error"] = err
    ck.expect("a survivor leaves no segment of its own", not own_segments(os.getpid()),
              str(own_segments(os.getpid())))
    ck.data["raised"] = True
    # The rank hosting the store waits for the others before its store goes away.
    inner.add("done", 1)
    deadline = time.monotonic() + 20
    while rank == 0 and inner.add("done", 0) < world - 1 and time.monotonic() < deadline:
        time.sleep(0.05)


def scenario_after_kill(a: argparse.Namespace, ck: Checks) -> None:
    """The next run on the same node ids: it works, and its setup removed the stale segment."""
    init_default(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    ck.expect("stale segment removed by this run's setup",
              not os.path.exists("/dev/shm" + a.stale), a.stale)
    gloo = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=a.pg_timeout))
    for count in (SMALL, 100_000):
        x = make(torch.float32, rank, (count,), 2)
        got, ref = x.clone(), x.clone()
        dist.all_reduce(got)
        dist.all_reduce(ref, group=gloo)
        ck.same(f"all_reduce x{count} after the kill vs gloo", got, ref)
        outs = [torch.zeros(count, dtype=torch.int16) for _ in range(world)]
        dist.all_gather(outs, make(torch.int16, rank, (count,), 3))
        for r in range(world):
            ck.same(f"all_gather x{count} after the kill from {r}", outs[r],
                    make(torch.int16, r, (count,), 3))
    s = nanoccl.stats()
    ck.expect("hierarchical after the kill",
              s["per_algorithm"].get("allreduce/hierarchical", 0) == 1, str(s["per_algorithm"]))
    ids = a.ids.split(",")
    if ids.count(ids[rank]) > 1:
        ck.expect("intra-node traffic after the kill",
                  s["per_link"]["intra-node"]["bytes_sent"] > 0, str(s["per_link"]))
    quiesce(gloo)
    dist.destroy_process_group()


# ---- scenario: the threads a rank runs ----------------------------------------------------------


def nanoccl_threads() -> dict[int, str]:
    """This process's threads named nanoccl*, thread id -> name."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue  # it ended meanwhile
        if name.startswith("nanoccl"):
            out[int(tid)] = name
    return out


def scenario_threads(a: argparse.Namespace, ck: Checks) -> None:
    """64 MB hierarchical allreduces: the threads named nanoccl* while they run, sampled by a
    thread of our own (the calls release the GIL while they wait)."""
    init_default(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.ones(16 << 20)  # 64 MB of float32
    dist.all_reduce(x)  # the first call starts what such calls need
    first = nanoccl_threads()
    seen: dict[int, str] = dict(first)
    peak = len(first)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            now = nanoccl_threads()
            peak = max(peak, len(now))
            seen.update(now)
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for _ in range(4):
        x.fill_(1.0)
        dist.all_reduce(x)
    stop.set()
    sampler.join()
    ck.same("the last all_reduce", x, torch.full_like(x, float(world)))
    calls = nanoccl.stats()["per_algorithm"]
    ck.expect("every call hierarchical", calls.get("allreduce/hierarchical", 0) == 5, str(calls))
    ck.expect("at most 4 threads named nanoccl*", peak <= 4,
              f"peak {peak}: {sorted(seen.values())}")
    ck.expect("no thread created by a call after the first", set(seen) == set(first),
              f"after the first call {sorted(first.values())}, during the next "
              f"{sorted(seen[t] for t in set(seen) - set(first))}")
    ck.data["threads"] = sorted(first.values())
    ck.data["peak"] = peak
    dist.destroy_process_group()


SCENARIOS: dict[str, Callable[[argparse.Namespace, Checks], None]] = {
    "topologies": scenario_topologies,
    "threads": scenario_threads,
    "killed_in_shm": scenario_killed_in_shm,
    "after_kill": scenario_after_kill,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group", action="append", default=[],
                   help="NAME=RANKS:IDS, a further nanoccl group (topologies)")
    p.add_argument("--ids", default="", help="node id per rank (killed_in_shm, after_kill)")
    p.add_argument("--victim", type=int, default=1)
    p.add_argument("--stale", default="", help="a segment name the run must have removed")


if __name__ == "__main__":
    sys.exit(job_harness.main(SCENARIOS, add_arguments, leave_hard=("killed_in_shm",)))
