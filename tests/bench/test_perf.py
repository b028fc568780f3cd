"""nanoccl-perf: option parsing, bus factors, checking, and real runs on gloo."""

from __future__ import annotations

import datetime
import json
import os
import pickle
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from bench_helpers import PERF, REPO, torchrun

COLUMNS = ["size", "count", "time", "busbw", "#wrong", "p99"]  # the default table, per side
WIDE_COLUMNS = ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                "min", "median", "p99", "max"]  # --wide
# Where a side's #wrong and time are among the fields of a default row: size, count, then per
# side time, busbw, #wrong, p99.
WRONG, TIME, PER_SIDE = 4, 2, 4


@pytest.mark.parametrize("text, expected", [
    ("8", 8), ("1K", 1024), ("1k", 1024), ("1M", 1 << 20), ("256M", 256 << 20),
    ("1G", 1 << 30), ("4KB", 4096), ("2MiB", 2 << 20), ("0.5K", 512), (" 32 ", 32),
])
def test_parse_size(perf: ModuleType, text: str, expected: int) -> None:
    assert perf.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1X", "-1", "1.3"])
def test_parse_size_rejects(perf: ModuleType, text: str) -> None:
    with pytest.raises(ValueError):
        perf.parse_size(text)


def test_size_list(perf: ModuleType) -> None:
    assert perf.size_list(1 << 20, 256 << 20, 2) == [1 << k for k in range(20, 29)]
    assert perf.size_list(8, 128, 4) == [8, 32, 128]
    assert perf.size_list(8, 100, 4) == [8, 32]
    assert perf.size_list(1024, 4096, 2, step=1024) == [1024, 2048, 3072, 4096]
    assert perf.size_list(64, 64, 2) == [64]
    with pytest.raises(ValueError):
        perf.size_list(128, 64, 2)
    with pytest.raises(ValueError):
        perf.size_list(1, 64, 1.0)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_bus_factors_match_nccl_tests(perf: ModuleType, world: int) -> None:
    n = world
    assert perf.bus_factor("allreduce", n) == pytest.approx(2 * (n - 1) / n)
    for name in ("allgather", "reduce_scatter", "alltoall"):
        assert perf.bus_factor(name, n) == pytest.approx((n - 1) / n)
    assert perf.bus_factor("broadcast", n) == 1.0
    assert perf.bus_factor("sendrecv", n) == 1.0


def test_parse_collectives(perf: ModuleType) -> None:
    assert perf.parse_collectives([]) == ["allreduce"]
    assert perf.parse_collectives(["allreduce,all_gather", "bcast"]) == [
        "allreduce", "allgather", "broadcast"]
    assert perf.parse_collectives(["all"]) == list(perf.COLLECTIVES)
    with pytest.raises(ValueError):
        perf.parse_collectives(["allreduz"])


def test_iteration_budget(perf: ModuleType) -> None:
    opts = perf.Options(["allreduce"], [], perf.DTYPES["float"], "sum", 0, 1, 20,
                        512 << 20, 3, True, torch.device("cpu"))
    assert perf.iterations_for(1 << 20, opts) == 20
    assert perf.iterations_for(64 << 20, opts) == 8
    assert perf.iterations_for(256 << 20, opts) == 3  # the floor
    opts.iter_budget = 0
    assert perf.iterations_for(256 << 20, opts) == 20


@pytest.mark.parametrize("dtype", ["float", "half", "bfloat16", "double", "int8", "uint8",
                                   "int32", "int64"])
@pytest.mark.parametrize("redop", ["sum", "prod", "min", "max"])
def test_expected_values_match_a_local_reduction(perf: ModuleType, dtype: str,
                                                 redop: str) -> None:
    """The period-based reference equals reducing the ranks' actual buffers."""
    world, count, phase = 4, 1000, 7
    d = perf.DTYPES[dtype]
    bufs = []
    for r in range(world):
        t = torch.empty(count, dtype=d.torch_dtype)
        perf.fill_pattern(t, perf.pattern_row(r, d.torch_dtype, redop, phase))
        bufs.append(t)
    stacked = torch.stack([b.to(torch.float64) for b in bufs])
    ref = {"sum": stacked.sum(0), "prod": stacked.prod(0), "min": stacked.min(0).values,
           "max": stacked.max(0).values}[redop].to(d.torch_dtype)
    assert perf.count_wrong(ref, perf.reduced_row(world, d.torch_dtype, redop, phase), d.rtol) == 0
    ref[5] += 1
    ref[999] += 1
    assert perf.count_wrong(ref, perf.reduced_row(world, d.torch_dtype, redop, phase), d.rtol) == 2


