"""Scenarios of dist_jobs.py where calls must fail: on every rank, in time, naming the ranks.

errors: mismatched calls and bad input; killed_peer: a peer dies; no_show: a rank never joins
the group.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from job_harness import RO, Checks, expect_error, init, quiesce


# ---- scenario: bad input -------------------------------------------------------------------


def scenario_errors(a: argparse.Namespace, ck: Checks) -> None:
    init(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    timeout = datetime.timedelta(seconds=a.pg_timeout)
    # Every rank raises within the process group's timeout (plus scheduling slack: a call
    # that fails at its deadline completes just after it).
    limit = a.pg_timeout + 5
    both = [rank, -1]  # this rank and the other side
    gloo = dist.new_group(backend="gloo")

    def fresh() -> Any:
        return dist.new_group(backend="nanoccl", timeout=timeout)

    def destroy(g: Any) -> None:
        quiesce(gloo)
        dist.destroy_process_group(g)

    # Mismatches are mostly found when the first message arrives, well before the timeout;
    # some only at the timeout (core limitation: a message of the same call number but another
    # step is not compared, see the backend report), hence the common limit.
    # The kinds (backend/errors.h): what the ranks cause between them is DistBackendError on
    # every rank; a call a rank refuses is ValueError (TypeError: a dtype) on that rank, and
    # its peers, which made the call, meet a mismatch (DistBackendError).
    late = limit
    dbe = (dist.DistBackendError,)
    refuser = (ValueError,) if rank == 1 else dbe
    cases: list[tuple[str, Callable[[Any], Any], list[int], float, tuple[type, ...]]] = [
        ("different shapes",
         lambda g: dist.all_reduce(torch.ones(8 if rank != 1 else 12), group=g), both, limit,
         dbe),
        ("different dtypes",
         lambda g: dist.all_reduce(torch.ones(8, dtype=torch.float32 if rank != 1
                                              else torch.float64), group=g), both, limit, dbe),
        ("different roots",
         lambda g: dist.broadcast(torch.ones(4), src=1 if rank == 1 else 0, group=g), both,
         late, dbe),
        ("different ops",
         lambda g: dist.all_reduce(torch.ones(4), group=g) if rank != 1
         else dist.all_gather([torch.ones(4) for _ in range(world)], torch.ones(4), group=g),
         both, late, dbe),
        ("different reductions",
         lambda g: dist.all_reduce(torch.ones(4), op=RO.SUM if rank != 1 else RO.MAX,
                                   group=g), both, limit, dbe),
        ("root outside the group on rank 1",
         lambda g: g.broadcast(torch.ones(4), 7 if rank == 1 else 0).wait(), [1], limit,
         refuser),
        ("reduction undefined on the dtype",
         lambda g: dist.all_reduce(torch.ones(4), op=RO.BAND, group=g), [rank], limit,
         (ValueError,)),
        ("dtype without reductions",
         lambda g: dist.all_reduce(torch.ones(4).to(torch.float8_e4m3fn), group=g), [rank],
         limit, (TypeError,)),
    ]
    for name, call, names, case_limit, kinds in cases:
        g = fresh()
        # With 3+ ranks a rank that only exchanged with ranks agreeing with it may finish the
        # call; the group is then broken and its next call fails.
        then = (lambda: dist.all_reduce(torch.ones(2), group=g)) if rank > 1 else None
        expect_error(ck, name, lambda: call(g), names, case_limit, kinds, then=then)
        destroy(g)

    # Every rank refuses the same call before a byte of it moves: the group stays usable, as
    # Gloo's does (the ranks meet in the refused call's place, Communicator::refusedCall).
    g = fresh()
    refused: list[tuple[str, Callable[[], Any]]] = [
        ("a sparse tensor on every rank",
         lambda: dist.all_reduce(torch.ones(4).to_sparse(), group=g)),
        ("an output list of the wrong length on every rank",
         lambda: dist.all_gather([torch.ones(2)] * (world + 1), torch.ones(2), group=g)),
        ("a reduction undefined on the dtype on every rank",
         lambda: dist.all_reduce(torch.ones(4), op=RO.BAND, group=g)),
        ("a root outside the group on every rank",
         lambda: g.broadcast(torch.ones(4), world + 3).wait()),
    ]
    for name, call in refused:
        expect_error(ck, name, call, [], limit, (ValueError,))
        t = torch.ones(2)
        ck.run(f"usable after {name}", lambda: dist.all_reduce(t, group=g))
        ck.same(f"usable after {name}: value", t, torch.full((2,), float(world)))
    destroy(g)

    # A group that failed is unusable, with a clear error; destroying it does not hang.
    g = fresh()
    expect_error(ck, "mismatch again", lambda: dist.all_reduce(
        torch.ones(3 if rank else 4), group=g), both, limit, dbe)
    expect_error(ck, "use after an error", lambda: dist.all_reduce(torch.ones(3), group=g),
                 [rank], limit, dbe)
    destroy(g)

    # Send to self: torch refuses it before the backend (ValueError); the backend itself, as
    # reached through the ProcessGroup object, refuses too, naming both ends.
    g = fresh()
    expect_error(ck, "send to self (torch)", lambda: dist.send(torch.ones(2), dst=rank, group=g),
                 [], limit, (ValueError, RuntimeError))
    expect_error(ck, "send to self (backend)", lambda: g.send([torch.ones(2)], rank, 0),
                 [rank], limit, (ValueError,))
    ck.expect("send to self names the destination",
              f"destination rank {rank}" in ck.data["messages"].get("send to self (backend)", ""))
    expect_error(ck, "recv from self (backend)", lambda: g.recv([torch.ones(2)], rank, 0),
                 [rank], limit, (ValueError,))
    # The group still works after a refused point-to-point call.
    t = torch.ones(2)
    ck.run("group usable after refused p2p", lambda: dist.all_reduce(t, group=g))
    ck.same("group usable after refused p2p value", t, torch.full((2,), float(world)))
    destroy(g)
    dist.barrier()
    quiesce(gloo)
    dist.destroy_process_group()


# ---- scenario: a peer dies --------------------------------------------------------------------


def scenario_killed_peer(a: argparse.Namespace, ck: Checks) -> None:
    init(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    victim = world - 1
    t = torch.ones(1000)
    dist.all_reduce(t)
    ck.same("before", t, torch.full((1000,), float(world)))
    dist.barrier()
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    for i in range(2):
        expect_error(ck, f"all_reduce with a dead peer #{i}",
                     lambda: dist.all_reduce(torch.ones(1 << 18)), [], a.pg_timeout + 2,
                     (dist.DistBackendError,))
    ck.data["raised"] = True
    # No destroy_process_group: the group is broken; exiting must not hang either.


# ---- scenario: a rank never joins -------------------------------------------------------------


def scenario_no_show(a: argparse.Namespace, ck: Checks) -> None:
    # The last rank never joins the nanoccl group: the others fail at creation, in time.
    init(a, "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == world - 1:
        time.sleep(a.pg_timeout + 3)  # stays alive (its store and sockets too), never joins
        return

    def create() -> None:
        from nanoccl import _C

        store = dist.PrefixStore("noshow/", dist.distributed_c10d._get_default_store())
        _C.create_backend(store, rank, world, int(a.pg_timeout * 1000), "noshow", [], {})

    expect_error(ck, "a rank never joins", create, [rank], a.pg_timeout + 5,
                 (dist.DistBackendError,))
