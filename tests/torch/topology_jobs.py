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
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import job_harness
import nanoccl
from job_harness import (
    ALL_TYPES,
    RO,
    Checks,
    applicable,
    expect_error,
    gloo_try,
    make,
    op_name,
    quiesce,
    reduce_local,
    torch_op,
)

# Above this many bytes the planner may pick the hierarchical algorithms (the groups of
# --group set it; the default group keeps the 64 KiB default). Small, so that every dtype
# reaches the hierarchical rows without moving much on a 2-core machine.
LOW_THRESHOLD = 4096
# Elements of the "large" calls: more bytes than LOW_THRESHOLD in every dtype (1-byte types
# included), and odd, so that shards and ring segments are uneven.
LARGE = LOW_THRESHOLD + 3
SMALL = 37
# The chunk size of the rings in those groups: the large calls span several chunks.
CHUNK = 4096
ALL_OPS = (RO.SUM, RO.PRODUCT, RO.MIN, RO.MAX, RO.BAND, RO.BOR, RO.BXOR, RO.AVG, "premul")
HIERARCHICAL_OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter")


@dataclass
class Group:
    """One nanoccl group under test, with its Gloo twin (same members) for the references."""

    name: str
    ranks: list[int]  # global ranks, in group-rank order
    ids: list[str]  # node id per group rank
    nano: Any
    gloo: Any
    forced: Any = None  # the same topology with algo=hierarchical, if it is hierarchical

    @property
    def me(self) -> int:
        return self.ranks.index(dist.get_rank())

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def nodes(self) -> dict[str, list[int]]:
        """Group ranks per node id, in the order the nodes first appear."""
        out: dict[str, list[int]] = {}
        for r, i in enumerate(self.ids):
            out.setdefault(i, []).append(r)
        return out

    @property
    def hierarchical(self) -> bool:
        """What Topology::hierarchical() says: several nodes, one with several ranks."""
        nodes = self.nodes
        return len(nodes) > 1 and max(len(v) for v in nodes.values()) > 1


def parse_group(spec: str) -> tuple[str, list[int], list[str]]:
    """NAME=RANKS:IDS, e.g. "2+1=0,1,2:a,a,b"."""
    name, rest = spec.split("=", 1)
    ranks, ids = rest.split(":", 1)
    rank_list = [int(r) for r in ranks.split(",")]
    id_list = ids.split(",")
    if len(rank_list) != len(id_list):
        raise ValueError(f"--group {spec}: {len(rank_list)} ranks but {len(id_list)} node ids")
    return name, rank_list, id_list


def factor_for(dtype: torch.dtype) -> float:
    return 0.5 if (dtype.is_floating_point or dtype.is_complex) else 3.0


def gather_objects(obj: Any, gloo: Any, size: int) -> list[Any]:
    out: list[Any] = [None] * size
    dist.all_gather_object(out, obj, group=gloo)
    return out


# ---- the collectives, every dtype, small and large --------------------------------------------
# Each case is a closure that Checks.run calls at once, inside its loop iteration, so it may
# use the loop's variables.


def check_allreduce(ck: Checks, g: Group) -> None:
    me, n = g.me, g.size
    for seed, dtype in enumerate(ALL_TYPES):
        for count in (SMALL, LARGE):
            for op in ALL_OPS:
                if not applicable(op, dtype):
                    continue
                name = f"{g.name}: all_reduce {dtype} {op_name(op)} x{count}"

                def one() -> None:
                    kind = "prod" if op == RO.PRODUCT else "sum"
                    factor = factor_for(dtype)
                    x = make(dtype, me, (count,), seed, kind)
                    want = reduce_local([make(dtype, r, (count,), seed, kind) for r in range(n)],
                                        op, factor)
                    got = x.clone()
                    dist.all_reduce(got, op=torch_op(op, factor), group=g.nano)
                    # Small integers: sums and products are exact in any order; AVG divides.
                    ck.same(name, got, want, exact=op != RO.AVG)
                    if op not in (RO.AVG, "premul"):  # Gloo has neither
                        ref = x.clone()
                        if gloo_try(lambda: dist.all_reduce(ref, op=op, group=g.gloo)):
                            ck.same(name + " vs gloo", got, ref)

                ck.run(name, one)
    # Random floats: the hierarchy sums in another order than Gloo; within rounding error.
    for dtype in (torch.float32, torch.float64):
        name = f"{g.name}: all_reduce {dtype} random"

        def rand() -> None:
            x = make(dtype, me, (3 * LARGE,), 99, "rand")
            got, ref = x.clone(), x.clone()
            dist.all_reduce(got, group=g.nano)
            dist.all_reduce(ref, group=g.gloo)
            ck.same(name + " vs gloo", got, ref, exact=False)
            # Every rank holds the same bits (each shard is reduced once, then copied).
            first = got.clone()
            dist.broadcast(first, group_src=0, group=g.gloo)
            ck.same(name + " identical on every rank", got, first)

        ck.run(name, rand)

    def premul_tensor() -> None:
        x = make(torch.float32, me, (LARGE,), 7)
        got = x.clone()
        dist.all_reduce(got, op=torch_op("premul", 0.25, tensor_factor=True), group=g.nano)
        want = reduce_local([make(torch.float32, r, (LARGE,), 7) for r in range(n)], "premul",
                            0.25)
        ck.same(f"{g.name}: all_reduce premul tensor factor", got, want)

    ck.run(f"{g.name}: all_reduce premul tensor factor", premul_tensor)


