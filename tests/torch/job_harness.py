"""The harness of every rank program (dist_jobs.py, topology_jobs.py, compression_jobs.py,
fsdp_jobs.py, security_jobs.py): its command line, its result file and the helpers its scenarios share.

    python <program>.py SCENARIO --rank R --world-size N --init-method URL --result FILE

job_runner.run_job starts one such process per rank. Each scenario runs many checks in one
process group setup and writes {"failures": [...], "checks": n, ...} to FILE; a check that fails
is recorded (Checks), not raised, so that one job reports every problem at once. Inputs are
deterministic per rank and seed (make): each rank can regenerate any rank's input, and so
compute a reference locally (reduce_local) where Gloo lacks the op or dtype.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import nanoccl  # noqa: F401 - registers the "nanoccl" backend

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


def train_mse(net: Any, rank: int, steps: int, batch: int, inputs: int, outputs: int) -> list[float]:
    """`steps` SGD steps (lr 0.05, momentum 0.9) of `net` on rank-seeded random regression
    batches; the losses."""
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(batch, inputs, generator=g)
        y = torch.randn(batch, outputs, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# ---- setup ----------------------------------------------------------------------------------


def init(a: argparse.Namespace, backend: str = "nanoccl") -> None:
    dist.init_process_group(
        backend,
        init_method=a.init_method,
        rank=a.rank,
        world_size=a.world_size,
        timeout=datetime.timedelta(seconds=a.pg_timeout),
    )


def quiesce(gloo: Any) -> None:
    """Waits, over Gloo, until every rank is done with its nanoccl calls.

    The scenarios end this way so that what they check does not depend on how a group
    closes; test_destroy_right_after_a_collective checks that on its own.
    """
    dist.barrier(group=gloo)


# ---- expected errors --------------------------------------------------------------------------


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


# ---- the rank program -------------------------------------------------------------------------


def main(scenarios: dict[str, Callable[[argparse.Namespace, Checks], None]],
         add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
         leave_hard: tuple[str, ...] = ()) -> int:
    """Runs one scenario of `scenarios` (named on the command line) and writes its result file.

    Every rank program calls this with its own scenarios and extra arguments. Scenarios in
    `leave_hard` leave with os._exit: their broken groups are never destroyed, so no
    destructor may run.
    """
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=sorted(scenarios))
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
        scenarios[a.scenario](a, ck)
    except Exception:  # noqa: BLE001 - reported in the result
        ck.fail("scenario", traceback.format_exc()[-3000:])
    ck.data["checks"] = ck.count
    ck.data["failures"] = ck.failures
    # Whether libfabric was loaded into this rank: only a fabric transport may load it.
    ck.data["libfabric_mapped"] = "libfabric" in Path("/proc/self/maps").read_text()
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

