"""Rank programs of the torch.distributed tests (conftest.run_job starts one per rank).

    python dist_jobs.py SCENARIO --rank R --world-size N --init-method URL --result FILE

Each scenario runs many checks in one process group setup and writes
{"failures": [...], "checks": n, ...} to FILE; a check that fails is recorded, not raised, so
that one job reports every problem at once. Collectives run on nanoccl and on Gloo with the same
inputs; where Gloo lacks the op or dtype the reference is computed locally from every rank's
inputs (each rank can regenerate any rank's input from its seed).
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import nanoccl

RO = dist.ReduceOp

INT_TYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
FLOAT_TYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
COMPLEX_TYPES = [torch.complex64, torch.complex128]
ALL_TYPES = FLOAT_TYPES + INT_TYPES + [torch.bool] + COMPLEX_TYPES


class Checks:
    """Collects failed checks instead of stopping at the first."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list[str] = []
        self.count = 0
        self.data: dict[str, Any] = {}

    def fail(self, name: str, why: str) -> None:
        self.failures.append(f"{name}: {why}")

    def expect(self, name: str, ok: bool, why: str = "") -> None:
        self.count += 1
        if not ok:
            self.fail(name, why or "check failed")

    def same(self, name: str, got: torch.Tensor, want: torch.Tensor, exact: bool = True) -> None:
        self.count += 1
        try:
            if got.dtype != want.dtype or got.shape != want.shape:
                raise AssertionError(
                    f"got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
                )
            if exact or not (got.is_floating_point() or got.is_complex()):
                if not torch.equal(got, want):
                    raise AssertionError(f"got {short(got)}, want {short(want)}")
            else:
                torch.testing.assert_close(got, want)
        except AssertionError as exc:
            self.fail(name, str(exc)[:600])

    def run(self, name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - recorded as a failure
            self.fail(name, f"raised {type(exc).__name__}: {str(exc)[:800]}")


def short(t: torch.Tensor) -> str:
    flat = t.reshape(-1)
    return str(flat[:8].tolist()) + ("..." if flat.numel() > 8 else "")


# ---- inputs ---------------------------------------------------------------------------------


def make(dtype: torch.dtype, rank: int, shape: tuple[int, ...], seed: int, kind: str = "sum"):
    """Deterministic input of `rank`: any rank can rebuild any other rank's.

    kind "sum": small integers (sums are exact in every dtype, whatever the order);
    "prod": factors in {1, 2, -1} (products exact); "rand": normal floats.
    """
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        real = torch.randint(-3, 4, shape, generator=g).double()
        imag = torch.randint(-3, 4, shape, generator=g).double()
        return torch.complex(real, imag).to(dtype)
    if kind == "rand":
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if kind == "prod":
        choices = torch.tensor([1, 2] if dtype == torch.uint8 else [1, 2, -1])
        return choices[torch.randint(0, len(choices), shape, generator=g)].to(dtype)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, shape, generator=g).to(dtype)


def reduce_local(xs: list[torch.Tensor], op: Any, factor: float = 1.0) -> torch.Tensor:
    """The reference reduction of every rank's input, in the inputs' dtype."""
    dtype = xs[0].dtype
    if dtype == torch.bool:
        stacked = torch.stack(xs)
        if op in (RO.SUM, RO.MAX, RO.BOR):
            return stacked.any(0)
        if op in (RO.PRODUCT, RO.MIN, RO.BAND):
            return stacked.all(0)
        if op == RO.BXOR:
            return (stacked.sum(0) % 2).bool()
        raise ValueError(op)
    if op == "premul":
        if dtype.is_floating_point or dtype.is_complex:
            xs = [x * factor for x in xs]
        else:
            xs = [(x.double() * factor).trunc().to(dtype) for x in xs]
        op = RO.SUM
    acc = xs[0].clone()
    for x in xs[1:]:
        if op in (RO.SUM, RO.AVG):
            acc = acc + x
        elif op == RO.PRODUCT:
            acc = acc * x
        elif op == RO.MIN:
            acc = torch.minimum(acc, x)
        elif op == RO.MAX:
            acc = torch.maximum(acc, x)
        elif op == RO.BAND:
            acc = acc & x
        elif op == RO.BOR:
            acc = acc | x
        elif op == RO.BXOR:
            acc = acc ^ x
        else:
            raise ValueError(op)
    if op == RO.AVG:
        if dtype.is_floating_point or dtype.is_complex:
            acc = acc / len(xs)
        else:
            acc = torch.div(acc, len(xs), rounding_mode="trunc")
    return acc.to(dtype)


def op_name(op: Any) -> str:
    return op if isinstance(op, str) else str(op).split(".")[-1]


