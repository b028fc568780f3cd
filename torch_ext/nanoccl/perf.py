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
at least 5 ms of untimed calls of the same side, BLOCK_LEAD_S), as a training
step issues them; --mode barrier puts an untimed barrier of the same backend before every timed call,
so that every rank starts it together. Before the first timed call every side
runs untimed 4-byte allreduces for --settle-s seconds (0.5), so that the first
size measured is not the launch's start-up (SETTLE_S).

``--ab B`` measures a second backend in the same launch: the default group
runs the backend under test (--backend, "nanoccl" when it imports), a group
made with new_group(backend=B) runs the reference, and the two alternate
call by call (A, B, A, B ...) so that drift hits both alike. The "speedup"
column is reference time / tested time: above 1 the tested backend is faster.
With ``--ab nanoccl``, ``--ab-set NAME=VALUE`` (repeatable) gives the reference
side its own nanoccl settings, e.g. ``--ab-set socket_ifname=eth0`` to time
every rail against one in the same launch.
Bookkeeping (the ranks' agreements and the gathering of results) goes through the process
group's store, never timed and with no group of its own (Bookkeeping).

The tool is three modules: perf_collectives.py (sizes, data types, the input pattern and the
check of results, the table of collectives), perf_report.py (rows, statistics, the printed
table, the JSON document) and this one (backends and the groups that run them, the timing loop,
the command line). Their public names are all importable from here.
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
import math  # noqa: E402
import pickle  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any, Callable, Iterable, Sequence  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if not __package__:
    # Not imported as nanoccl.perf: run as a script, or loaded from this file (as the tests do,
    # to need no built package). The sibling modules imported below are then loaded from the
    # files next to this one, under their package names, without importing the nanoccl
    # package: that loads the extension, which only nanoccl_status() tries (it may be missing).
    import importlib.util

    for _sibling in ("cli", "perf_collectives", "perf_report"):
        _qualified = f"nanoccl.{_sibling}"
        if _qualified not in sys.modules:
            _spec = importlib.util.spec_from_file_location(
                _qualified, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                         f"{_sibling}.py"))
            assert _spec is not None and _spec.loader is not None
            sys.modules[_qualified] = importlib.util.module_from_spec(_spec)
            _spec.loader.exec_module(sys.modules[_qualified])

# Some of these names are not used here, only imported from here (nanoccl.perf.<name>, by the
# tests and bench/tune_grid.py): hence F401.
from nanoccl.cli import OneLineParser  # noqa: E402
from nanoccl.perf_collectives import (CHECK_CHUNK, CODEC_UNIT, COLLECTIVES,  # noqa: E402, F401
                                      DEFAULT_ALLOW, DTYPES, PERIOD, REDOPS, Buffers, Collective,
                                      DType, bus_factor, checked_dtype, codec_unit, count_wrong,
                                      fill_pattern, format_size, parse_collectives, parse_dtype,
                                      parse_size, pattern_row, reduced_row, size_list)
from nanoccl.perf_report import (Row, Side, _model_lines, _plans,  # noqa: E402, F401
                                 _stats_line, _write_json, format_rows, header, modelled_since,
                                 percentile, summary_lines)


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


# ------------------------------------------------------------ measurement
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
# In back-to-back mode each block starts after at least this long of its own side's untimed
# calls (one at least). The other side's block leaves the processes placed for its work, and a
# block of small calls measured right after it would not reach its own steady state
# (results/latency/README.md).
BLOCK_LEAD_S = 0.005
# Before the first timed call every side runs untimed 4-byte allreduces for this long
# (--settle-s), in rounds of SETTLE_ROUND calls a side: a launch's first second, while the
# scheduler places the processes, runs small calls several times slower than its steady
# state, which would otherwise be the first size's figure (results/latency/README.md).
SETTLE_S = 0.5
SETTLE_ROUND = 50