def test_patterns_tell_ranks_apart(perf: ModuleType) -> None:
    rows = [perf.pattern_row(r, torch.float32, "sum") for r in range(13)]
    for a in range(13):
        for b in range(a + 1, 13):
            assert not torch.equal(rows[a], rows[b])


def test_header_and_rows_line_up(perf: ModuleType) -> None:
    row = perf.Row("allreduce", "gloo", "gloo", 1 << 20, 1 << 18, "float", "sum", -1, 20,
                   1234.5, 0.85, 1.27, 0, 1000.0, 1200.0, 1500.0)
    for labels, rows in ((["gloo"], [row]), (["nanoccl", "gloo"], [row, row])):
        for wide in (False, True):
            header = perf.header(labels, wide)
            line = perf.format_rows(rows, wide)
            assert len(header[-1].rstrip()) <= len(line) + 8
            fields = line.split()
            if wide:
                assert fields[:5] == ["1048576", "262144", "float", "sum", "-1"]
                assert len(fields) == 5 + 8 * len(rows) + (len(rows) > 1) + 1
            else:  # nccl-tests' columns that matter, in 120 columns with two sides
                assert fields[:2] == ["1048576", "262144"] and fields[WRONG] == "0"
                assert float(fields[TIME]) == pytest.approx(1234.5)
                assert max(len(x) for x in [*header, line]) <= 120
            if len(labels) > 1:
                assert "speedup" in header[-2]
                assert float(fields[-2]) == pytest.approx(1.0)


def _parse_table(stdout: str, columns_per_side: int = 7) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines()
            if line.strip() and not line.startswith("#") and re.match(r"^\s*\d", line)]


def test_perf_all_collectives_on_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "perf.json"
    proc = torchrun(2, [str(PERF), "-c", "all", "-b", "8", "-e", "256K", "-f", "32",
                        "-w", "1", "-n", "3", "--backend", "gloo", "--json", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stdout = proc.stdout
    for name in ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast",
                 "sendrecv", "barrier"):
        assert f"# {name}" in stdout
    header = [line for line in stdout.splitlines() if line.startswith("#") and "busbw" in line
              and "#wrong" in line][0]
    positions = [header.find(c) for c in COLUMNS]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), header
    rows = _parse_table(stdout)
    assert len(rows) == 6 * 4 + 1  # sizes 8, 256, 8K, 256K; one barrier row
    for fields in rows:
        assert fields[WRONG] == "0", fields
        assert float(fields[TIME]) > 0
    assert stdout.count("# Out of bounds values : 0 OK") == 7
    assert "# Avg bus bandwidth" in stdout
    doc = json.loads(out.read_text())
    assert doc["meta"]["world_size"] == 2
    assert {r["collective"] for r in doc["rows"]} == {
        "allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "sendrecv",
        "barrier"}
    for r in doc["rows"]:
        assert r["wrong"] == 0
        assert r["min_us"] <= r["median_us"] <= r["p99_us"] <= r["max_us"]
        factor = {"allreduce": 1.0, "broadcast": 1.0, "sendrecv": 1.0,
                  "barrier": 0.0}.get(r["collective"], 0.5)
        assert r["busbw"] == pytest.approx(r["algbw"] * factor)


def test_perf_ab_dtypes_and_ops(tmp_path: Path) -> None:
    """--ab runs both sides interleaved; int and half types and min/prod check out."""
    for dtype, op in (("int32", "prod"), ("half", "max")):
        out = tmp_path / f"ab_{dtype}.json"
        proc = torchrun(2, [str(PERF), "-c", "allreduce,reduce_scatter", "-b", "1K", "-e", "64K",
                            "-f", "8", "-w", "0", "-n", "2", "-d", dtype, "-o", op,
                            "--backend", "gloo", "--ab", "gloo", "--json", str(out)])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "speedup" in proc.stdout and "gloo(ref)" in proc.stdout
        doc = json.loads(out.read_text())
        assert doc["meta"]["labels"] == ["gloo", "gloo(ref)"]
        assert len(doc["speedup"]) == len(doc["rows"]) // 2 == 2 * 3
        assert all(r["wrong"] == 0 and r["type"] == dtype for r in doc["rows"])
        for fields in _parse_table(proc.stdout):
            assert fields[WRONG] == "0" and fields[WRONG + PER_SIDE] == "0", fields