def check_reduce(ck: Checks, g: Group) -> None:
    me, n = g.me, g.size
    for seed, dtype in enumerate(ALL_TYPES):
        for op in (RO.SUM, RO.MAX, RO.PRODUCT, RO.BXOR):
            if not applicable(op, dtype):
                continue
            for count in (SMALL, LARGE):
                root = (seed + count) % n
                name = f"{g.name}: reduce {dtype} {op_name(op)} x{count} root {root}"

                def red() -> None:
                    kind = "prod" if op == RO.PRODUCT else "sum"
                    x = make(dtype, me, (count,), seed, kind)
                    got = x.clone()
                    dist.reduce(got, group_dst=root, op=op, group=g.nano)
                    ref = x.clone()
                    gloo_ok = gloo_try(lambda: dist.reduce(ref, group_dst=root, op=op,
                                                           group=g.gloo))
                    if me == root:
                        want = reduce_local([make(dtype, r, (count,), seed, kind)
                                             for r in range(n)], op)
                        ck.same(name, got, want)
                        if gloo_ok:
                            ck.same(name + " vs gloo", got, ref)

                ck.run(name, red)


def check_broadcast(ck: Checks, g: Group) -> None:
    me, n = g.me, g.size
    roots = sorted({0, n // 2, n - 1})
    for seed, dtype in enumerate(ALL_TYPES + [torch.float8_e4m3fn]):
        for count in (SMALL, LARGE):
            for root in roots:
                name = f"{g.name}: broadcast {dtype} x{count} root {root}"

                def bcast() -> None:
                    float8 = dtype == torch.float8_e4m3fn  # moved as bytes, compared as bytes
                    src_dtype = torch.float32 if float8 else dtype
                    want = make(src_dtype, root, (count,), seed).to(dtype)
                    got = make(src_dtype, me, (count,), seed).to(dtype)
                    dist.broadcast(got, group_src=root, group=g.nano)
                    if float8:
                        ck.same(name, got.view(torch.uint8), want.view(torch.uint8))
                        return
                    ck.same(name, got, want)
                    ref = make(src_dtype, me, (count,), seed).to(dtype)
                    if gloo_try(lambda: dist.broadcast(ref, group_src=root, group=g.gloo)):
                        ck.same(name + " vs gloo", got, ref)

                ck.run(name, bcast)


def check_allgather(ck: Checks, g: Group) -> None:
    me, n = g.me, g.size
    for seed, dtype in enumerate(ALL_TYPES):
        for count in (SMALL, LARGE):
            name = f"{g.name}: all_gather {dtype} x{count}"

            def ag() -> None:
                x = make(dtype, me, (count,), seed)
                outs = [torch.zeros(count, dtype=dtype) for _ in range(n)]
                dist.all_gather(outs, x, group=g.nano)
                for r in range(n):
                    ck.same(f"{name} from {r}", outs[r], make(dtype, r, (count,), seed))
                refs = [torch.zeros(count, dtype=dtype) for _ in range(n)]
                if gloo_try(lambda: dist.all_gather(refs, x, group=g.gloo)):
                    for r in range(n):
                        ck.same(f"{name} vs gloo {r}", outs[r], refs[r])
                flat = torch.zeros(n * count, dtype=dtype)
                dist.all_gather_into_tensor(flat, x, group=g.nano)
                ck.same(f"{name} into_tensor", flat,
                        torch.cat([make(dtype, r, (count,), seed) for r in range(n)]))
                # Uneven pieces: rank r contributes count + 7r elements.
                sizes = [count + 7 * r for r in range(n)]
                y = make(dtype, 50 + me, (sizes[me],), seed)
                uneven = [torch.zeros(s, dtype=dtype) for s in sizes]
                dist.all_gather(uneven, y, group=g.nano)
                for r in range(n):
                    ck.same(f"{name} uneven from {r}", uneven[r],
                            make(dtype, 50 + r, (sizes[r],), seed))

            ck.run(name, ag)


def check_reduce_scatter(ck: Checks, g: Group) -> None:
    me, n = g.me, g.size
    for seed, dtype in enumerate(ALL_TYPES):
        for count in (SMALL, LARGE):
            # Every op on the large calls (the hierarchical plan), SUM on the small ones.
            for op in ALL_OPS if count == LARGE else (RO.SUM,):
                if not applicable(op, dtype):
                    continue
                name = f"{g.name}: reduce_scatter {dtype} {op_name(op)} x{count}"

                def rs() -> None:
                    kind = "prod" if op == RO.PRODUCT else "sum"
                    factor = factor_for(dtype)
                    full = [make(dtype, r, (n * count,), seed, kind) for r in range(n)]
                    want = reduce_local(full, op, factor)[me * count:(me + 1) * count]
                    got = torch.zeros(count, dtype=dtype)
                    dist.reduce_scatter_tensor(got, full[me].clone(), op=torch_op(op, factor),
                                               group=g.nano)
                    ck.same(name, got, want, exact=op != RO.AVG)
                    if op not in (RO.AVG, "premul"):
                        ref = torch.zeros(count, dtype=dtype)
                        if gloo_try(lambda: dist.reduce_scatter_tensor(
                                ref, full[me].clone(), op=op, group=g.gloo)):
                            ck.same(name + " vs gloo", got, ref)

                ck.run(name, rs)
        # The list form with uneven pieces: rank q receives count + 5q elements.
        name = f"{g.name}: reduce_scatter {dtype} uneven"

        def rs_uneven() -> None:
            sizes = [LARGE + 5 * q for q in range(n)]
            ins = [make(dtype, me * 100 + q, (sizes[q],), seed) for q in range(n)]
            got = torch.zeros(sizes[me], dtype=dtype)
            dist.reduce_scatter(got, ins, group=g.nano)
            want = reduce_local([make(dtype, r * 100 + me, (sizes[me],), seed)
                                 for r in range(n)], RO.SUM)
            ck.same(name, got, want)

        ck.run(name, rs_uneven)


def check_alltoall(ck: Checks, g: Group) -> None:
    me, n = g.me, g.size
    for seed, dtype in enumerate(ALL_TYPES + [torch.float8_e5m2]):
        name = f"{g.name}: all_to_all {dtype}"

        def a2a() -> None:
            float8 = dtype == torch.float8_e5m2
            src_dtype = torch.float32 if float8 else dtype

            def mk(who: int, shape: tuple[int, ...]) -> torch.Tensor:
                return make(src_dtype, who, shape, seed).to(dtype)

            def same(what: str, a: torch.Tensor, b: torch.Tensor) -> None:
                if float8:
                    a, b = a.view(torch.uint8), b.view(torch.uint8)
                ck.same(what, a, b)

            # Uneven: rank r sends r + q + 2 elements to rank q.
            ins = [mk(me * 100 + q, (me + q + 2,)) for q in range(n)]
            outs = [torch.zeros(q + me + 2, dtype=dtype) for q in range(n)]
            dist.all_to_all(outs, ins, group=g.nano)
            for q in range(n):
                same(f"{name} from {q}", outs[q], mk(q * 100 + me, (q + me + 2,)))
            rows = 3 if dtype != torch.float32 else LARGE // n  # one large call
            x = mk(me, (n * rows, 2))
            got = torch.zeros(n * rows, 2, dtype=dtype)
            dist.all_to_all_single(got, x, group=g.nano)
            want = torch.cat([mk(q, (n * rows, 2))[me * rows:(me + 1) * rows] for q in range(n)])
            same(f"all_to_all_single {name}", got, want)
            if not float8:
                ref = torch.zeros(n * rows, 2, dtype=dtype)
                if gloo_try(lambda: dist.all_to_all_single(ref, x.clone(), group=g.gloo)):
                    ck.same(f"all_to_all_single {name} vs gloo", got, ref)

        ck.run(name, a2a)


def check_gather_scatter(ck: Checks, g: Group) -> None:
    me, n = g.me, g.size
    for seed, dtype in enumerate(ALL_TYPES):
        for root in sorted({0, n - 1}):
            name = f"{g.name}: gather/scatter {dtype} root {root}"

            def gs() -> None:
                x = make(dtype, me, (2, 5), seed)
                outs = [torch.zeros(2, 5, dtype=dtype) for _ in range(n)] if me == root else None
                dist.gather(x, gather_list=outs, group_dst=root, group=g.nano)
                refs = [torch.zeros(2, 5, dtype=dtype) for _ in range(n)] if me == root else None
                gloo_ok = gloo_try(lambda: dist.gather(x, gather_list=refs, group_dst=root,
                                                       group=g.gloo))
                if me == root:
                    assert outs is not None and refs is not None
                    for r in range(n):
                        ck.same(f"{name} gather from {r}", outs[r], make(dtype, r, (2, 5), seed))
                        if gloo_ok:
                            ck.same(f"{name} gather vs gloo {r}", outs[r], refs[r])
                ins = [make(dtype, 100 + r, (7,), seed) for r in range(n)] if me == root \
                    else None
                got = torch.zeros(7, dtype=dtype)
                dist.scatter(got, scatter_list=ins, group_src=root, group=g.nano)
                ck.same(f"{name} scatter", got, make(dtype, 100 + me, (7,), seed))
                ref = torch.zeros(7, dtype=dtype)
                if gloo_try(lambda: dist.scatter(ref, scatter_list=ins, group_src=root,
                                                 group=g.gloo)):
                    ck.same(f"{name} scatter vs gloo", got, ref)

            ck.run(name, gs)


def check_p2p_barrier(ck: Checks, g: Group) -> None:
    me, n = g.me, g.size

    def all_pairs() -> None:
        # Every ordered pair, inside and across nodes, small and large, all in flight at once.
        for count in (SMALL, LARGE):
            reqs, got = [], {}
            for q in range(n):
                if q == me:
                    continue
                got[q] = torch.zeros(count, dtype=torch.float64)
                reqs.append(dist.irecv(got[q], group_src=q, group=g.nano))
                reqs.append(dist.isend(make(torch.float64, me * 100 + q, (count,), 5),
                                       group_dst=q, group=g.nano))
            for r in reqs:
                r.wait()
            for q, t in got.items():
                ck.same(f"{g.name}: isend/irecv x{count} from {q}", t,
                        make(torch.float64, q * 100 + me, (count,), 5))

    ck.run(f"{g.name}: isend/irecv all pairs", all_pairs)

    def ring() -> None:
        nxt, prv = (me + 1) % n, (me - 1) % n
        for seed, dtype in enumerate(ALL_TYPES):
            x = make(dtype, me, (SMALL,), seed)
            got = torch.zeros(SMALL, dtype=dtype)
            if me % 2 == 0:
                dist.send(x, group_dst=nxt, group=g.nano)
                dist.recv(got, group_src=prv, group=g.nano)
            else:
                dist.recv(got, group_src=prv, group=g.nano)
                dist.send(x, group_dst=nxt, group=g.nano)
            ck.same(f"{g.name}: send/recv ring {dtype}", got, make(dtype, prv, (SMALL,), seed))
        got = torch.zeros(LARGE)
        ops = [dist.P2POp(dist.isend, make(torch.float32, me, (LARGE,), 1), group=g.nano,
                          group_peer=nxt),
               dist.P2POp(dist.irecv, got, group=g.nano, group_peer=prv)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
        ck.same(f"{g.name}: batch_isend_irecv ring", got, make(torch.float32, prv, (LARGE,), 1))

    ck.run(f"{g.name}: send/recv ring", ring)

    def barrier() -> None:
        for _ in range(3):
            dist.barrier(group=g.nano)
        ck.expect(f"{g.name}: barrier", True)

    ck.run(f"{g.name}: barrier", barrier)


def check_async(ck: Checks, g: Group) -> None:
    """Several calls of different kinds in flight at once, waited for in another order."""
    me, n = g.me, g.size

    def in_flight() -> None:
        xs = [make(dtype, me, (LARGE,), 60 + i)
              for i, dtype in enumerate((torch.float32, torch.int64, torch.bfloat16))]
        works = [dist.all_reduce(x, group=g.nano, async_op=True) for x in xs]
        b = make(torch.int16, me, (LARGE,), 64)
        works.append(dist.broadcast(b, group_src=n - 1, group=g.nano, async_op=True))
        flat = torch.zeros(n * LARGE, dtype=torch.uint8)
        works.append(dist.all_gather_into_tensor(flat, make(torch.uint8, me, (LARGE,), 65),
                                                 group=g.nano, async_op=True))
        small = make(torch.float64, me, (SMALL,), 66)
        works.append(dist.all_reduce(small, group=g.nano, async_op=True))
        for w in reversed(works):
            w.wait()
        for i, (x, dtype) in enumerate(zip(xs, (torch.float32, torch.int64, torch.bfloat16))):
            want = reduce_local([make(dtype, r, (LARGE,), 60 + i) for r in range(n)], RO.SUM)
            ck.same(f"{g.name}: async all_reduce {dtype}", x, want)
        ck.same(f"{g.name}: async broadcast", b, make(torch.int16, n - 1, (LARGE,), 64))
        ck.same(f"{g.name}: async all_gather", flat,
                torch.cat([make(torch.uint8, r, (LARGE,), 65) for r in range(n)]))
        ck.same(f"{g.name}: async small all_reduce", small,
                reduce_local([make(torch.float64, r, (SMALL,), 66) for r in range(n)], RO.SUM))

    ck.run(f"{g.name}: calls in flight together", in_flight)


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
    alone = len(g.nodes[my_node]) == 1
    single_node = len(g.nodes) == 1
    if single_node:
        ck.expect(f"{g.name}: one node: nothing inter-node",
                  links["inter-node"]["bytes_sent"] == 0 and
                  links["inter-node"]["bytes_received"] == 0, str(links))
    else:
        ck.expect(f"{g.name}: inter-node bytes", links["inter-node"]["bytes_sent"] > 0,
                  str(links))
    if alone:
        ck.expect(f"{g.name}: one-rank node: nothing intra-node",
                  links["intra-node"]["bytes_sent"] == 0 and
                  links["intra-node"]["bytes_received"] == 0, str(links))
    else:
        ck.expect(f"{g.name}: intra-node bytes", links["intra-node"]["bytes_sent"] > 0,
                  str(links))
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
    msg = expect_error(ck, f"{g.name}: algo=hierarchical on one node",
                       lambda: dist.all_reduce(torch.ones(8), group=flat), [], 10)
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

    Armed, it waits, after this rank publishes its shared-memory segment in an intra-node
    group, until every rank of every node has published its own (so every rank's listen(),
    which removes stale segments, has run), then SIGKILLs its own process: its segment is
    left behind in /dev/shm, which only the next run may clean.
    """

    ADDR = re.compile(r"^(.*)/local/(\d+)/addr/(\d+)$")

    def __init__(self, inner: dist.Store, local_keys: list[tuple[int, int]], timeout: float):
        super().__init__()
        self.inner = inner
        self.local_keys = local_keys  # (node index, local rank) of every intra-node rank
        self.wait_s = timeout
        self.armed = False

    def set(self, key: str, value: Any) -> None:
        self.inner.set(key, value)
        match = self.ADDR.match(key)
        if not (self.armed and match):
            return
        prefix = match.group(1)
        keys = [f"{prefix}/local/{node}/addr/{lr}" for node, lr in self.local_keys]
        self.inner.wait(keys, datetime.timedelta(seconds=self.wait_s))
        name = value.decode() if isinstance(value, bytes) else str(value)
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


def local_keys_of(ids: list[str]) -> list[tuple[int, int]]:
    """(node index, local rank) of the ranks of multi-rank nodes, as Topology numbers them
    (nodes in the order of their lowest rank)."""
    sizes: dict[str, int] = {}
    for i in ids:
        sizes[i] = sizes.get(i, 0) + 1
    return [(node, lr) for node, n in enumerate(sizes.values()) if n > 1 for lr in range(n)]


def scenario_killed_in_shm(a: argparse.Namespace, ck: Checks) -> None:
    rank, world = a.rank, a.world_size
    ids = a.ids.split(",")
    victim = a.victim
    inner = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          rank == 0, timeout=datetime.timedelta(seconds=a.pg_timeout + 30))
    store = KillingStore(inner, local_keys_of(ids), a.pg_timeout)
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
        # Its node peer maps the dead rank's segment and finds its creator gone.
        ck.expect("the node peer names the dead rank's pid",
                  f"pid {pids[victim]}" in msg and "died" in msg, msg[:600])
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


SCENARIOS: dict[str, Callable[[argparse.Namespace, Checks], None]] = {
    "topologies": scenario_topologies,
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