def iterations_for(size: int, opts: Options) -> int:
    """-n, capped so that iters x size stays within --iter-budget (at least --min-iters)."""
    if opts.iter_budget <= 0:
        return opts.iters
    return max(min(opts.min_iters, opts.iters), min(opts.iters, opts.iter_budget // max(size, 1)))


class Bookkeeping:
    """What the ranks agree on and gather outside the timed calls (the blocks' lead, the end
    of the settle, the times, the stats), through the process group's store (the rendezvous'
    key-value store), not through a process group: a gloo group's TCP loop thread wakes every
    10 ms whatever it carries, and where the ranks' calling threads fill the cores each
    wake-up takes a core from a timed call (results/latency/README.md).
    Round n's keys are "nanoccl-perf/<n>/<rank>"; a rank removes its key of round n - 1 in
    round n, when every rank has written round n and so has read round n - 1. A rank that
    does not come fails the others' store reads after the store's timeout (--timeout)."""

    def __init__(self, store: Any, rank: int, world: int) -> None:
        self._store = store
        self._rank = rank
        self._world = world
        self._round = 0

    @staticmethod
    def _key(round_: int, rank: int) -> str:
        return f"nanoccl-perf/{round_}/{rank}"

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (picklable), by rank."""
        if self._store is None or self._world <= 1:
            return [obj]
        self._round += 1
        self._store.set(self._key(self._round, self._rank), pickle.dumps(obj))
        gathered = [pickle.loads(self._get(self._key(self._round, r), r, f"round {self._round}"))
                    for r in range(self._world)]
        if self._round > 1:
            self._store.delete_key(self._key(self._round - 1, self._rank))
        return gathered

    def agree(self, values: list[int], reduce: Callable[[Iterable[int]], int]) -> list[int]:
        """`values` reduced element by element over the ranks with `reduce` (min, max), so that
        every rank makes the same calls after."""
        ranks = self.all_gather(values)
        return [reduce(r[i] for r in ranks) for i in range(len(values))]

    def close(self) -> None:
        """The last round: returns on rank 0 only once every rank has read everything, as
        rank 0's process may hold the store (a rendezvous without torchrun's agent)."""
        self.all_gather(None)
        if self._store is None or self._world <= 1:
            return
        self._store.set(f"nanoccl-perf/done/{self._rank}", b"")
        if self._rank == 0:
            for r in range(self._world):
                self._get(f"nanoccl-perf/done/{r}", r, "the end")

    def _get(self, key: str, rank: int, what: str) -> bytes:
        """The store's value of `key`, which `rank` writes; waits up to the store's timeout."""
        try:
            return self._store.get(key)
        except dist.DistError as exc:  # the store's timeout, or its connection
            raise RuntimeError(
                f"nanoccl-perf: rank {self._rank}: rank {rank} did not come to {what} of the "
                f"bookkeeping (the untimed agreements and results) within the store's timeout "
                f"(--timeout): it died, or the ranks were not given the same options "
                f"({type(exc).__name__}: {exc})") from exc


def block_lead(warm_s: list[float], calls: int, book: Bookkeeping | None) -> list[int]:
    """Untimed calls before each back-to-back block, per side: BLOCK_LEAD_S over the side's
    mean call (`warm_s` seconds over `calls` warm-up calls; the slowest rank's, so that every
    rank makes as many), 1 to 1000."""
    lead = [1 if calls <= 0 or s <= 0 else
            min(1000, max(1, math.ceil(BLOCK_LEAD_S / (s / calls)))) for s in warm_s]
    return book.agree(lead, max) if book is not None else lead


def settle(sides: list[Side], book: Bookkeeping, seconds: float,
           device: torch.device) -> tuple[int, float]:
    """Untimed 4-byte allreduces on every side (SETTLE_ROUND a side in turn) until every rank
    has run them for `seconds`; the ranks agree after each round (Bookkeeping), so that they
    make the same calls. Returns (calls a side, seconds this rank took)."""
    if seconds <= 0:
        return 0, 0.0
    t = torch.zeros(1, device=device)  # sums of zeros: nothing grows
    start = time.perf_counter()
    calls = 0
    while True:
        for side in sides:
            for _ in range(SETTLE_ROUND):
                dist.all_reduce(t, group=side.group)
        _sync(device)
        calls += SETTLE_ROUND
        took = time.perf_counter() - start
        if book.agree([int(took >= seconds)], min)[0]:
            return calls, took


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name: str, sides: list[Side], book: Bookkeeping, opts: Options, rank: int,
            world: int, on_rows: Callable[[list[Row]], None]) -> Results:
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
        lead: list[int] = []
        if opts.mode == "back-to-back":
            # Back to back, as the blocks run. The lead is priced from the second half of each
            # side's warm-up, its calls after its own: the first follow the other side's, and
            # after Gloo's 5-ms calls (4 ranks, 64 B, 2 cores) nanoccl's next calls ran several
            # times their steady time, which priced 5 ms of lead at a fraction of that.
            warm_s = [0.0] * len(sides)
            priced = opts.warmup - opts.warmup // 2
            for k, side in enumerate(sides):
                for i in range(opts.warmup):
                    refill()
                    start = time.perf_counter()
                    coll.call(bufs, side.group, op)
                    _sync(opts.device)
                    if i >= opts.warmup // 2:
                        warm_s[k] += time.perf_counter() - start
            lead = block_lead(warm_s, priced, book)
        else:
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
                    for _ in range(lead[k]):  # untimed: the block's first calls follow the
                        refill()              # other side's (BLOCK_LEAD_S)
                        coll.call(bufs, sides[k].group, op)
                    _sync(opts.device)
                    for _ in range(n):
                        timed(k)
                done += n
        else:
            for _ in range(iters):
                for k in range(len(sides)):
                    timed(k)
        after = [_modelled(side) for side in sides]
        gathered = book.all_gather((times, wrong_local))
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


# --------------------------------------------------------------------- main
# The values --compression takes: the codecs, "none", and "auto" (the cost model's choice).
COMPRESSION_CHOICES = (*CODEC_UNIT, "auto")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
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
    p.add_argument("--settle-s", type=float, default=SETTLE_S, metavar="SECONDS",
                   help="untimed 4-byte allreduces on every side for this long before the "
                        f"first timed call: the launch's start-up is not measured (default "
                        f"{SETTLE_S}; 0: none)")
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
                        "docs/tuning.md) (Options(compression=CODEC, min_bytes=0)); results "
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
    p.add_argument("--bind", action="store_true",
                   help="pin each rank's calling thread to one CPU (local rank i on the i-th "
                        "CPU it may use, modulo their number) once the groups are made, as MPI "
                        "latency benchmarks bind their ranks; the backends' own threads keep "
                        "every CPU")
    p.add_argument("-J", "--json", dest="json", default=None, metavar="PATH",
                   help="write all rows as JSON (rank 0), as nccl-tests' -J does")
    p.add_argument("--wide", action="store_true",
                   help="print every column (type, op, root, algbw, min, median, max) instead "
                        "of the table that fits 120 columns")
    return p


def check_backends(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """--backend, --ab and --compression values this torch knows, before any group is made."""
    known = [b for b in dist.Backend.backend_list if b != "undefined"]
    for flag, name in (("--backend", args.backend), ("--ab", args.ab)):
        if name is None:
            continue
        if name not in known:
            parser.error(f"{flag} {name}: not a torch.distributed backend here "
                         f"(one of {', '.join(known)})")
        if name == "nccl" and not dist.is_nccl_available():
            parser.error(f"{flag} nccl: this torch build has no NCCL")
    if args.compression is not None:
        if args.compression.lower() not in COMPRESSION_CHOICES:
            parser.error(f"--compression {args.compression}: one of "
                         f"{', '.join(COMPRESSION_CHOICES)}")
        args.compression = args.compression.lower()


def bind_calling_thread(local_rank: int) -> int | None:
    """Pins the calling thread to one CPU of those it may use (local rank i on the i-th, modulo
    their number); returns that CPU, or None where the platform cannot pin. Without it the
    scheduler can run two ranks on one CPU for a whole block, each call then waiting for the
    other rank's turn on that CPU."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[local_rank % len(cpus)]
    os.sched_setaffinity(0, {cpu})  # pid 0: the calling thread only
    return cpu


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def _ensure_env() -> bool:
    """A plain `python perf.py` is a world of one; False then (no launcher), else True."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return True
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    return False


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
    if not args.settle_s >= 0 or math.isinf(args.settle_s):
        parser.error(f"--settle-s must be a number of seconds >= 0, not {args.settle_s}")

    launched = _ensure_env()
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    is_root = rank == 0

    usable, where = nanoccl_status()
    check_backends(args, parser)
    backend = args.backend or ("nanoccl" if usable else "gloo")
    notes = []
    if not launched:
        print("nanoccl-perf: not started by a launcher (no RANK and WORLD_SIZE): measuring one "
              "rank; run it under torchrun --nproc-per-node N (and --nnodes) for more",
              file=sys.stderr)
        notes.append("not started by a launcher: one rank")
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
        # More local ranks than GPUs (emulated nodes sharing one GPU): ranks share them in turn.
        index = local_rank % max(torch.cuda.device_count(), 1)
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
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
        # The default group's store, which c10d names only privately (torch 2.13 here).
        book = Bookkeeping(dist.distributed_c10d._get_default_store(), rank, world)
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
        # After the groups: the threads they made keep every CPU.
        bound = bind_calling_thread(local_rank) if args.bind else None
        if args.bind and bound is None:
            notes.append("--bind: this platform cannot pin threads; not bound")
        settled_calls, settled_s = settle(sides, book, args.settle_s, device)
        if settled_calls:
            notes.append(f"settled for {settled_s:.2f} s before the first timed call "
                         f"({settled_calls} untimed 4-byte allreduces a side, --settle-s)")
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
                  + f", check {'on' if args.check else 'off'}, mode {args.mode}"
                  + (", calling threads bound to a CPU each (--bind)" if bound is not None
                     else ""))
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
                print(f"# {name}  ({args.datatype} {redop}"
                      + (f", root {args.root}" if name == "broadcast" else "")
                      + f"; busbw = algbw x {bus_factor(name, world):.4g})")
                for line in header(labels, args.wide):
                    print(line)

            def emit(rows: list[Row]) -> None:
                if is_root:
                    print(format_rows(rows, args.wide), flush=True)

            res = measure(name, sides, book, opts, rank, world, emit)
            all_rows.extend(res.rows)
            wrong += res.wrong
            if is_root:
                for line in summary_lines(res.rows, labels):
                    print(line)
        stats = book.all_gather(_nanoccl_stats(sides))
        if is_root and stats[0] is not None:
            print(f"# {_stats_line(stats)}")
        if is_root and args.json:
            _write_json(args.json, all_rows, labels, sides, world, nodes, local_world, device,
                        usable, where, notes, args, stats if stats[0] is not None else None)
        book.close()
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


if __name__ == "__main__":
    sys.exit(main())