@pytest.mark.parametrize("mode", ["back-to-back", "barrier"])
def test_perf_latency_modes(tmp_path: Path, mode: str) -> None:
    """Small sizes and the barrier in each latency mode, both sides, results checked."""
    out = tmp_path / "lat.json"
    proc = torchrun(2, [str(PERF), "-c", "allreduce,barrier", "-b", "4", "-e", "64K", "-f", "64",
                        "-w", "2", "-n", "60", "--mode", mode, "--backend", "gloo",
                        "--ab", "gloo", "--json", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"mode {mode}" in proc.stdout
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert [(r["collective"], r["size"]) for r in rows if r["label"] == "gloo"] == [
        ("allreduce", 4), ("allreduce", 256), ("allreduce", 16384), ("barrier", 0)]
    for r in rows:
        assert r["wrong"] == 0 and r["iters"] == 60
        assert 0 < r["min_us"] <= r["median_us"] <= r["p99_us"] <= r["max_us"]
    assert len(doc["speedup"]) == 4


def test_block_lead(perf: ModuleType) -> None:
    """Back-to-back blocks start after BLOCK_LEAD_S of their side's calls: 5 ms over the mean
    priced warm-up call, at least one and at most 1000."""
    assert perf.BLOCK_LEAD_S == 0.005
    assert perf.block_lead([0.01, 1.0], 100, None) == [50, 1]  # 100 us a call; 10 ms a call
    assert perf.block_lead([1e-9, 0.0], 100, None) == [1000, 1]
    assert perf.block_lead([0.5, 0.5], 0, None) == [1, 1]  # no warm-up: one call, as before


def _on_threads(world: int, rank_body: Callable[[int], Any]) -> dict[int, Any]:
    """rank_body(rank) on one thread a rank; their results, or the first error raised."""
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = rank_body(rank)
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    if errors:
        raise errors[0]
    return results


def test_bookkeeping_gathers_and_agrees_through_the_store(perf: ModuleType) -> None:
    """The ranks' untimed agreements and gathered results go through the store (no process
    group, whose threads would wake while calls are timed): every round gives every rank's
    object in rank order, agree() reduces element by element, and a rank removes its key of a
    round once all have moved on, so the store does not grow with a launch."""
    store = dist.HashStore()
    world, rounds = 3, 4

    def rank_body(rank: int) -> list[Any]:
        book = perf.Bookkeeping(store, rank, world)
        seen = [book.all_gather((rank, n, "x" * rank)) for n in range(rounds)]
        seen.append(book.agree([rank, 10 - rank], max))
        seen.append(book.agree([rank, 10 - rank], min))
        book.close()
        return seen

    for seen in _on_threads(world, rank_body).values():
        assert seen[:rounds] == [[(q, n, "x" * q) for q in range(world)] for n in range(rounds)]
        assert seen[rounds:] == [[2, 10], [0, 8]]
    last = rounds + 3  # two agreements, then close()'s round
    assert not any(store.check([f"nanoccl-perf/{n}/{q}"])
                   for n in range(1, last) for q in range(world))
    assert all(store.check([f"nanoccl-perf/{last}/{q}"]) for q in range(world))
    # A world of one, or no store: nothing to agree with.
    assert perf.Bookkeeping(None, 0, 1).agree([3], max) == [3]
    assert perf.Bookkeeping(store, 0, 1).all_gather("alone") == ["alone"]


def test_bookkeeping_names_the_rank_that_does_not_come(perf: ModuleType) -> None:
    """A rank that never reaches a round (it died, or was given other options) fails the
    others' round within the store's timeout, naming it, rather than hanging."""
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=1))
    book = perf.Bookkeeping(store, 0, 3)
    store.set("nanoccl-perf/1/1", pickle.dumps("rank 1 came"))
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 0: rank 2 did not come to round 1 of the "
                                           r"bookkeeping .*within the store's timeout"):
        book.all_gather("rank 0 came")
    assert time.monotonic() - start < 30
    # Nor does rank 0 wait past the timeout at the end for a rank that never says it is done.
    alone = perf.Bookkeeping(store, 0, 2)  # rank 1's key of round 1 is there (above)
    with pytest.raises(RuntimeError, match=r"rank 0: rank 1 did not come to the end of the "
                                           r"bookkeeping"):
        alone.close()


