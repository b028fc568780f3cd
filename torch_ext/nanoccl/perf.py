"""nanoccl-perf: nccl-tests for torch.distributed backends (nanoccl, gloo, nccl).

Run under torchrun (it reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT from the environment; without them it runs as a single rank)::

    torchrun --nproc-per-node 2 -m nanoccl.perf -c allreduce -b 8 -e 128M -f 2
    torchrun --nproc-per-node 2 torch_ext/nanoccl/perf.py -c allreduce --ab gloo
    nanoccl-perf ...                        # the installed entry point, same options

Columns are those of nccl-tests: size (B), count (elements), type, redop,
root, time (us), algbw and busbw (GB/s, bus factors as in nccl-tests'
PERFORMANCE.md) and #wrong (elements that failed the correctness check of
the first, untimed call), plus min / median / p99 / max of the per-iteration
times. An iteration's time is the mean over ranks of each rank's time for
that call; "time" is the mean over iterations.

Latency (small messages: -b 4 -e 64K, and -c barrier): --mode back-to-back
runs each side's calls in blocks of up to 50 one right after the other (after
one untimed call of the same side), as a training step issues them; --mode
barrier puts an untimed barrier of the same backend before every timed call,
so that every rank starts it together.

``--ab B`` measures a second backend in the same launch: the default group
runs the backend under test (--backend, "nanoccl" when it imports), a group
made with new_group(backend=B) runs the reference, and the two alternate
call by call (A, B, A, B ...) so that drift hits both alike. The "speedup"
column is reference time / tested time: above 1 the tested backend is faster.
With ``--ab nanoccl``, ``--ab-set NAME=VALUE`` (repeatable) gives the reference
side its own nanoccl settings, e.g. ``--ab-set socket_ifname=eth0`` to time
every rail against one in the same launch.
Bookkeeping (result gathering) runs on a third, gloo group that is never timed.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:
    # Run as a script: the package directory must not shadow other modules,
    # and the source tree's package is a fallback behind an installed one.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
        sys.path.pop(0)
    sys.path.append(os.path.dirname(_HERE))

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field, replace  # noqa: E402
from typing import Any, Callable, Sequence  # noqa: E402

import warnings  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

# all_gather_into_tensor / reduce_scatter_tensor are deprecated in newer torch,
# but their replacements do not exist in the 2.11 the GPU machines carry.
warnings.filterwarnings("ignore", category=FutureWarning,
                        message=r".*(all_gather_into_tensor|reduce_scatter_tensor).*deprecated")

# Values repeat with this period along a buffer; inputs and expected results
# are built from one period, so checking a 256 MB buffer needs no big reference.
PERIOD = 26
CHECK_CHUNK = PERIOD * (1 << 17)
_SIZE_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from nccl-tests style sizes: 8, 1K, 1M, 256M, 1G (K = 1024)."""
    match = _SIZE_PATTERN.match(str(text))
    if not match:
        raise ValueError(f"bad size {text!r}: use e.g. 8, 1K, 1M, 256M, 1G")
    value = float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if value != int(value) or value < 0:
        raise ValueError(f"bad size {text!r}: not a whole number of bytes")
    return int(value)


