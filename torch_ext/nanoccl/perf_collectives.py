"""What nanoccl-perf measures: sizes, data types and reduction ops, the pattern every rank's
input holds and the check of every result against it, and the table of collectives.

A collective is one row of COLLECTIVES: its bus factor (nccl-tests' busbw / algbw), how to
make its buffers for a size, how to call it on a group and how to check what the call
produced. Results of a lossy nanoccl codec are checked against the error it allows
(checked_dtype). The timing loop and the command line are in perf.py, the table and JSON
output in perf_report.py.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

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