def test_settle_runs_every_side_until_the_time(tmp_path: Path) -> None:
    """--settle-s: untimed allreduces on both sides before the first timed call, the ranks
    agreeing when to stop (a rank that stopped alone would leave its peer's call hanging);
    0 runs none."""
    for seconds, settled in (("0.3", True), ("0", False)):
        out = tmp_path / f"settle_{seconds}.json"
        proc = torchrun(2, [str(PERF), "-b", "64", "-e", "64", "-w", "0", "-n", "2",
                            "--backend", "gloo", "--ab", "gloo", "--settle-s", seconds,
                            "--json", str(out)])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        notes = json.loads(out.read_text())["meta"]["notes"]
        lines = [n for n in notes if n.startswith("settled for ")]
        assert bool(lines) == settled, notes
        if settled:
            took, calls = re.match(r"settled for ([0-9.]+) s before the first timed call "
                                   r"\((\d+) untimed", lines[0]).groups()
            assert float(took) >= 0.3 and int(calls) % 50 == 0 and int(calls) >= 50
            assert f"# note: {lines[0]}" in proc.stdout


def test_bind_calling_thread(perf: ModuleType) -> None:
    """--bind pins the calling thread alone: local rank i on the i-th CPU it may use, modulo."""
    cpus = sorted(os.sched_getaffinity(0))
    seen: dict[int, tuple[int | None, set[int]]] = {}

    def pin(local_rank: int) -> None:
        seen[local_rank] = (perf.bind_calling_thread(local_rank), os.sched_getaffinity(0))

    for local_rank in (0, 1, len(cpus) + 1):
        t = threading.Thread(target=pin, args=(local_rank,))
        t.start()
        t.join()
        want = cpus[local_rank % len(cpus)]
        assert seen[local_rank] == (want, {want})
    assert sorted(os.sched_getaffinity(0)) == cpus  # this thread keeps every CPU


def test_percentile(perf: ModuleType) -> None:
    values = list(range(1, 101))
    assert perf.percentile(values, 99) == 99
    assert perf.percentile(values, 100) == 100
    assert perf.percentile([5.0], 99) == 5.0
    assert perf.percentile([3, 1, 2], 50) == 2


def test_perf_single_process_without_torchrun() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, str(PERF), "-b", "64", "-e", "64", "-n", "2",
                           "--backend", "gloo", "--bind"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "1 rank(s)" in proc.stdout and "# Out of bounds values : 0 OK" in proc.stdout
    assert "calling threads bound to a CPU each (--bind)" in proc.stdout