def format_size(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def size_list(begin: int, end: int, factor: float = 2.0, step: int = 0) -> list[int]:
    """Sizes from begin to end inclusive, multiplied by factor (or plus step when given)."""
    if begin <= 0 or end < begin:
        raise ValueError(f"need 0 < -b ({begin}) <= -e ({end})")
    if step <= 0 and factor <= 1:
        raise ValueError("-f must be > 1 (or give -i)")
    sizes = []
    size = begin
    while size <= end:
        sizes.append(size)
        nxt = size + step if step > 0 else int(size * factor)
        size = max(nxt, size + 1)
    return sizes


# ------------------------------------------------------------------ data types
@dataclass(frozen=True)
class DType:
    name: str  # nccl-tests' spelling
    torch_dtype: torch.dtype
    rtol: float  # 0 (with atol 0): compared exactly
    atol: float = 0.0


DTYPES = {d.name: d for d in (
    DType("float", torch.float32, 1e-6),
    DType("double", torch.float64, 1e-12),
    DType("half", torch.float16, 1e-3),
    DType("bfloat16", torch.bfloat16, 8e-3),
    DType("int8", torch.int8, 0.0),
    DType("uint8", torch.uint8, 0.0),
    DType("int32", torch.int32, 0.0),
    DType("int64", torch.int64, 0.0),
)}
_DTYPE_ALIASES = {"float32": "float", "fp32": "float", "float64": "double", "fp64": "double",
                  "float16": "half", "fp16": "half", "bf16": "bfloat16", "int": "int32",
                  "long": "int64", "char": "int8"}


def parse_dtype(text: str) -> DType:
    name = _DTYPE_ALIASES.get(text.lower(), text.lower())
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {text!r}: one of {', '.join(DTYPES)}")
    return DTYPES[name]


REDOPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
          "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


def pattern_row(rank: int, dtype: torch.dtype, redop: str, phase: int = 0) -> torch.Tensor:
    """One period of rank's input values, starting at global element index phase.

    Small integers, so sums over up to 19 ranks are exact in every dtype;
    {1, 2} for prod so products stay powers of two. Distinct per rank (for up
    to 13 ranks), so a block from the wrong rank or offset shows up.
    """
    j = torch.arange(phase, phase + PERIOD, dtype=torch.int64)
    if redop == "prod":
        values = 1 + (j + rank) % 2
    else:
        values = 1 + (j + 5 * rank) % 13
    return values.to(dtype)


def reduced_row(world: int, dtype: torch.dtype, redop: str, phase: int = 0) -> torch.Tensor:
    """One period of the expected reduction of all ranks' pattern rows."""
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    rows = torch.stack([pattern_row(r, wide, redop, phase) for r in range(world)])
    if redop == "prod":
        out = rows.prod(0)
    elif redop == "min":
        out = rows.min(0).values
    elif redop == "max":
        out = rows.max(0).values
    elif redop == "avg":
        out = rows.sum(0) / world if dtype.is_floating_point else \
            torch.div(rows.sum(0), world, rounding_mode="floor")
    else:
        out = rows.sum(0)
    # Integer results wrap around in the buffer's own width, as the backends' do.
    return out.to(dtype)


def fill_pattern(flat: torch.Tensor, row: torch.Tensor) -> None:
    """Writes row (one period) repeatedly along flat."""
    row = row.to(flat.device)
    full = flat.numel() // PERIOD
    if full:
        flat[: full * PERIOD].view(full, PERIOD).copy_(row.expand(full, PERIOD))
    rest = flat.numel() - full * PERIOD
    if rest:
        flat[full * PERIOD:].copy_(row[:rest])


def count_wrong(flat: torch.Tensor, row: torch.Tensor, rtol: float, atol: float = 0.0) -> int:
    """Elements of flat that differ from row repeated (within rtol/atol for floats)."""
    row = row.to(flat.device)
    wrong = 0
    for start in range(0, flat.numel(), CHECK_CHUNK):
        chunk = flat[start: start + CHECK_CHUNK]
        n = chunk.numel()
        reps = -(-n // PERIOD)
        expected = row.repeat(reps)[:n]
        if rtol > 0 or atol > 0:
            ok = torch.isclose(chunk, expected, rtol=rtol, atol=atol)
        else:
            ok = chunk == expected
        wrong += int(n - int(ok.sum()))
    return wrong


# Half the codec's resolution at magnitude 1 (collectives/codec/codec.h's error table).
CODEC_UNIT = {"none": 0.0, "fp16": 2.0**-11, "bf16": 2.0**-8, "int8": 1 / 254, "int4": 1 / 14}
# compression "auto" picks per call from NANOCCL_COMPRESSION_ALLOW (this default, when unset).
DEFAULT_ALLOW = "none,bf16,int8"


def codec_unit(codec: str) -> float:
    """CODEC_UNIT, and for "auto" the coarsest of the codecs it may choose."""
    if codec == "auto":
        allowed = os.environ.get("NANOCCL_COMPRESSION_ALLOW", DEFAULT_ALLOW).split(",")
        return max(CODEC_UNIT.get(c.strip().lower(), 0.0) for c in allowed)
    return CODEC_UNIT[codec]


def checked_dtype(dtype: DType, side: Any, world: int) -> DType:
    """What a side's results are checked against: a lossy codec gets the error it allows.

    Each rank's input (pattern values up to 13) is encoded at most once inside its node's
    partial sum and the total once more: at most 2 x world x 13 x the codec's unit. A
    bfloat16/float16 result is also rounded once to its type: the dtype's own rtol stays.
    """
    if not getattr(side, "codec", None) or not dtype.torch_dtype.is_floating_point:
        return dtype
    half = dtype.torch_dtype in (torch.float16, torch.bfloat16)
    return replace(dtype, rtol=dtype.rtol if half else 0.0,
                   atol=2 * world * 13 * codec_unit(side.codec) * 1.05)


# ----------------------------------------------------------------- collectives
@dataclass
class Buffers:
    inp: torch.Tensor
    out: torch.Tensor
    count: int  # the "count" column: elements in the reported size
    size: int  # the "size" column, bytes
    root: int


@dataclass(frozen=True)
class Collective:
    """One row of the collective table: how to size, fill, call and check it."""

    name: str
    reduces: bool
    in_place: bool  # the call overwrites its input: refill before every call
    bus_factor: Callable[[int], float]
    make: Callable[[int, int, int, DType, str, torch.device, int], Buffers | None]
    call: Callable[[Buffers, Any, Any], None]
    check: Callable[[Buffers, int, int, DType, str], int]


def _elems(size: int, per: int, dtype: DType) -> int:
    return max(1, size // (per * dtype.torch_dtype.itemsize))


def _empty(n: int, dtype: DType, device: torch.device) -> torch.Tensor:
    return torch.empty(n, dtype=dtype.torch_dtype, device=device)


def _make_allreduce(size: int, rank: int, world: int, dtype: DType, redop: str,
                    device: torch.device, root: int) -> Buffers:
    count = _elems(size, 1, dtype)
    buf = _empty(count, dtype, device)
    fill_pattern(buf, pattern_row(rank, dtype.torch_dtype, redop))
    return Buffers(buf, buf, count, count * dtype.torch_dtype.itemsize, -1)


def _check_allreduce(b: Buffers, rank: int, world: int, dtype: DType, redop: str) -> int:
    return count_wrong(b.out, reduced_row(world, dtype.torch_dtype, redop), dtype.rtol, dtype.atol)


def _make_allgather(size: int, rank: int, world: int, dtype: DType, redop: str,
                    device: torch.device, root: int) -> Buffers:
    per = _elems(size, world, dtype)
    inp = _empty(per, dtype, device)
    fill_pattern(inp, pattern_row(rank, dtype.torch_dtype, redop))
    out = _empty(per * world, dtype, device)
    return Buffers(inp, out, per * world, per * world * dtype.torch_dtype.itemsize, -1)


def _check_allgather(b: Buffers, rank: int, world: int, dtype: DType, redop: str) -> int:
    per = b.inp.numel()
    return sum(count_wrong(b.out[q * per:(q + 1) * per],
                           pattern_row(q, dtype.torch_dtype, redop), dtype.rtol, dtype.atol)
               for q in range(world))


def _make_reduce_scatter(size: int, rank: int, world: int, dtype: DType, redop: str,
                         device: torch.device, root: int) -> Buffers:
    per = _elems(size, world, dtype)
    inp = _empty(per * world, dtype, device)
    fill_pattern(inp, pattern_row(rank, dtype.torch_dtype, redop))
    out = _empty(per, dtype, device)
    return Buffers(inp, out, per * world, per * world * dtype.torch_dtype.itemsize, -1)


def _check_reduce_scatter(b: Buffers, rank: int, world: int, dtype: DType, redop: str) -> int:
    phase = (rank * b.out.numel()) % PERIOD
    return count_wrong(b.out, reduced_row(world, dtype.torch_dtype, redop, phase), dtype.rtol, dtype.atol)


def _make_alltoall(size: int, rank: int, world: int, dtype: DType, redop: str,
                   device: torch.device, root: int) -> Buffers:
    per = _elems(size, world, dtype)
    inp = _empty(per * world, dtype, device)
    fill_pattern(inp, pattern_row(rank, dtype.torch_dtype, redop))
    out = _empty(per * world, dtype, device)
    return Buffers(inp, out, per * world, per * world * dtype.torch_dtype.itemsize, -1)


def _check_alltoall(b: Buffers, rank: int, world: int, dtype: DType, redop: str) -> int:
    per = b.out.numel() // world
    phase = (rank * per) % PERIOD
    return sum(count_wrong(b.out[q * per:(q + 1) * per],
                           pattern_row(q, dtype.torch_dtype, redop, phase), dtype.rtol, dtype.atol)
               for q in range(world))


def _make_broadcast(size: int, rank: int, world: int, dtype: DType, redop: str,
                    device: torch.device, root: int) -> Buffers:
    count = _elems(size, 1, dtype)
    buf = _empty(count, dtype, device)
    fill_pattern(buf, pattern_row(rank, dtype.torch_dtype, redop))
    return Buffers(buf, buf, count, count * dtype.torch_dtype.itemsize, root)


def _check_broadcast(b: Buffers, rank: int, world: int, dtype: DType, redop: str) -> int:
    return count_wrong(b.out, pattern_row(b.root, dtype.torch_dtype, redop), dtype.rtol, dtype.atol)


def _make_sendrecv(size: int, rank: int, world: int, dtype: DType, redop: str,
                   device: torch.device, root: int) -> Buffers:
    count = _elems(size, 1, dtype)
    inp = _empty(count, dtype, device)
    fill_pattern(inp, pattern_row(rank, dtype.torch_dtype, redop))
    out = _empty(count, dtype, device)
    return Buffers(inp, out, count, count * dtype.torch_dtype.itemsize, -1)


def _make_barrier(size: int, rank: int, world: int, dtype: DType, redop: str,
                  device: torch.device, root: int) -> Buffers:
    none = _empty(0, dtype, device)
    return Buffers(none, none, 0, 0, -1)  # one row whatever the sizes


def _check_nothing(b: Buffers, rank: int, world: int, dtype: DType, redop: str) -> int:
    return 0


def _check_sendrecv(b: Buffers, rank: int, world: int, dtype: DType, redop: str) -> int:
    return count_wrong(b.out, pattern_row((rank - 1) % world, dtype.torch_dtype, redop),
                       dtype.rtol, dtype.atol)


def _call_sendrecv(b: Buffers, group: Any, op: Any) -> None:
    world = dist.get_world_size(group)
    if world == 1:
        b.out.copy_(b.inp)  # a rank cannot send to itself through torch.distributed
        return
    rank = dist.get_rank(group)
    ops = [dist.P2POp(dist.isend, b.inp, dist.get_global_rank(group, (rank + 1) % world), group),
           dist.P2POp(dist.irecv, b.out, dist.get_global_rank(group, (rank - 1) % world), group)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


def _broadcast_root(b: Buffers, group: Any) -> int:
    return dist.get_global_rank(group, b.root)


COLLECTIVES = {c.name: c for c in (
    Collective("allreduce", True, True, lambda n: 2.0 * (n - 1) / n, _make_allreduce,
               lambda b, g, op: dist.all_reduce(b.inp, op=op, group=g), _check_allreduce),
    Collective("allgather", False, False, lambda n: (n - 1) / n, _make_allgather,
               lambda b, g, op: dist.all_gather_into_tensor(b.out, b.inp, group=g),
               _check_allgather),
    Collective("reduce_scatter", True, False, lambda n: (n - 1) / n, _make_reduce_scatter,
               lambda b, g, op: dist.reduce_scatter_tensor(b.out, b.inp, op=op, group=g),
               _check_reduce_scatter),
    Collective("alltoall", False, False, lambda n: (n - 1) / n, _make_alltoall,
               lambda b, g, op: dist.all_to_all_single(b.out, b.inp, group=g),
               _check_alltoall),
    Collective("broadcast", False, True, lambda n: 1.0, _make_broadcast,
               lambda b, g, op: dist.broadcast(b.inp, src=_broadcast_root(b, g), group=g),
               _check_broadcast),
    Collective("sendrecv", False, False, lambda n: 1.0, _make_sendrecv, _call_sendrecv,
               _check_sendrecv),
    Collective("barrier", False, False, lambda n: 0.0, _make_barrier,
               lambda b, g, op: dist.barrier(group=g), _check_nothing),
)}
_COLLECTIVE_ALIASES = {"all_reduce": "allreduce", "all_gather": "allgather",
                       "reducescatter": "reduce_scatter", "reduce-scatter": "reduce_scatter",
                       "all_to_all": "alltoall", "alltoallv": "alltoall", "bcast": "broadcast",
                       "send_recv": "sendrecv", "p2p": "sendrecv"}


def parse_collectives(values: Sequence[str]) -> list[str]:
    names: list[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip().lower()
            if not item:
                continue
            if item == "all":
                names.extend(COLLECTIVES)
                continue
            item = _COLLECTIVE_ALIASES.get(item, item)
            if item not in COLLECTIVES:
                raise ValueError(f"unknown collective {item!r}: one of {', '.join(COLLECTIVES)}")
            names.append(item)
    return list(dict.fromkeys(names)) or ["allreduce"]


def bus_factor(collective: str, world: int) -> float:
    """nccl-tests' busbw / algbw for the collective on world ranks."""
    return COLLECTIVES[collective].bus_factor(world)


# --------------------------------------------------------------- backends
def nanoccl_status() -> tuple[bool, str]:
    """(usable, where-or-why): whether `import nanoccl` works and registers the backend."""
    try:
        import nanoccl  # noqa: F401  registers the "nanoccl" backend
    except Exception as exc:  # any failure to load the extension counts as "not available"
        return False, f"import nanoccl failed: {type(exc).__name__}: {exc}"
    if "nanoccl" not in dist.Backend.backend_list:
        return False, "nanoccl imported but did not register a 'nanoccl' backend"
    return True, str(getattr(sys.modules["nanoccl"], "__file__", "nanoccl"))


@dataclass
class Side:
    """One backend under measurement and the group that runs it."""

    label: str
    backend: str
    group: Any
    codec: str | None = None  # nanoccl's inter-node compression (--compression)


@dataclass
class Row:
    collective: str
    backend: str
    label: str
    size: int
    count: int
    type: str
    redop: str
    root: int
    iters: int
    time_us: float
    algbw: float
    busbw: float
    wrong: int
    min_us: float
    median_us: float
    max_us: float
    p99_us: float = 0.0
    # nanoccl with a link profile: what the planner ran for these calls (stats()["modelled"]
    # keys with the calls of this size, "+"-joined), e.g. "allreduce hierarchical int8".
    plan: str = ""


@dataclass
class Options:
    collectives: list[str]
    sizes: list[int]
    dtype: DType
    redop: str
    root: int
    warmup: int
    iters: int
    iter_budget: int
    min_iters: int
    check: bool
    device: torch.device
    mode: str = "alternate"  # MODES


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    wrong: int = 0


# How the sides' timed calls are ordered: one call each in turn; blocks of BLOCK calls of one
# side back to back; or one call each in turn with an untimed barrier (same backend) before it.
MODES = ("alternate", "back-to-back", "barrier")
BLOCK = 50


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 < q <= 100) by the nearest-rank method."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def iterations_for(size: int, opts: Options) -> int:
    """-n, capped so that iters x size stays within --iter-budget (at least --min-iters)."""
    if opts.iter_budget <= 0:
        return opts.iters
    return max(min(opts.min_iters, opts.iters), min(opts.iters, opts.iter_budget // max(size, 1)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name: str, sides: list[Side], ctrl: Any, opts: Options, rank: int, world: int,
            on_rows: Callable[[list[Row]], None]) -> Results:
    """Runs one collective over every size on every side, interleaved call by call."""
    results = Results()
    op = REDOPS[opts.redop]
    coll = COLLECTIVES[name]
    seen_sizes: set[int] = set()
    for size in opts.sizes:
        bufs = coll.make(size, rank, world, opts.dtype, opts.redop, opts.device, opts.root)
        if bufs is None or bufs.size in seen_sizes:
            continue
        seen_sizes.add(bufs.size)
        pristine = bufs.inp.clone() if coll.in_place else None
        iters = iterations_for(bufs.size, opts)

        def refill() -> None:
            if pristine is not None:
                bufs.inp.copy_(pristine)

        wrong_local: list[int] = []
        for side in sides:
            refill()
            if not coll.in_place:
                bufs.out.zero_()  # a call that writes nothing must fail the check
            coll.call(bufs, side.group, op)
            _sync(opts.device)
            wrong_local.append(coll.check(bufs, rank, world, checked_dtype(opts.dtype, side,
                                                                           world), opts.redop)
                               if opts.check else 0)
        for _ in range(opts.warmup):
            for side in sides:
                refill()
                coll.call(bufs, side.group, op)
        _sync(opts.device)
        times: list[list[float]] = [[] for _ in sides]

        def timed(k: int) -> None:
            refill()
            _sync(opts.device)
            if opts.mode == "barrier":
                dist.barrier(group=sides[k].group)
            start = time.perf_counter_ns()
            coll.call(bufs, sides[k].group, op)
            _sync(opts.device)
            times[k].append((time.perf_counter_ns() - start) / 1000.0)

        before = [_modelled(side) for side in sides]
        if opts.mode == "back-to-back":
            done = 0
            while done < iters:
                n = min(BLOCK, iters - done)
                for k in range(len(sides)):
                    refill()
                    coll.call(bufs, sides[k].group, op)  # untimed: the block's first follows
                    _sync(opts.device)                   # the other side's calls
                    for _ in range(n):
                        timed(k)
                done += n
        else:
            for _ in range(iters):
                for k in range(len(sides)):
                    timed(k)
        after = [_modelled(side) for side in sides]
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, (times, wrong_local), group=ctrl)
        rows = []
        for k, side in enumerate(sides):
            per_iter = [statistics.fmean(g[0][k][i] for g in gathered) for i in range(iters)]
            wrong = sum(g[1][k] for g in gathered)
            t_us = statistics.fmean(per_iter)
            algbw = bufs.size / (t_us * 1e-6) / 1e9 if t_us > 0 else 0.0
            rows.append(Row(name, side.backend, side.label, bufs.size, bufs.count,
                            opts.dtype.name, opts.redop if coll.reduces else "none",
                            bufs.root, iters, t_us, algbw, algbw * coll.bus_factor(world),
                            wrong, min(per_iter), statistics.median(per_iter),
                            max(per_iter), percentile(per_iter, 99),
                            _plans(before[k], after[k])))
            results.wrong += wrong
        results.rows.extend(rows)
        on_rows(rows)
        if rank == 0:
            for side, old, new in zip(sides, before, after):
                for line in _model_lines(side, old, new, bufs.size):
                    print(line, flush=True)
        del bufs, pristine
    return results


def _modelled(side: Side) -> dict[str, Any]:
    """The nanoccl side's stats()["modelled"] (empty for other backends): local, no traffic."""
    if side.backend != "nanoccl":
        return {}
    try:
        import nanoccl
        return dict(nanoccl.stats(side.group).get("modelled", {}))
    except Exception:  # noqa: BLE001 - an older build without it: nothing to show
        return {}


def modelled_since(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """What a group ran between two stats()["modelled"] views, per planner row with calls in
    between: {"what", "calls", "predicted_s", "measured_s"}, the times per call."""
    chose = []
    for what, cur in after.items():
        prev = before.get(what, {"calls": 0, "predicted_s": 0.0, "measured_s": 0.0})
        n = cur["calls"] - prev["calls"]
        if n > 0:
            chose.append({"what": what, "calls": n,
                          "predicted_s": (cur["predicted_s"] - prev["predicted_s"]) / n,
                          "measured_s": (cur["measured_s"] - prev["measured_s"]) / n})
    return chose


def _plans(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The modelled rows (planner choices) that ran calls between two _modelled() views."""
    return "+".join(c["what"] for c in modelled_since(old, new))


def _model_lines(side: Side, old: dict[str, Any], new: dict[str, Any], size: int) -> list[str]:
    """"#   model: ..." lines: the cost model's prediction beside the measured time, per call,
    for the calls of one size (rank 0's view; README "Tuning")."""
    lines = []
    for c in modelled_since(old, new):
        pred, meas = c["predicted_s"] * 1e6, c["measured_s"] * 1e6
        lines.append(f"#   model: {side.label} {size} B: {c['what']} predicted {pred:.1f} us, "
                     f"measured {meas:.1f} us (x{meas / pred if pred > 0 else float('nan'):.2f})")
    return lines


# ------------------------------------------------------------------- output
_FIXED = ("{:>12}  {:>12}  {:>8}  {:>6}  {:>6}", ("size", "count", "type", "redop", "root"),
          ("(B)", "(elements)", "", "", ""))
_GROUP = ("  {:>10}  {:>7}  {:>7}  {:>6}  {:>10}  {:>10}  {:>10}  {:>10}",
          ("time", "algbw", "busbw", "#wrong", "min", "median", "p99", "max"),
          ("(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(us)"))


def header(labels: list[str]) -> list[str]:
    fixed_w = len(_FIXED[0].format(*_FIXED[1]))
    group_w = len(_GROUP[0].format(*_GROUP[1]))
    lines = []
    if len(labels) > 1:
        top = "#" + " " * (fixed_w - 1) + "".join(f"{lbl:^{group_w}}" for lbl in labels)
        lines.append(top.rstrip())
    for k in (1, 2):
        line = "#" + _FIXED[0].format(*_FIXED[k])[1:]
        line += "".join(_GROUP[0].format(*_GROUP[k]) for _ in labels)
        if len(labels) > 1:
            line += "  {:>8}".format("speedup" if k == 1 else "(x)")
        line += "  {:>6}".format("iters" if k == 1 else "")
        lines.append(line)
    return lines


def format_rows(rows: list[Row]) -> str:
    first = rows[0]
    line = _FIXED[0].format(first.size, first.count, first.type, first.redop, first.root)
    for row in rows:
        line += ("  {:>10.1f}  {:>7.3f}  {:>7.3f}  {:>6d}  {:>10.1f}  {:>10.1f}  {:>10.1f}"
                 "  {:>10.1f}").format(row.time_us, row.algbw, row.busbw, row.wrong, row.min_us,
                                       row.median_us, row.p99_us, row.max_us)
    if len(rows) > 1:
        line += "  {:>8.3f}".format(rows[1].time_us / rows[0].time_us if rows[0].time_us else 0.0)
    line += "  {:>6d}".format(first.iters)
    return line


def summary_lines(rows: list[Row], labels: list[str]) -> list[str]:
    lines = []
    wrong = sum(r.wrong for r in rows)
    lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    avgs = []
    for label in labels:
        mine = [r.busbw for r in rows if r.label == label]
        avgs.append(statistics.fmean(mine) if mine else 0.0)
    if len(labels) == 1:
        lines.append(f"# Avg bus bandwidth    : {avgs[0]:.4f}")
    else:
        parts = "   ".join(f"{a:.4f} ({lbl})" for a, lbl in zip(avgs, labels))
        ratio = avgs[0] / avgs[1] if avgs[1] else 0.0
        lines.append(f"# Avg bus bandwidth    : {parts}   ratio {ratio:.3f} "
                     f"({labels[0]} / {labels[1]}, >1: {labels[0]} faster)")
    return lines


# --------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nanoccl-perf",
        description="nccl-tests style benchmark of torch.distributed collectives; "
                    "run under torchrun.")
    p.add_argument("-c", "--collective", action="append", default=[],
                   help="allreduce, allgather, reduce_scatter, broadcast, alltoall, sendrecv "
                        "or all; repeat or comma-separate for several (default allreduce)")
    p.add_argument("-b", "--minbytes", default="32M", help="smallest size (default 32M)")
    p.add_argument("-e", "--maxbytes", default="32M", help="largest size (default 32M)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0, help="size factor (default 2)")
    p.add_argument("-i", "--stepbytes", default="0", help="size increment instead of -f")
    p.add_argument("-w", "--warmup_iters", "--warmup", dest="warmup", type=int, default=5,
                   help="warm-up calls per size and backend (default 5)")
    p.add_argument("-n", "--iters", type=int, default=20,
                   help="timed calls per size and backend (default 20)")
    p.add_argument("--iter-budget", default="0",
                   help="cap iterations so iters x size <= this many bytes, e.g. 512M "
                        "(default 0: no cap)")
    p.add_argument("--min-iters", type=int, default=3,
                   help="floor of the --iter-budget cap (default 3)")
    p.add_argument("-d", "--datatype", "--dtype", dest="datatype", default="float",
                   help=f"{', '.join(DTYPES)} (default float)")
    p.add_argument("-o", "--op", default="sum", help=f"{', '.join(REDOPS)} (default sum)")
    p.add_argument("-r", "--root", type=int, default=0, help="broadcast root (default 0)")
    p.add_argument("--mode", default="alternate", choices=MODES,
                   help="order of the timed calls: alternate (A, B, A, B ...; default), "
                        f"back-to-back (blocks of {BLOCK} calls per side), barrier (an untimed "
                        "barrier of the same backend before each call)")
    p.add_argument("--check", type=int, default=1, choices=(0, 1),
                   help="check the first call's result (default 1)")
    p.add_argument("--backend", default=None,
                   help="backend under test (default: nanoccl if it imports, else gloo)")
    p.add_argument("--ab", default=None, metavar="BACKEND",
                   help="reference backend measured in the same launch, e.g. gloo or nccl")
    p.add_argument("--ab-set", action="append", default=[], metavar="NAME=VALUE",
                   help="with --ab nanoccl: a nanoccl setting of the reference side only "
                        "(nanoccl.Options name, e.g. socket_ifname=eth0); repeatable")
    p.add_argument("--compression", default=None, metavar="CODEC",
                   help="nanoccl only: compress the inter-node leg with fp16, bf16, int8 or int4, "
                        "or auto (the codec the cost model predicts fastest per call, "
                        "README \"Tuning\") (Options(compression=CODEC, min_bytes=0)); results "
                        "are checked against the codec's error bound")
    p.add_argument("--block-size", type=int, default=0,
                   help="with --compression int8/int4: elements per scale (0: the codec's)")
    p.add_argument("--encrypt", action="store_true",
                   help="the nanoccl side encrypts its TCP bytes (Options(encrypt=True)); "
                        "with --ab nanoccl the reference side stays plaintext")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="tensor device (auto: cuda when a backend is nccl and CUDA is there)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="process group timeout in seconds, every call's deadline (default 300)")
    p.add_argument("--json", default=None, metavar="PATH", help="write all rows as JSON (rank 0)")
    return p


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def _ensure_env() -> None:
    """A plain `python perf.py` is a world of one."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        collectives = parse_collectives(args.collective)
        sizes = size_list(parse_size(args.minbytes), parse_size(args.maxbytes),
                          args.stepfactor, parse_size(args.stepbytes))
        dtype = parse_dtype(args.datatype)
        redop = args.op.lower()
        if redop not in REDOPS:
            raise ValueError(f"unknown op {args.op!r}: one of {', '.join(REDOPS)}")
        iter_budget = parse_size(args.iter_budget)
    except ValueError as exc:
        parser.error(str(exc))
    if args.iters < 1 or args.warmup < 0:
        parser.error("-n must be >= 1 and -w >= 0")

    _ensure_env()
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    is_root = rank == 0

    usable, where = nanoccl_status()
    backend = args.backend or ("nanoccl" if usable else "gloo")
    notes = []
    if args.backend is None and not usable:
        notes.append(f"nanoccl not available ({where}); testing gloo")
    if "nanoccl" in (backend, args.ab) and not usable:
        if is_root:
            print(f"nanoccl-perf: --backend/--ab nanoccl, but {where}", file=sys.stderr)
        return 2
    uses_nccl = "nccl" in (backend, args.ab)
    if args.device == "auto":
        device = torch.device("cuda" if uses_nccl and torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    if args.ab and args.ab == backend and not args.encrypt and \
            args.compression in (None, "none"):
        notes.append(f"--ab {args.ab} equals --backend: both sides run {backend} "
                     "(the ratio shows run-to-run noise)")

    ab_settings: dict[str, str] = {}
    for item in args.ab_set:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            parser.error(f"--ab-set {item!r}: expected NAME=VALUE")
        ab_settings[name.strip()] = value
    ab_options = None
    if ab_settings:
        if args.ab != "nanoccl":
            parser.error("--ab-set needs --ab nanoccl")
        import nanoccl
        try:
            ab_options = nanoccl.Options(**ab_settings)
        except (ValueError, TypeError) as exc:
            parser.error(f"--ab-set: {exc}")

    timeout = datetime.timedelta(seconds=args.timeout)
    pg_options = None
    codec = args.compression if args.compression not in (None, "none") else None
    settings: dict[str, Any] = {}
    if codec is not None:
        settings.update(compression=codec, min_bytes=0, compression_block=args.block_size)
    # NANOCCL_COMPRESSION compresses every nanoccl group made without Options (above
    # NANOCCL_COMPRESSION_MIN_BYTES): such a side is labelled with it, and checked against the
    # codec's error bound.
    env_codec = os.environ.get("NANOCCL_COMPRESSION", "").strip().lower()
    if (env_codec not in CODEC_UNIT and env_codec != "auto") or env_codec == "none":
        env_codec = ""
    if env_codec and "nanoccl" in (backend, args.ab):
        notes.append(f"NANOCCL_COMPRESSION={env_codec} in the environment: nanoccl groups "
                     "compress their inter-node leg, where there is one, from "
                     "NANOCCL_COMPRESSION_MIN_BYTES; their results are checked against "
                     f"{env_codec}'s error bound")
    if args.encrypt:
        settings["encrypt"] = True
    if settings:
        if backend != "nanoccl":
            parser.error("--compression and --encrypt need --backend nanoccl")
        import nanoccl
        pg_options = nanoccl.Options(**settings)
    dist.init_process_group(backend=backend, timeout=timeout, pg_options=pg_options,
                            device_id=device if device.type == "cuda" else None)
    try:
        ctrl = dist.new_group(backend="gloo", timeout=timeout)
        side_codec = codec or (env_codec if backend == "nanoccl" else None)
        label = backend + (f"+{side_codec}" if side_codec else "") + ("+aes" if args.encrypt else "")
        sides = [Side(label, backend, dist.group.WORLD, side_codec)]
        if args.ab:
            label_b = args.ab if args.ab != backend else f"{args.ab}(ref)"
            ab_codec = env_codec if args.ab == "nanoccl" and env_codec else None
            label_b += f"+{ab_codec}" if ab_codec else ""
            if ab_settings:  # the settings name the side; a codec among them is its codec
                label_b = args.ab + "(" + ",".join(f"{k}={v}" for k, v in ab_settings.items()) + ")"
                if "compression" in ab_settings:
                    ab_codec = ab_settings["compression"].lower() or None
                    ab_codec = None if ab_codec == "none" else ab_codec
            sides.append(Side(label_b, args.ab, dist.new_group(backend=args.ab, timeout=timeout,
                                                               pg_options=ab_options),
                              ab_codec))
        labels = [s.label for s in sides]
        opts = Options(collectives, sizes, dtype, redop, args.root, args.warmup, args.iters,
                       iter_budget, args.min_iters, bool(args.check), device, args.mode)
        nodes = _env_int("GROUP_WORLD_SIZE", max(1, world // max(local_world, 1)))
        if is_root:
            print(f"# nanoccl-perf: {world} rank(s) ({nodes} node(s) x {local_world}), "
                  f"backend {' vs '.join(labels)}, device {device.type}, torch {torch.__version__}")
            print(f"# sizes {format_size(sizes[0])}..{format_size(sizes[-1])}, "
                  f"warmup {args.warmup},"
                  f" iters {args.iters}" + (f" (capped at {format_size(iter_budget)} per size, "
                                            f"min {args.min_iters})" if iter_budget else "")
                  + f", check {'on' if args.check else 'off'}, mode {args.mode}")
            for note in notes:
                print(f"# note: {note}")
            if len(sides) > 1:
                order = {"alternate": f"calls alternate {labels[0]}, {labels[1]}, ...",
                         "back-to-back": f"blocks of {BLOCK} calls alternate",
                         "barrier": "calls alternate, each after a barrier"}[args.mode]
                print(f"# speedup = {labels[1]} time / {labels[0]} time "
                      f"(>1: {labels[0]} faster); {order}")
        all_rows: list[Row] = []
        wrong = 0
        for name in collectives:
            if is_root:
                print("#")
                print(f"# {name}  (busbw = algbw x {bus_factor(name, world):.4g})")
                for line in header(labels):
                    print(line)

            def emit(rows: list[Row]) -> None:
                if is_root:
                    print(format_rows(rows), flush=True)

            res = measure(name, sides, ctrl, opts, rank, world, emit)
            all_rows.extend(res.rows)
            wrong += res.wrong
            if is_root:
                for line in summary_lines(res.rows, labels):
                    print(line)
        stats: list[Any] = [None] * world
        dist.all_gather_object(stats, _nanoccl_stats(sides), group=ctrl)
        if is_root and stats[0] is not None:
            print(f"# {_stats_line(stats)}")
        if is_root and args.json:
            _write_json(args.json, all_rows, labels, sides, world, nodes, local_world, device,
                        usable, where, notes, args, stats if stats[0] is not None else None)
        dist.barrier(group=ctrl)
    finally:
        dist.destroy_process_group()
    return 1 if wrong else 0


def _nanoccl_stats(sides: list[Side]) -> Any:
    """This rank's nanoccl.stats() of the nanoccl side (None without one)."""
    for side in sides:
        if side.backend == "nanoccl":
            try:
                import nanoccl
                return nanoccl.stats(side.group)  # type: ignore[attr-defined]
            except Exception as exc:  # the stats API is optional for this tool
                return {"error": f"{type(exc).__name__}: {exc}"}
    return None


def _stats_line(stats: list[Any]) -> str:
    """Bytes all ranks sent through nanoccl, per link class (warm-up and checks included)."""
    if any("error" in s for s in stats):
        return f"nanoccl stats unavailable: {stats[0].get('error', '?')}"
    links: dict[str, int] = {}
    for s in stats:
        for link, counts in s.get("per_link", {}).items():
            links[link] = links.get(link, 0) + int(counts.get("bytes_sent", 0))
    rails: dict[str, int] = {}  # per network interface of tcp; only worth a word with several
    for s in stats:
        for ifname, counts in s.get("per_rail", {}).items():
            rails[ifname] = rails.get(ifname, 0) + int(counts.get("bytes_sent", 0))
    total = sum(int(s.get("bytes_sent", 0)) for s in stats)
    parts = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(links.items()))
    per_rail = ""
    if len(rails) > 1:
        per_rail = "; tcp per rail: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in rails.items())
    return (f"nanoccl sent {total / 1e6:.1f} MB over all ranks ({parts}{per_rail}), "
            "warm-up and checks included")


def _write_json(path: str, rows: list[Row], labels: list[str], sides: list[Side], world: int,
                nodes: int, local_world: int, device: torch.device, usable: bool, where: str,
                notes: list[str], args: argparse.Namespace, stats: list[Any] | None) -> None:
    speedups = []
    if len(labels) > 1:
        by_key: dict[tuple[str, int], dict[str, Row]] = {}
        for row in rows:
            by_key.setdefault((row.collective, row.size), {})[row.label] = row
        for (coll, size), pair in by_key.items():
            a, b = pair.get(labels[0]), pair.get(labels[1])
            if a and b and a.time_us > 0:
                speedups.append({"collective": coll, "size": size,
                                 "speedup": b.time_us / a.time_us})
    doc = {
        "tool": "nanoccl-perf",
        "meta": {
            "world_size": world, "nodes": nodes, "local_world_size": local_world,
            "labels": labels, "backends": [s.backend for s in sides],
            "device": device.type, "torch": torch.__version__, "host": platform.node(),
            "nanoccl_available": usable, "nanoccl": where, "notes": notes,
            "argv": sys.argv, "time": datetime.datetime.now().isoformat(timespec="seconds"),
            "env": {k: v for k, v in os.environ.items()
                    if k.startswith(("NANOCCL_", "GLOO_", "NCCL_"))},
        },
        "rows": [asdict(r) for r in rows],
        "speedup": speedups,
        "nanoccl_stats": stats,
    }
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