def applicable(op: Any, dtype: torch.dtype) -> bool:
    if op in (RO.BAND, RO.BOR, RO.BXOR):
        return not (dtype.is_floating_point or dtype.is_complex)
    if op in (RO.MIN, RO.MAX, RO.PRODUCT):
        return not dtype.is_complex  # torch itself refuses these on complex
    if op in (RO.AVG, "premul"):
        return dtype != torch.bool
    return True


def torch_op(op: Any, factor: float, tensor_factor: bool = False) -> Any:
    if op == "premul":
        f = torch.tensor([factor], dtype=torch.float64) if tensor_factor else factor
        return dist._make_nccl_premul_sum(f)
    return op


def gloo_try(fn: Callable[[], Any]) -> bool:
    """Runs `fn` on Gloo: False where Gloo does not support the call (not an error here)."""
    try:
        fn()
        return True
    except (RuntimeError, ValueError, TypeError):
        return False


# ---- setup ----------------------------------------------------------------------------------


def init(a: argparse.Namespace, backend: str = "nanoccl") -> None:
    dist.init_process_group(
        backend,
        init_method=a.init_method,
        rank=a.rank,
        world_size=a.world_size,
        timeout=datetime.timedelta(seconds=a.pg_timeout),
    )


def members(group: Any) -> list[int]:
    return dist.get_process_group_ranks(group)


def quiesce(gloo: Any) -> None:
    """Waits, over Gloo, until every rank is done with its nanoccl calls.

    The scenarios end this way so that what they check does not depend on how a group
    closes; test_destroy_right_after_a_collective checks that on its own.
    """
    dist.barrier(group=gloo)


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
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(1000 + rank)
        losses = []
        for _ in range(20):
            x = torch.randn(32, 16, generator=g)
            y = torch.randn(32, 4, generator=g)
            opt.zero_grad()
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs[name] = (net.module, losses)
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


# ---- scenario: bad input -------------------------------------------------------------------


def expect_error(ck: Checks, name: str, fn: Callable[[], Any], must_name: list[int],
                 limit: float, exc_types: tuple[type[BaseException], ...] = (RuntimeError,),
                 then: Callable[[], Any] | None = None) -> str:
    """`fn` raises one of `exc_types` within `limit` seconds, naming every rank in `must_name`.

    then: for a rank whose own part of a mismatched call may legitimately succeed (it only
    talked to ranks that agreed with it): if `fn` returns, `then` (the group's next call) must
    raise instead.
    """
    start = time.monotonic()
    try:
        fn()
        if then is not None:
            ck.data.setdefault("succeeded_then_failed", []).append(name)
            fn = then
            fn()
    except exc_types as exc:
        elapsed = time.monotonic() - start
        msg = str(exc)
        ck.expect(f"{name} within {limit} s", elapsed < limit, f"took {elapsed:.1f} s: {msg}")
        for r in must_name:
            if r == -1:  # any rank but this one: the other side of a mismatch
                me = dist.get_rank()
                named = any(f"rank {q}" in msg for q in range(dist.get_world_size()) if q != me)
                ck.expect(f"{name} names another rank", named, msg[:600])
            else:
                ck.expect(f"{name} names rank {r}", f"rank {r}" in msg, msg[:600])
        ck.data.setdefault("messages", {})[name] = msg[:600]
        ck.data.setdefault("seconds", {})[name] = round(elapsed, 2)
        return msg
    except Exception as exc:  # noqa: BLE001
        ck.fail(name, f"raised {type(exc).__name__} instead of {exc_types}: {exc}")
        return ""
    ck.fail(name, "did not raise")
    return ""


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
    late = limit
    cases: list[tuple[str, Callable[[Any], Any], list[int], float]] = [
        ("different shapes",
         lambda g: dist.all_reduce(torch.ones(8 if rank != 1 else 12), group=g), both, limit),
        ("different dtypes",
         lambda g: dist.all_reduce(torch.ones(8, dtype=torch.float32 if rank != 1
                                              else torch.float64), group=g), both, limit),
        ("different roots",
         lambda g: dist.broadcast(torch.ones(4), src=1 if rank == 1 else 0, group=g), both,
         late),
        ("different ops",
         lambda g: dist.all_reduce(torch.ones(4), group=g) if rank != 1
         else dist.all_gather([torch.ones(4) for _ in range(world)], torch.ones(4), group=g),
         both, late),
        ("different reductions",
         lambda g: dist.all_reduce(torch.ones(4), op=RO.SUM if rank != 1 else RO.MAX,
                                   group=g), both, limit),
        ("root outside the group on rank 1",
         lambda g: g.broadcast(torch.ones(4), 7 if rank == 1 else 0).wait(), [1], limit),
        ("reduction undefined on the dtype",
         lambda g: dist.all_reduce(torch.ones(4), op=RO.BAND, group=g), [rank], limit),
        ("dtype without reductions",
         lambda g: dist.all_reduce(torch.ones(4).to(torch.float8_e4m3fn), group=g), [rank],
         limit),
    ]
    for name, call, names, case_limit in cases:
        g = fresh()
        # With 3+ ranks a rank that only exchanged with ranks agreeing with it may finish the
        # call; the group is then broken and its next call fails.
        then = (lambda: dist.all_reduce(torch.ones(2), group=g)) if rank > 1 else None
        expect_error(ck, name, lambda: call(g), names, case_limit, then=then)
        destroy(g)

    # A group that failed is unusable, with a clear error; destroying it does not hang.
    g = fresh()
    expect_error(ck, "mismatch again", lambda: dist.all_reduce(
        torch.ones(3 if rank else 4), group=g), both, limit)
    expect_error(ck, "use after an error", lambda: dist.all_reduce(torch.ones(3), group=g),
                 [rank], limit)
    destroy(g)

    # Send to self: torch refuses it before the backend (ValueError); the backend itself, as
    # reached through the ProcessGroup object, refuses too, naming both ends.
    g = fresh()
    expect_error(ck, "send to self (torch)", lambda: dist.send(torch.ones(2), dst=rank, group=g),
                 [], limit, (ValueError, RuntimeError))
    expect_error(ck, "send to self (backend)", lambda: g.send([torch.ones(2)], rank, 0),
                 [rank], limit)
    ck.expect("send to self names the destination",
              f"destination rank {rank}" in ck.data["messages"].get("send to self (backend)", ""))
    expect_error(ck, "recv from self (backend)", lambda: g.recv([torch.ones(2)], rank, 0),
                 [rank], limit)
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
                     lambda: dist.all_reduce(torch.ones(1 << 18)), [], a.pg_timeout + 2)
    ck.data["raised"] = True
    # No destroy_process_group: the group is broken; exiting must not hang either.


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

    expect_error(ck, "a rank never joins", create, [rank], a.pg_timeout + 5)


