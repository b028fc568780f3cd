"""The topology tests' checks of the hierarchical plan (used by topology_jobs.py).

Stats (the node, the planner's choices, the link class of every peer), inter-node bytes per
node per allreduce against the ideal, calls of several MiB, forced algorithms (with the
tiny and empty cases of forced hierarchical), calls that differ on one rank, the default
planner threshold, and check_group: every check of topology_collectives.py and these on
one --group.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

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
    HIERARCHICAL_OPS,
    LARGE,
    SMALL,
    Group,
    check_allgather,
    check_allreduce,
    check_alltoall,
    check_async,
    check_broadcast,
    check_gather_scatter,
    check_p2p_barrier,
    check_reduce,
    check_reduce_scatter,
    gather_objects,
)


# ---- stats: the planner's choices and the link classes ----------------------------------------


def check_stats(ck: Checks, g: Group, ops_run: tuple[str, ...] = HIERARCHICAL_OPS) -> None:
    """Node, the planner's choices (for the hierarchical ops in `ops_run`), link classes."""
    me = g.me
    s = nanoccl.stats(g.nano)
    ck.data.setdefault("stats", {})[g.name] = s
    ck.expect(f"{g.name}: stats node", s["node"] == g.ids[me], f"{s['node']} != {g.ids[me]}")
    ck.expect(f"{g.name}: stats size", s["size"] == g.size, str(s["size"]))
    ck.expect(f"{g.name}: no call left buffers behind", s["calls_with_kept_buffers"] == 0,
              str(s["calls_with_kept_buffers"]))
    algos = s["per_algorithm"]
    hier = sorted(k for k in algos if k.endswith("/hierarchical"))
    if g.hierarchical:
        for op in ops_run:
            ck.expect(f"{g.name}: planner chose {op}/hierarchical",
                      algos.get(f"{op}/hierarchical", 0) > 0, str(algos))
    else:
        ck.expect(f"{g.name}: flat topology runs no hierarchical algorithm", not hier, str(algos))
    links = s["per_link"]
    my_node = g.ids[me]
    # Each link class carries bytes unless the topology leaves it nothing to carry.
    for link, unused, why in (("inter-node", len(g.nodes) == 1, "one node"),
                              ("intra-node", len(g.nodes[my_node]) == 1, "one-rank node")):
        if unused:
            ck.expect(f"{g.name}: {why}: nothing {link}",
                      links[link]["bytes_sent"] == 0 and links[link]["bytes_received"] == 0,
                      str(links))
        else:
            ck.expect(f"{g.name}: {link} bytes", links[link]["bytes_sent"] > 0, str(links))
    for p in s["per_peer"]:
        want = ("self" if p["rank"] == me else
                "intra-node" if g.ids[p["rank"]] == my_node else "inter-node")
        ck.expect(f"{g.name}: link of peer {p['rank']}", p["link"] == want, str(p))


def check_inter_node_bytes(ck: Checks, g: Group, count: int, calls: int = 2) -> None:
    """Inter-node bytes per node per allreduce against the ideal 2(m-1)/m x size.

    The issue asks it of the equal-node shapes; the uneven ones (shards = the smallest
    node's size, down to one leader per node) reach the same optimum and are held to it too.
    """
    me, nodes = g.me, g.nodes
    m = len(nodes)
    size_bytes = count * 4

    def inter() -> tuple[int, int]:
        link = nanoccl.stats(g.nano)["per_link"]["inter-node"]
        return link["bytes_sent"], link["bytes_received"]

    dist.barrier(group=g.gloo)
    before = inter()
    x = make(torch.float32, me, (count,), 3)
    want = reduce_local([make(torch.float32, r, (count,), 3) for r in range(g.size)], RO.SUM)
    for i in range(calls):
        got = x.clone()
        dist.all_reduce(got, group=g.nano)
        ck.same(f"{g.name}: all_reduce {size_bytes} bytes #{i}", got, want)
    dist.barrier(group=g.gloo)
    after = inter()
    deltas = gather_objects((after[0] - before[0], after[1] - before[1]), g.gloo, g.size)
    ideal = 2.0 * (m - 1) / m * size_bytes
    measured = {}
    for node, members in nodes.items():
        sent = sum(deltas[r][0] for r in members) / calls
        received = sum(deltas[r][1] for r in members) / calls
        measured[node] = {"sent": sent, "received": received,
                          "ratio": sent / ideal if ideal else None}
    ck.data.setdefault("inter_node_bytes", {})[g.name] = {
        "size": size_bytes, "ideal": ideal, "nodes": measured}
    if m == 1:
        ck.expect(f"{g.name}: one node sends nothing across nodes",
                  all(v["sent"] == 0 and v["received"] == 0 for v in measured.values()),
                  str(measured))
    else:
        for node, v in measured.items():
            for way in ("sent", "received"):
                ck.expect(f"{g.name}: node {node} inter-node bytes {way} per allreduce",
                          abs(v[way] - ideal) <= 0.05 * ideal,
                          f"{v[way]:.0f} bytes, ideal 2(m-1)/m x size = {ideal:.0f} "
                          f"(m={m}, size={size_bytes})")


