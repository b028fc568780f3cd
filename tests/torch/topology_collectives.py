"""The topology tests' group under test and its collective checks (used by topology_jobs.py).

Group (a nanoccl group and its Gloo twin, with a node id per rank), the sizes the checks use
(LOW_THRESHOLD, SMALL, LARGE, CHUNK), --group parsing, and one check per collective: every
dtype, reduction and root, small and large calls, against local references and Gloo; then
point-to-point, barrier and calls in flight together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from job_harness import (
    ALL_TYPES,
    RO,
    Checks,
    applicable,
    gloo_try,
    make,
    op_name,
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