SCENARIOS: dict[str, Callable[[argparse.Namespace, Checks], None]] = {
    "collectives": scenario_collectives,
    "ddp": scenario_ddp,
    "errors": scenario_errors,
    "killed_peer": scenario_killed_peer,
    "lifecycle": scenario_lifecycle,
    "device_map": scenario_device_map,
    "torchrun": scenario_torchrun,
    "destroy_race": scenario_destroy_race,
    "no_show": scenario_no_show,
}


def main(scenarios: dict[str, Callable[[argparse.Namespace, Checks], None]] | None = None,
         add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
         leave_hard: tuple[str, ...] = ("killed_peer",)) -> int:
    """Runs one scenario (of `scenarios`, default SCENARIOS) and writes its result file.

    The other rank programs (topology_jobs.py, compression_jobs.py) call this with their own
    scenarios and extra arguments. Scenarios in `leave_hard` leave with os._exit: their broken
    groups are never destroyed, so no destructor may run.
    """
    table = SCENARIOS if scenarios is None else scenarios
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=sorted(table))
    p.add_argument("--rank", type=int, default=int(os.environ.get("RANK", 0)))
    p.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))
    p.add_argument("--init-method", default="env://")
    p.add_argument("--pg-timeout", type=float, default=20.0)
    p.add_argument("--result", default="")
    p.add_argument("--deadline", type=float, default=120.0)
    if add_arguments is not None:
        add_arguments(p)
    a = p.parse_args()
    a.result = (a.result or "result-{rank}.json").replace("{rank}", str(a.rank))
    # A hung rank prints its Python stacks and stays alive, so that the harness can attach a
    # debugger for the native ones before it kills the job.
    faulthandler.dump_traceback_later(a.deadline, exit=False)
    ck = Checks(a.rank)
    try:
        table[a.scenario](a, ck)
    except Exception:  # noqa: BLE001 - reported in the result
        ck.fail("scenario", traceback.format_exc()[-3000:])
    ck.data["checks"] = ck.count
    ck.data["failures"] = ck.failures
    tmp = Path(a.result + ".tmp")
    tmp.write_text(json.dumps(ck.data, default=str))
    tmp.rename(a.result)
    sys.stdout.flush()
    sys.stderr.flush()
    if a.scenario in leave_hard:
        os._exit(0)
    close_gloo_groups()
    return 0


def close_gloo_groups() -> None:
    """Destroys the scenario's Gloo side groups before the interpreter exits: a Gloo worker
    thread still holding a Python tensor at finalization decrefs it after Python is gone and
    aborts the rank ('terminate called without an active exception', seen once in CI in
    ProcessGroupGloo::runLoop after every check had passed). Local: no collective runs."""
    if not dist.is_initialized():
        return
    c10d = dist.distributed_c10d
    default = c10d._get_default_group()
    for group in list(c10d._world.pg_map):
        if group is default:
            continue
        try:
            if dist.get_backend(group) == "gloo":
                dist.destroy_process_group(group)
        except Exception:  # noqa: BLE001 - a group torch already dropped
            continue


if __name__ == "__main__":
    sys.exit(main())
