"""Scenarios of dist_jobs.py that check nanoccl's results against Gloo's.

collectives: every collective, dtype and reduction (and point-to-point, coalesced calls,
subgroups), on nanoccl and on Gloo with the same inputs; where Gloo lacks the op or dtype the
reference is computed locally from every rank's inputs (each rank can regenerate any rank's
input from its seed). ddp: DDP training on nanoccl and on Gloo ends with the same parameters.
"""

from __future__ import annotations

import argparse
import datetime
import time
from typing import Any

import torch
import torch.distributed as dist

import nanoccl
from job_harness import (
    ALL_TYPES,
    RO,
    Checks,
    applicable,
    gloo_try,
    init,
    make,
    op_name,
    quiesce,
    reduce_local,
    torch_op,
    train_mse,
)


# ---- scenario: every collective against Gloo --------------------------------------------------


def check_allreduce(ck: Checks, nano: Any, gloo: Any, rank: int, world: int) -> None:
    shape = (5, 7)
    for seed, dtype in enumerate(ALL_TYPES):
        for op in (RO.SUM, RO.PRODUCT, RO.MIN, RO.MAX, RO.BAND, RO.BOR, RO.BXOR, RO.AVG, "premul"):
            if not applicable(op, dtype):
                continue
            name = f"all_reduce {dtype} {op_name(op)}"
            kind = "prod" if op == RO.PRODUCT else "sum"
            factor = 0.5 if (dtype.is_floating_point or dtype.is_complex) else 3.0

            def one(op: Any = op, dtype: torch.dtype = dtype, kind: str = kind,
                    factor: float = factor, name: str = name, seed: int = seed) -> None:
                x = make(dtype, rank, shape, seed, kind)
                want = reduce_local([make(dtype, r, shape, seed, kind) for r in range(world)],
                                    op, factor)
                got = x.clone()
                dist.all_reduce(got, op=torch_op(op, factor), group=nano)
                # Dividing by the world size rounds: within float error for AVG.
                ck.same(name, got, want, exact=op != RO.AVG)
                if op not in (RO.AVG, "premul"):  # Gloo has neither
                    ref = x.clone()
                    if gloo_try(lambda: dist.all_reduce(ref, op=op, group=gloo)):
                        ck.same(name + " vs gloo", got, ref)

            ck.run(name, one)
    # Random floats: within reordering error of Gloo's sum.
    for dtype in (torch.float32, torch.float64):
        def rand(dtype: torch.dtype = dtype) -> None:
            x = make(dtype, rank, (1000,), 99, "rand")
            got, ref = x.clone(), x.clone()
            dist.all_reduce(got, group=nano)
            dist.all_reduce(ref, group=gloo)
            ck.same(f"all_reduce {dtype} random", got, ref, exact=False)

        ck.run(f"all_reduce {dtype} random", rand)

    def premul_tensor() -> None:
        x = make(torch.float32, rank, (16,), 7)
        got = x.clone()
        dist.all_reduce(got, op=torch_op("premul", 0.25, tensor_factor=True), group=nano)
        want = reduce_local([make(torch.float32, r, (16,), 7) for r in range(world)], "premul",
                            0.25)
        ck.same("all_reduce premul tensor factor", got, want)

    ck.run("all_reduce premul tensor factor", premul_tensor)

    def large() -> None:
        # Several chunks and stripes: 3 MB.
        x = make(torch.float32, rank, (3 * 1024 * 1024 // 4 + 3,), 5)
        got, ref = x.clone(), x.clone()
        dist.all_reduce(got, group=nano)
        dist.all_reduce(ref, group=gloo)
        ck.same("all_reduce 3 MB", got, ref)

    ck.run("all_reduce 3 MB", large)

    def noncontiguous() -> None:
        base = make(torch.int64, rank, (6, 8), 11)
        view = base[:, ::2]
        want = reduce_local([make(torch.int64, r, (6, 8), 11)[:, ::2] for r in range(world)],
                            RO.SUM)
        dist.all_reduce(view, group=nano)
        ck.same("all_reduce non-contiguous", base[:, ::2], want)
        untouched = make(torch.int64, rank, (6, 8), 11)[:, 1::2]
        ck.same("all_reduce non-contiguous leaves the rest", base[:, 1::2], untouched)

    ck.run("all_reduce non-contiguous", noncontiguous)

    def empty() -> None:
        t = torch.zeros(0)
        dist.all_reduce(t, group=nano)
        ck.expect("all_reduce empty", t.numel() == 0)

    ck.run("all_reduce empty", empty)

    def future() -> None:
        t = torch.full((4,), float(rank + 1))
        work = dist.all_reduce(t, group=nano, async_op=True)
        fut = work.get_future().then(lambda f: f.value()[0] * 2)
        value = fut.wait()
        want = torch.full((4,), float(world * (world + 1)))
        ck.same("all_reduce future", value, want)
        ck.expect("work completed", work.is_completed())
        work.wait()

    ck.run("all_reduce future", future)

    def wait_timeout() -> None:
        # A peer late by 3 s; wait(timeout=1.5 s) gives up with an error, the call completes.
        # The timeout counts from the issue (backend/work_deadline.h): waiting 1.5 s from 2 s
        # after the issue would see the peer join at 3 s and return.
        if world == 1:
            return
        if rank == 0:
            time.sleep(3)
        t = torch.ones(4)
        work = dist.all_reduce(t, group=nano, async_op=True)
        if rank != 0:
            time.sleep(2)
            try:
                work.wait(timeout=datetime.timedelta(seconds=1.5))
                ck.fail("wait(timeout)", "returned: the timeout did not count from the issue")
            except RuntimeError as exc:
                ck.expect("wait(timeout) message", "did not complete" in str(exc)
                          and "counted from its issue" in str(exc), str(exc))
        work.wait()
        ck.same("wait(timeout) then wait()", t, torch.full((4,), float(world)))

    ck.run("wait with a timeout", wait_timeout)


def check_rooted(ck: Checks, nano: Any, gloo: Any, rank: int, world: int) -> None:
    roots = sorted({0, world - 1})
    for seed, dtype in enumerate(ALL_TYPES + [torch.float8_e4m3fn]):
        for root in roots:
            name = f"broadcast {dtype} root {root}"

            def bcast(dtype: torch.dtype = dtype, root: int = root, seed: int = seed,
                      name: str = name) -> None:
                float8 = dtype == torch.float8_e4m3fn  # moved as bytes; compared as bytes
                src_dtype = torch.float32 if float8 else dtype
                want = make(src_dtype, root, (3, 5), seed).to(dtype)
                got = make(src_dtype, rank, (3, 5), seed).to(dtype)
                dist.broadcast(got, src=root, group=nano)
                if float8:
                    got, want = got.view(torch.uint8), want.view(torch.uint8)
                ck.same(name, got, want)
                if not float8:
                    ref = make(src_dtype, rank, (3, 5), seed).to(dtype)
                    if gloo_try(lambda: dist.broadcast(ref, src=root, group=gloo)):
                        ck.same(name + " vs gloo", got, ref)

            ck.run(name, bcast)

    def bcast_noncontiguous() -> None:
        base = make(torch.float32, rank, (4, 6), 3)
        dist.broadcast(base[:, 1::2], src=world - 1, group=nano)
        want = make(torch.float32, world - 1, (4, 6), 3)[:, 1::2]
        ck.same("broadcast non-contiguous", base[:, 1::2], want)
        ck.same("broadcast non-contiguous rest", base[:, ::2],
                make(torch.float32, rank, (4, 6), 3)[:, ::2])

    ck.run("broadcast non-contiguous", bcast_noncontiguous)

    for seed, dtype in enumerate([torch.float32, torch.float16, torch.int64, torch.uint8]):
        for op in (RO.SUM, RO.MAX, RO.PRODUCT):
            for root in roots:
                name = f"reduce {dtype} {op_name(op)} root {root}"

                def red(dtype: torch.dtype = dtype, op: Any = op, root: int = root,
                        seed: int = seed, name: str = name) -> None:
                    kind = "prod" if op == RO.PRODUCT else "sum"
                    x = make(dtype, rank, (9,), seed, kind)
                    got, ref = x.clone(), x.clone()
                    dist.reduce(got, dst=root, op=op, group=nano)
                    dist.reduce(ref, dst=root, op=op, group=gloo)
                    if rank == root:
                        ck.same(name, got, ref)
                        want = reduce_local([make(dtype, r, (9,), seed, kind)
                                             for r in range(world)], op)
                        ck.same(name + " local", got, want)

                ck.run(name, red)

    for seed, dtype in enumerate([torch.float32, torch.int16, torch.bool]):
        for root in roots:
            name = f"gather/scatter {dtype} root {root}"

            def gs(dtype: torch.dtype = dtype, root: int = root, seed: int = seed,
                   name: str = name) -> None:
                x = make(dtype, rank, (2, 3), seed)
                outs = [torch.zeros(2, 3, dtype=dtype) for _ in range(world)] if rank == root \
                    else None
                dist.gather(x, gather_list=outs, dst=root, group=nano)
                if rank == root:
                    assert outs is not None
                    for r in range(world):
                        ck.same(f"{name} gather from {r}", outs[r], make(dtype, r, (2, 3), seed))
                refs = [torch.zeros(2, 3, dtype=dtype) for _ in range(world)] if rank == root \
                    else None
                if gloo_try(lambda: dist.gather(x, gather_list=refs, dst=root, group=gloo)):
                    if rank == root:
                        assert outs is not None and refs is not None
                        for r in range(world):
                            ck.same(f"{name} gather vs gloo {r}", outs[r], refs[r])
                ins = [make(dtype, 100 + r, (4,), seed) for r in range(world)] \
                    if rank == root else None
                got = torch.zeros(4, dtype=dtype)
                dist.scatter(got, scatter_list=ins, src=root, group=nano)
                ck.same(f"{name} scatter", got, make(dtype, 100 + rank, (4,), seed))
                ref = torch.zeros(4, dtype=dtype)
                if gloo_try(lambda: dist.scatter(ref, scatter_list=ins, src=root, group=gloo)):
                    ck.same(f"{name} scatter vs gloo", got, ref)

            ck.run(name, gs)


def check_gathers(ck: Checks, nano: Any, gloo: Any, rank: int, world: int) -> None:
    for seed, dtype in enumerate([torch.float32, torch.float16, torch.bfloat16, torch.int8,
                                  torch.int64, torch.bool, torch.complex64]):
        name = f"all_gather {dtype}"

        def ag(dtype: torch.dtype = dtype, seed: int = seed, name: str = name) -> None:
            x = make(dtype, rank, (3, 4), seed)
            outs = [torch.zeros(3, 4, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, x, group=nano)
            for r in range(world):
                ck.same(f"{name} from {r}", outs[r], make(dtype, r, (3, 4), seed))
            ref = [torch.zeros(3, 4, dtype=dtype) for _ in range(world)]
            if gloo_try(lambda: dist.all_gather(ref, x, group=gloo)):
                for r in range(world):
                    ck.same(f"{name} vs gloo {r}", outs[r], ref[r])
            flat = torch.zeros(world * 3, 4, dtype=dtype)
            dist.all_gather_into_tensor(flat, x, group=nano)
            want = torch.cat([make(dtype, r, (3, 4), seed) for r in range(world)])
            ck.same(f"all_gather_into_tensor {dtype}", flat, want)

        ck.run(name, ag)

    def uneven() -> None:
        x = make(torch.int32, rank, (rank + 1,), 1)
        outs = [torch.zeros(r + 1, dtype=torch.int32) for r in range(world)]
        dist.all_gather(outs, x, group=nano)
        for r in range(world):
            ck.same(f"all_gather uneven from {r}", outs[r], make(torch.int32, r, (r + 1,), 1))

    ck.run("all_gather uneven", uneven)

    def noncontiguous_out() -> None:
        x = make(torch.float64, rank, (4,), 2)
        big = torch.zeros(world, 8, dtype=torch.float64)
        outs = [big[r, ::2] for r in range(world)]
        dist.all_gather(outs, x, group=nano)
        for r in range(world):
            ck.same(f"all_gather non-contiguous out {r}", big[r, ::2],
                    make(torch.float64, r, (4,), 2))
        ck.expect("all_gather non-contiguous out rest", bool((big[:, 1::2] == 0).all()))

    ck.run("all_gather non-contiguous output", noncontiguous_out)

    def float8() -> None:
        x = make(torch.float32, rank, (6,), 4).to(torch.float8_e5m2)
        outs = [torch.zeros(6, dtype=torch.float8_e5m2) for _ in range(world)]
        dist.all_gather(outs, x, group=nano)
        for r in range(world):
            want = make(torch.float32, r, (6,), 4).to(torch.float8_e5m2)
            ck.same(f"all_gather float8 from {r}", outs[r].view(torch.uint8),
                    want.view(torch.uint8))

    ck.run("all_gather float8", float8)

    for seed, dtype in enumerate([torch.float32, torch.float64, torch.bfloat16, torch.int32,
                                  torch.int64]):
        for op in (RO.SUM, RO.MAX, RO.AVG, "premul"):
            if not applicable(op, dtype):
                continue
            name = f"reduce_scatter {dtype} {op_name(op)}"

            def rs(dtype: torch.dtype = dtype, op: Any = op, seed: int = seed,
                   name: str = name) -> None:
                factor = 0.5 if dtype.is_floating_point else 2.0
                ins = [make(dtype, rank, (5,), seed * 31 + r) for r in range(world)]
                want = reduce_local([make(dtype, q, (5,), seed * 31 + rank) for q in
                                     range(world)], op, factor)
                got = torch.zeros(5, dtype=dtype)
                dist.reduce_scatter(got, ins, op=torch_op(op, factor), group=nano)
                ck.same(name, got, want, exact=op != RO.AVG)
                flat_in = torch.cat(ins)
                got2 = torch.zeros(5, dtype=dtype)
                dist.reduce_scatter_tensor(got2, flat_in, op=torch_op(op, factor), group=nano)
                ck.same(f"reduce_scatter_tensor {dtype} {op_name(op)}", got2, want,
                        exact=op != RO.AVG)
                if op in (RO.SUM, RO.MAX):
                    ref = torch.zeros(5, dtype=dtype)
                    if gloo_try(lambda: dist.reduce_scatter_tensor(ref, flat_in.clone(), op=op,
                                                                   group=gloo)):
                        ck.same(name + " vs gloo", got2, ref)

            ck.run(name, rs)


def check_alltoall(ck: Checks, nano: Any, gloo: Any, rank: int, world: int) -> None:
    for seed, dtype in enumerate([torch.float32, torch.int64, torch.bool, torch.float16]):
        name = f"all_to_all {dtype}"

        def a2a(dtype: torch.dtype = dtype, seed: int = seed, name: str = name) -> None:
            ins = [make(dtype, rank * 100 + r, (r + 2,), seed) for r in range(world)]
            outs = [torch.zeros(rank + 2, dtype=dtype) for _ in range(world)]
            dist.all_to_all(outs, ins, group=nano)
            for r in range(world):
                ck.same(f"{name} from {r}", outs[r], make(dtype, r * 100 + rank, (rank + 2,),
                                                           seed))
            x = make(dtype, rank, (world * 3, 2), seed)
            got = torch.zeros(world * 3, 2, dtype=dtype)
            dist.all_to_all_single(got, x, group=nano)
            want = torch.cat([make(dtype, r, (world * 3, 2), seed)[rank * 3:(rank + 1) * 3]
                              for r in range(world)])
            ck.same(f"all_to_all_single {dtype}", got, want)
            ref = torch.zeros(world * 3, 2, dtype=dtype)
            if gloo_try(lambda: dist.all_to_all_single(ref, x.clone(), group=gloo)):
                ck.same(f"all_to_all_single {dtype} vs gloo", got, ref)

        ck.run(name, a2a)

    def uneven() -> None:
        # Rank r sends (r + q + 1) rows to rank q.
        in_splits = [rank + q + 1 for q in range(world)]
        out_splits = [q + rank + 1 for q in range(world)]
        x = make(torch.float64, rank, (sum(in_splits), 3), 8)
        got = torch.zeros(sum(out_splits), 3, dtype=torch.float64)
        dist.all_to_all_single(got, x, out_splits, in_splits, group=nano)
        parts = []
        for q in range(world):
            src = make(torch.float64, q, (sum(q + p + 1 for p in range(world)), 3), 8)
            start = sum(q + p + 1 for p in range(rank))
            parts.append(src[start:start + q + rank + 1])
        ck.same("all_to_all_single uneven", got, torch.cat(parts))

    ck.run("all_to_all_single uneven", uneven)


def check_p2p(ck: Checks, nano: Any, rank: int, world: int) -> None:
    if world == 1:
        return

    def ring() -> None:
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        x = make(torch.float32, rank, (1000,), 3)
        got = torch.zeros(1000)
        if rank % 2 == 0:
            dist.send(x, dst=nxt, group=nano)
            dist.recv(got, src=prv, group=nano)
        else:
            dist.recv(got, src=prv, group=nano)
            dist.send(x, dst=nxt, group=nano)
        ck.same("send/recv ring", got, make(torch.float32, prv, (1000,), 3))
        got2 = torch.zeros(1000)
        reqs = [dist.irecv(got2, src=prv, group=nano), dist.isend(x, dst=nxt, group=nano)]
        for r in reqs:
            r.wait()
        ck.same("irecv/isend ring", got2, make(torch.float32, prv, (1000,), 3))
        got3 = torch.zeros(1000)
        ops = [dist.P2POp(dist.isend, x, nxt, group=nano),
               dist.P2POp(dist.irecv, got3, prv, group=nano)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
        ck.same("batch_isend_irecv ring", got3, make(torch.float32, prv, (1000,), 3))
        # Tags keep messages apart.
        a, b = torch.zeros(4), torch.zeros(4)
        if rank == 0:
            dist.send(torch.full((4,), 1.0), dst=1, tag=7, group=nano)
            dist.send(torch.full((4,), 2.0), dst=1, tag=8, group=nano)
        elif rank == 1:
            rb = dist.irecv(b, src=0, tag=8, group=nano)
            ra = dist.irecv(a, src=0, tag=7, group=nano)
            ra.wait()
            rb.wait()
            ck.expect("tags", bool((a == 1).all() and (b == 2).all()), f"{a} {b}")

    ck.run("p2p ring", ring)

    def any_source() -> None:
        if rank == 0:
            seen = []
            for _ in range(world - 1):
                t = torch.zeros(3)
                src = dist.recv(t, group=nano)
                seen.append(src)
                ck.same(f"recv any source from {src}", t, torch.full((3,), float(src)))
            ck.expect("recv any source senders", sorted(seen) == list(range(1, world)),
                      str(seen))
        else:
            dist.send(torch.full((3,), float(rank)), dst=0, group=nano)

    ck.run("recv any source", any_source)


def check_coalesced(ck: Checks, nano: Any, rank: int, world: int) -> None:
    def coalesced() -> None:
        ts = [make(torch.float32, rank, (n,), n) for n in (3, 17, 1)]
        with dist._coalescing_manager(group=nano, async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t, group=nano)
        cm.wait()
        for n, t in zip((3, 17, 1), ts):
            want = reduce_local([make(torch.float32, r, (n,), n) for r in range(world)], RO.SUM)
            ck.same(f"coalesced all_reduce {n}", t, want)
        ins = [make(torch.int64, rank, (n,), n) for n in (2, 5)]
        outs = [torch.zeros(world * n, dtype=torch.int64) for n in (2, 5)]
        with dist._coalescing_manager(group=nano, async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i, group=nano)
        cm.wait()
        for n, o in zip((2, 5), outs):
            want = torch.cat([make(torch.int64, r, (n,), n) for r in range(world)])
            ck.same(f"coalesced all_gather_into_tensor {n}", o, want)
        ins = [make(torch.float64, rank, (world * n,), n) for n in (2, 3)]
        outs = [torch.zeros(n, dtype=torch.float64) for n in (2, 3)]
        with dist._coalescing_manager(group=nano, async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i, group=nano)
        cm.wait()
        for n, o in zip((2, 3), outs):
            full = reduce_local([make(torch.float64, r, (world * n,), n) for r in range(world)],
                                RO.SUM)
            ck.same(f"coalesced reduce_scatter_tensor {n}", o, full[rank * n:(rank + 1) * n])

    ck.run("coalesced", coalesced)

    def legacy_coalesced() -> None:
        ins = [make(torch.float32, rank, (2,), 1), make(torch.float32, rank, (3,), 2)]
        outs = [[torch.zeros(2), torch.zeros(3)] for _ in range(world)]
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist.all_gather_coalesced(outs, ins, group=nano)
            ts = [make(torch.float32, rank, (4,), 3), make(torch.float32, rank, (2,), 4)]
            dist.all_reduce_coalesced(ts, group=nano)
        for r in range(world):
            ck.same(f"all_gather_coalesced {r}.0", outs[r][0], make(torch.float32, r, (2,), 1))
            ck.same(f"all_gather_coalesced {r}.1", outs[r][1], make(torch.float32, r, (3,), 2))
        for n, seed, t in ((4, 3, ts[0]), (2, 4, ts[1])):
            want = reduce_local([make(torch.float32, r, (n,), seed) for r in range(world)],
                                RO.SUM)
            ck.same(f"all_reduce_coalesced {n}", t, want)

    ck.run("legacy coalesced", legacy_coalesced)

    def barrier() -> None:
        dist.barrier(group=nano)
        ck.expect("barrier", True)

    ck.run("barrier", barrier)


def check_subgroups(ck: Checks, rank: int, world: int) -> None:
    # Every rank takes part in creating every group (torch's rule), members use them.
    specs = [[0, world - 1], list(range(1, world))]
    groups = []
    for ranks in specs:
        groups.append((ranks, dist.new_group(ranks), dist.new_group(ranks, backend="gloo")))
    for ranks, nano, gloo in groups:
        if rank not in ranks:
            continue
        name = f"subgroup {ranks}"
        me = ranks.index(rank)

        def sub(ranks: list[int] = ranks, nano: Any = nano, gloo: Any = gloo, name: str = name,
                me: int = me) -> None:
            x = make(torch.float32, rank, (10,), 21)
            got, ref = x.clone(), x.clone()
            dist.all_reduce(got, group=nano)
            dist.all_reduce(ref, group=gloo)
            ck.same(f"{name} all_reduce", got, ref)
            ck.same(f"{name} all_reduce local", got,
                    reduce_local([make(torch.float32, r, (10,), 21) for r in ranks], RO.SUM))
            b = make(torch.int64, rank, (3,), 22)
            dist.broadcast(b, group_src=len(ranks) - 1, group=nano)
            ck.same(f"{name} broadcast", b, make(torch.int64, ranks[-1], (3,), 22))
            outs = [torch.zeros(2, dtype=torch.int32) for _ in ranks]
            dist.all_gather(outs, make(torch.int32, rank, (2,), 23), group=nano)
            for i, r in enumerate(ranks):
                ck.same(f"{name} all_gather {r}", outs[i], make(torch.int32, r, (2,), 23))
            if len(ranks) > 1:
                nxt = ranks[(me + 1) % len(ranks)]
                prv = ranks[(me - 1) % len(ranks)]
                got_p2p = torch.zeros(5)
                reqs = [dist.isend(torch.full((5,), float(rank)), dst=nxt, group=nano),
                        dist.irecv(got_p2p, src=prv, group=nano)]
                for r in reqs:
                    r.wait()
                ck.same(f"{name} p2p (global ranks)", got_p2p, torch.full((5,), float(prv)))
            ck.expect(f"{name} stats", nanoccl.stats(nano)["size"] == len(ranks))

        ck.run(name, sub)
    ck.expect("subgroups distinct comm ids",
              len({nanoccl.get_backend(n).comm_id for rr, n, _ in groups if rank in rr}) ==
              sum(1 for rr, _, _ in groups if rank in rr))


def scenario_collectives(a: argparse.Namespace, ck: Checks) -> None:
    init(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    nano = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    check_allreduce(ck, nano, gloo, rank, world)
    check_rooted(ck, nano, gloo, rank, world)
    check_gathers(ck, nano, gloo, rank, world)
    check_alltoall(ck, nano, gloo, rank, world)
    check_p2p(ck, nano, rank, world)
    check_coalesced(ck, nano, rank, world)
    if world >= 3:
        check_subgroups(ck, rank, world)
    ck.data["stats"] = nanoccl.stats()
    dist.barrier()
    quiesce(gloo)
    dist.destroy_process_group()


# ---- scenario: DDP against Gloo --------------------------------------------------------------


def scenario_ddp(a: argparse.Namespace, ck: Checks) -> None:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    init(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(),
                             nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    runs: dict[str, tuple[nn.Module, list[float]]] = {}
    for name, group in (("nanoccl", dist.group.WORLD), ("gloo", gloo)):
        net = DDP(model(), process_group=group, bucket_cap_mb=0.01)  # several buckets
        runs[name] = (net.module, train_mse(net, rank, steps=20, batch=32, inputs=16, outputs=4))
    worst = 0.0
    for (pn, pa), (_, pb) in zip(runs["nanoccl"][0].state_dict().items(),
                                 runs["gloo"][0].state_dict().items()):
        if pa.is_floating_point():
            diff = float((pa - pb).abs().max()) if pa.numel() else 0.0
            worst = max(worst, diff)
            ck.expect(f"ddp param {pn}", diff <= 1e-4, f"max abs diff {diff}")
    ck.data["max_param_diff"] = worst
    ck.data["final_loss"] = {k: v[1][-1] for k, v in runs.items()}
    # Replicas stay identical across ranks.
    flat = torch.cat([p.detach().reshape(-1) for p in runs["nanoccl"][0].parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    ck.same("ddp replicas identical", flat, ref)
    quiesce(gloo)
    dist.destroy_process_group()