def test_perf_rejects_bad_options() -> None:
    proc = subprocess.run([sys.executable, str(PERF), "-b", "1X"], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and "bad size" in proc.stderr
    for bad in ("-1", "nan", "inf"):
        proc = subprocess.run([sys.executable, str(PERF), "--settle-s", bad],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert proc.returncode == 2 and "--settle-s must be" in proc.stderr, (bad, proc.stderr)


def test_perf_as_module() -> None:
    """`python -m nanoccl.perf` once the package imports (skipped before it is built)."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "torch_ext"))
    probe = subprocess.run([sys.executable, "-c", "import nanoccl"], capture_output=True,
                           text=True, timeout=60, env=env)
    if probe.returncode != 0:
        pytest.skip("the nanoccl package does not import yet: "
                    + (probe.stderr.strip().splitlines() or ["?"])[-1])
    proc = subprocess.run([sys.executable, "-m", "nanoccl.perf", "-b", "64", "-e", "64",
                           "-n", "2", "--backend", "gloo"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "# Out of bounds values : 0 OK" in proc.stdout


def test_perf_reads_the_codec_from_the_environment(tmp_path: Path) -> None:
    """NANOCCL_COMPRESSION in the environment compresses the nanoccl side: perf labels it and
    checks against the codec's error bound, instead of reporting lossy results as wrong."""
    probe = subprocess.run([sys.executable, "-c", "import nanoccl"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip("the nanoccl package does not import yet")
    out = tmp_path / "env_codec.json"
    proc = torchrun(2, [str(PERF), "-c", "allreduce", "-b", "64K", "-e", "64K", "-w", "0",
                        "-n", "2", "--backend", "nanoccl", "--ab", "gloo", "--json", str(out)],
                    env={"NANOCCL_COMPRESSION": "int8"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "backend nanoccl+int8 vs gloo" in proc.stdout, proc.stdout
    assert "NANOCCL_COMPRESSION=int8 in the environment" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["meta"]["labels"] == ["nanoccl+int8", "gloo"]
    assert all(r["wrong"] == 0 for r in doc["rows"])


def test_ab_set_gives_the_reference_side_its_own_settings(tmp_path: Path) -> None:
    """--ab nanoccl --ab-set NAME=VALUE: the reference group is made with those settings and
    named by them; malformed or misplaced settings are errors before anything runs."""
    probe = subprocess.run([sys.executable, "-c", "import nanoccl"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip("the nanoccl package does not import yet")
    out = tmp_path / "ab_set.json"
    proc = torchrun(2, [str(PERF), "-c", "allreduce", "-b", "1M", "-e", "1M", "-w", "0", "-n",
                        "2", "--backend", "nanoccl", "--ab", "nanoccl", "--ab-set", "nsocks=1",
                        "--ab-set", "stripe_min_bytes=4096", "--json", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["meta"]["labels"] == ["nanoccl", "nanoccl(nsocks=1,stripe_min_bytes=4096)"]
    assert doc["rows"] and all(r["wrong"] == 0 for r in doc["rows"])
    for args, expected in [(["--ab", "nanoccl", "--ab-set", "nsocks"], "expected NAME=VALUE"),
                           (["--ab", "gloo", "--ab-set", "nsocks=1"], "needs --ab nanoccl"),
                           (["--ab", "nanoccl", "--ab-set", "nsocks=0"], "nsocks")]:
        bad = subprocess.run([sys.executable, str(PERF), "--backend", "nanoccl", *args],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2, bad.stdout + bad.stderr
        assert expected in bad.stderr, bad.stderr


def test_stats_line_names_the_rails_when_there_are_several(perf: ModuleType) -> None:
    def rank(eth0: int, eth1: int | None) -> dict:
        rails = {"eth0": {"bytes_sent": eth0, "bytes_received": 0}}
        if eth1 is not None:
            rails["eth1"] = {"bytes_sent": eth1, "bytes_received": 0}
        total = eth0 + (eth1 or 0)
        return {"bytes_sent": total, "per_link": {"inter-node": {"bytes_sent": total}},
                "per_rail": rails}
    line = perf._stats_line([rank(3_000_000, 1_000_000), rank(2_000_000, 2_000_000)])
    assert "nanoccl sent 8.0 MB over all ranks" in line, line
    assert "tcp per rail: eth0 5.0 MB, eth1 3.0 MB" in line, line
    assert "per rail" not in perf._stats_line([rank(1_000_000, None)])


def test_perf_wide_table_and_short_json_flag(tmp_path: Path) -> None:
    """--wide prints nccl-tests' full columns; -J writes the JSON as --json does."""
    out = tmp_path / "wide.json"
    proc = torchrun(2, [str(PERF), "-b", "1K", "-e", "1K", "-w", "0", "-n", "2",
                        "--backend", "gloo", "--ab", "gloo", "--wide", "-J", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = [line for line in proc.stdout.splitlines() if line.startswith("#")
              and "busbw" in line and "#wrong" in line][0]
    positions = [header.find(c) for c in WIDE_COLUMNS]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), header
    (fields,) = _parse_table(proc.stdout)
    assert fields[:5] == ["1024", "256", "float", "sum", "-1"] and fields[8] == "0"
    assert json.loads(out.read_text())["meta"]["labels"] == ["gloo", "gloo(ref)"]


@pytest.mark.parametrize("argv, says", [
    (["--compression", "int3"], "--compression int3: one of none, fp16, bf16, int8, int4, auto"),
    (["--ab", "foo"], "--ab foo: not a torch.distributed backend here"),
    (["--backend", "bar"], "--backend bar: not a torch.distributed backend here"),
    (["--mode", "sideways"], "argument --mode: invalid choice: 'sideways'"),
])
def test_perf_wrong_value_is_one_line_from_one_rank(argv: list[str], says: str) -> None:
    """Under a launcher every rank parses the same arguments: rank 0 alone says what is wrong,
    in one line, and every rank exits non-zero without a traceback of its own (torchrun then
    reports the failed workers, as it does for any)."""
    proc = torchrun(2, [str(PERF), "-b", "1K", "-e", "1K", *argv], timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    errors = [line for line in text.splitlines() if line.startswith("nanoccl-perf: error:")]
    assert len(errors) == 1 and says in errors[0], text[-3000:]
    assert "perf.py\", line" not in text and "usage:" not in text, text[-3000:]


def test_perf_outside_a_launcher_says_so() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, str(PERF), "-b", "64", "-e", "64", "-n", "1",
                           "-w", "0", "--settle-s", "0", "--backend", "gloo"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "not started by a launcher" in proc.stderr and "torchrun" in proc.stderr