def check_group(ck: Checks, g: Group) -> None:
    start = time.monotonic()
    for check in (check_allreduce, check_reduce, check_broadcast, check_allgather,
                  check_reduce_scatter, check_alltoall, check_gather_scatter,
                  check_p2p_barrier, check_async):
        check(ck, g)
    check_stats(ck, g)
    check_inter_node_bytes(ck, g, count=64 * 1024)  # 256 KiB of float32
    if g.forced is not None:
        check_tiny_hierarchical(ck, g, g.forced)
    ck.data.setdefault("group_seconds", {})[g.name] = round(time.monotonic() - start, 2)


def check_huge(ck: Checks, g: Group) -> None:
    """Calls of several MiB at the default settings: many 1 MiB chunks, more than one shm
    ring's worth, and more than one of the hierarchical allreduce's pipeline blocks (4 MiB)."""
    me, n = g.me, g.size
    count = (9 << 20) // 4 + 5

    def allreduce() -> None:
        x = make(torch.float32, me, (count,), 31, "rand")
        got, ref = x.clone(), x.clone()
        dist.all_reduce(got, group=g.nano)
        dist.all_reduce(ref, group=g.gloo)
        ck.same(f"{g.name}: all_reduce 9 MiB float32 random vs gloo", got, ref, exact=False)
        y = make(torch.int32, me, (count,), 32)
        dist.all_reduce(y, group=g.nano)
        want = reduce_local([make(torch.int32, r, (count,), 32) for r in range(n)], RO.SUM)
        ck.same(f"{g.name}: all_reduce 9 MiB int32", y, want)

    ck.run(f"{g.name}: all_reduce 9 MiB", allreduce)

    def broadcast() -> None:
        root = n - 1
        got = make(torch.int64, me, (count // 2,), 33)
        dist.broadcast(got, group_src=root, group=g.nano)
        ck.same(f"{g.name}: broadcast 9 MiB", got, make(torch.int64, root, (count // 2,), 33))

    ck.run(f"{g.name}: broadcast 9 MiB", broadcast)

    def gathers() -> None:
        piece = (3 << 20) // 4 + 1
        x = make(torch.int32, me, (piece,), 34)
        flat = torch.zeros(n * piece, dtype=torch.int32)
        dist.all_gather_into_tensor(flat, x, group=g.nano)
        ck.same(f"{g.name}: all_gather 3 MiB pieces", flat,
                torch.cat([make(torch.int32, r, (piece,), 34) for r in range(n)]))
        full = make(torch.float64, me, (n * piece,), 35)
        got = torch.zeros(piece, dtype=torch.float64)
        ref = torch.zeros(piece, dtype=torch.float64)
        dist.reduce_scatter_tensor(got, full, group=g.nano)
        dist.reduce_scatter_tensor(ref, full.clone(), group=g.gloo)
        ck.same(f"{g.name}: reduce_scatter 6 MiB shards vs gloo", got, ref)

    ck.run(f"{g.name}: all_gather / reduce_scatter of MiBs", gathers)


def check_tiny_hierarchical(ck: Checks, g: Group, nano: Any) -> None:
    """Forced hierarchical with fewer elements than shards or ranks, empty pieces, and
    non-contiguous tensors: shards and pieces of zero elements."""
    me, n = g.me, g.size
    name = f"{g.name} algo=hierarchical"
    for count in (0, 1, 2, 3, 5):
        def tiny() -> None:
            x = make(torch.int64, me, (count,), 80)
            dist.all_reduce(x, group=nano)
            want = reduce_local([make(torch.int64, r, (count,), 80) for r in range(n)], RO.SUM)
            ck.same(f"{name}: all_reduce x{count}", x, want)
            b = make(torch.int8, me, (count,), 81)
            dist.broadcast(b, group_src=n // 2, group=nano)
            ck.same(f"{name}: broadcast x{count}", b, make(torch.int8, n // 2, (count,), 81))
            flat = torch.zeros(n * count, dtype=torch.float64)
            dist.all_gather_into_tensor(flat, make(torch.float64, me, (count,), 82), group=nano)
            ck.same(f"{name}: all_gather x{count}", flat,
                    torch.cat([make(torch.float64, r, (count,), 82) for r in range(n)]))
            full = [make(torch.int32, r, (n * count,), 83) for r in range(n)]
            got = torch.zeros(count, dtype=torch.int32)
            dist.reduce_scatter_tensor(got, full[me].clone(), group=nano)
            ck.same(f"{name}: reduce_scatter x{count}", got,
                    reduce_local(full, RO.SUM)[me * count:(me + 1) * count])

        ck.run(f"{name}: x{count}", tiny)

    def empty_pieces() -> None:
        # Some ranks contribute nothing; the others a few or many elements.
        sizes = [(0 if r % 2 else LARGE + r) if r != n - 1 else 3 for r in range(n)]
        outs = [torch.zeros(s, dtype=torch.int16) for s in sizes]
        dist.all_gather(outs, make(torch.int16, me, (sizes[me],), 84), group=nano)
        for r in range(n):
            ck.same(f"{name}: all_gather empty pieces from {r}", outs[r],
                    make(torch.int16, r, (sizes[r],), 84))
        ins = [make(torch.float32, me * 100 + q, (sizes[q],), 85) for q in range(n)]
        got = torch.zeros(sizes[me])
        dist.reduce_scatter(got, ins, group=nano)
        ck.same(f"{name}: reduce_scatter empty pieces", got,
                reduce_local([make(torch.float32, r * 100 + me, (sizes[me],), 85)
                              for r in range(n)], RO.SUM))

    ck.run(f"{name}: empty pieces", empty_pieces)

    def noncontiguous() -> None:
        base = make(torch.float64, me, (LARGE, 3), 86)
        dist.all_reduce(base[:, 1], group=nano)
        full = [make(torch.float64, r, (LARGE, 3), 86) for r in range(n)]
        ck.same(f"{name}: non-contiguous all_reduce", base[:, 1],
                reduce_local([f[:, 1] for f in full], RO.SUM))
        ck.same(f"{name}: non-contiguous all_reduce leaves the rest", base[:, ::2],
                full[me][:, ::2])

    ck.run(f"{name}: non-contiguous", noncontiguous)


def check_forced_algo(ck: Checks, g: Group, timeout: datetime.timedelta) -> None:
    """NANOCCL_ALGO (here Options(algo=...)) forces a row: ring on the hierarchical topology
    even for large calls, hierarchical even for small ones; on a flat topology, forcing
    hierarchical is a clear error on every rank."""
    me, n = g.me, g.size
    for algo, count in (("ring", LARGE), ("hierarchical", SMALL)):
        nano = dist.new_group(backend="nanoccl", timeout=timeout,
                              pg_options=nanoccl.Options(algo=algo))
        name = f"{g.name} algo={algo}"

        def forced() -> None:
            x = make(torch.int32, me, (count,), 70)
            dist.all_reduce(x, group=nano)
            want = reduce_local([make(torch.int32, r, (count,), 70) for r in range(n)], RO.SUM)
            ck.same(f"{name}: all_reduce x{count}", x, want)
            b = make(torch.float32, me, (count,), 71)
            dist.broadcast(b, group_src=n - 1, group=nano)
            ck.same(f"{name}: broadcast x{count}", b, make(torch.float32, n - 1, (count,), 71))
            algos = nanoccl.stats(nano)["per_algorithm"]
            for op in ("allreduce", "broadcast"):
                ck.expect(f"{name}: {op} ran {algo}", algos.get(f"{op}/{algo}", 0) == 1,
                          str(algos))

        ck.run(name, forced)
        if algo == "hierarchical":
            check_tiny_hierarchical(ck, g, nano)
        dist.destroy_process_group(nano)
    flat = dist.new_group(backend="nanoccl", timeout=timeout,
                          pg_options=nanoccl.Options(algo="hierarchical", node_id="one-node"))
    # A setting that cannot run here: the caller's ValueError, on every rank (all set it).
    msg = expect_error(ck, f"{g.name}: algo=hierarchical on one node",
                       lambda: dist.all_reduce(torch.ones(8), group=flat), [], 10, (ValueError,))
    ck.expect(f"{g.name}: algo=hierarchical on one node says why",
              "hierarchical" in msg and "flat" in msg, msg[:600])
    dist.barrier(group=g.gloo)


def check_mismatch(ck: Checks, g: Group, timeout: datetime.timedelta) -> None:
    """A call that differs on one rank fails on every rank, in time, inside whichever stage of
    the hierarchy meets it first (each case on a fresh group: a failed group stays failed)."""
    me, n = g.me, g.size
    odd = n - 1  # the rank that calls something else
    big = 100_000  # above the default threshold: the hierarchical rows
    cases: list[tuple[str, Callable[[Any], Any]]] = [
        ("count", lambda nano: dist.all_reduce(torch.ones(big + 8 * (me == odd)), group=nano)),
        ("root", lambda nano: dist.broadcast(torch.ones(big), group_src=1 if me == odd else 0,
                                             group=nano)),
        ("op", lambda nano: dist.all_reduce(torch.ones(big), group=nano) if me != odd
         else dist.broadcast(torch.ones(big), group_src=0, group=nano)),
    ]
    for what, call in cases:
        nano = dist.new_group(backend="nanoccl", timeout=timeout)
        # A rank that only exchanged with ranks agreeing with it may finish its part (with a
        # root on its own node, node 0 only sends); the group is then broken: its next call
        # fails.
        msg = expect_error(ck, f"{g.name}: hierarchical call with a different {what} on rank "
                           f"{odd}", lambda: call(nano), [], timeout.total_seconds() + 5,
                           then=lambda: dist.all_reduce(torch.ones(2), group=nano))
        ck.expect(f"{g.name}: different {what}: the message says what differs",
                  "called" in msg or "failed" in msg, msg[:600])
        quiesce(g.gloo)
        dist.destroy_process_group(nano)


def check_default_planner(ck: Checks, g: Group) -> None:
    """With the default threshold (64 KiB), only larger calls take the hierarchical rows."""
    me = g.me

    def count_of(key: str) -> int:
        return int(nanoccl.stats(g.nano)["per_algorithm"].get(key, 0))

    threshold = int(nanoccl.Options.defaults()["small_message_bytes"])
    for count, expect_hier in ((threshold // 4, False), (threshold // 4 + 1, True)):
        before = count_of("allreduce/hierarchical")
        x = make(torch.int32, me, (count,), 4)
        dist.all_reduce(x, group=g.nano)
        want = reduce_local([make(torch.int32, r, (count,), 4) for r in range(g.size)], RO.SUM)
        ck.same(f"{g.name}: all_reduce {count * 4} bytes", x, want)
        hier = count_of("allreduce/hierarchical") - before
        ck.expect(f"{g.name}: {count * 4} bytes hierarchical={expect_hier}",
                  hier == (1 if expect_hier and g.hierarchical else 0),
                  f"{hier} hierarchical calls, per_algorithm "
                  f"{nanoccl.stats(g.nano)['per_algorithm']}")
