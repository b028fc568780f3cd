"""nanoccl through torch.distributed, against Gloo (the rank programs are in dist_jobs.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from job_runner import HERE, JobResult, free_port, run_job

REPO = HERE.parent.parent


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "world_size,init,nodes",
    [(1, "env", 1), (2, "env", 1), (3, "tcp", 1), (4, "file", 1), (4, "env", 2)],
    ids=["1", "2", "3", "4", "2x2-nodes"],
)
def test_collectives_match_gloo(world_size: int, init: str, nodes: int) -> None:
    """Every collective, dtype and reduction; subgroups from 3 ranks on.

    nodes=2: the ranks say they are two nodes (NANOCCL_NODE_ID), so the communicator has an
    intra-node and an inter-node level and may run hierarchical algorithms.
    """
    per_node = world_size // nodes
    rank_env = {r: {"NANOCCL_NODE_ID": f"node{r // per_node}"} for r in range(world_size)}
    job = run_job("collectives", world_size, init=init, timeout=140,
                  rank_env=rank_env if nodes > 1 else None)
    results = job.assert_ok()
    assert all(r["checks"] > 100 for r in results), [r["checks"] for r in results]
    # tcp and shm only: libfabric (whose load costs 200 ms) stays out of the process.
    assert not any(r["libfabric_mapped"] for r in results)
    if nodes > 1:
        for r in results:
            links = r["stats"]["per_link"]
            assert links["inter-node"]["bytes_sent"] > 0, r["stats"]
            assert links["intra-node"]["bytes_sent"] > 0, r["stats"]


@pytest.mark.timeout(100)
def test_ddp_matches_gloo() -> None:
    job = run_job("ddp", 2, timeout=90)
    results = job.assert_ok()
    assert results[0]["max_param_diff"] <= 1e-4


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world_size", [2, 3])
def test_bad_input_fails_on_every_rank(world_size: int) -> None:
    """Mismatched calls raise a DistBackendError naming both ranks, on every rank, in time; a
    call one rank refuses is its ValueError (TypeError: a dtype), the group stays usable."""
    job = run_job("errors", world_size, pg_timeout=15, timeout=140)
    job.assert_ok()


@pytest.mark.timeout(90)
def test_killed_peer_fails_the_others() -> None:
    _assert_killed_peer_failed_the_others(run_job("killed_peer", 3, pg_timeout=10, timeout=80))


def _assert_killed_peer_failed_the_others(job: JobResult) -> None:
    """Rank 2 was SIGKILLed; ranks 0 and 1 raised in time and exited cleanly."""
    ranks = job.ranks
    assert ranks[2].returncode == -signal.SIGKILL, job.describe()
    for r in ranks[:2]:
        assert not r.timed_out and r.returncode == 0, job.describe()
        assert r.result is not None and r.result.get("raised"), job.describe()
        assert not r.result["failures"], job.describe()


def _fabric_built() -> bool:
    import nanoccl
    try:
        nanoccl.Options(transport="fabric")
    except ValueError:
        return False
    return True


# The same jobs over the libfabric transport (tcp;ofi_rxm here): between "nodes" (2x2), and
# between every rank (NANOCCL_INTRA_TRANSPORT=fabric too).
FABRIC_ALL = {"NANOCCL_TRANSPORT": "fabric", "NANOCCL_INTRA_TRANSPORT": "fabric"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["collectives-2x2", "collectives-3", "ddp", "errors",
                                  "killed_peer"])
def test_over_the_fabric_transport(case: str) -> None:
    if not _fabric_built():
        pytest.skip("the fabric transport is not built in (libfabric-dev missing at build time)")
    if case == "collectives-2x2":
        rank_env = {r: {"NANOCCL_NODE_ID": f"node{r // 2}"} for r in range(4)}
        job = run_job("collectives", 4, timeout=200, env={"NANOCCL_TRANSPORT": "fabric"},
                      rank_env=rank_env)
        results = job.assert_ok()
        for r in results:
            per_transport = r["stats"]["per_transport"]
            assert per_transport["fabric"]["bytes_sent"] > 0, per_transport
            assert r["libfabric_mapped"]  # loaded by the first fabric transport
    elif case == "collectives-3":
        job = run_job("collectives", 3, init="tcp", timeout=200, env=FABRIC_ALL)
        results = job.assert_ok()
        assert all(r["checks"] > 100 for r in results), [r["checks"] for r in results]
        assert all(set(r["stats"]["per_transport"]) == {"fabric"} for r in results), results[0]
    elif case == "ddp":
        results = run_job("ddp", 2, timeout=90, env=FABRIC_ALL).assert_ok()
        assert results[0]["max_param_diff"] <= 1e-4
    elif case == "errors":
        run_job("errors", 2, pg_timeout=15, timeout=140, env=FABRIC_ALL).assert_ok()
    else:
        _assert_killed_peer_failed_the_others(
            run_job("killed_peer", 3, pg_timeout=10, timeout=80, env=FABRIC_ALL))


@pytest.mark.timeout(60)
def test_rank_that_never_joins() -> None:
    job = run_job("no_show", 2, pg_timeout=5, timeout=50)
    job.assert_ok()


@pytest.mark.timeout(90)
def test_lifecycle_options_stats() -> None:
    """Double init, Options, stats per link class, no thread/socket left, use after destroy."""
    job = run_job("lifecycle", 2, init="tcp", timeout=80)
    job.assert_ok()


@pytest.mark.timeout(90)
def test_device_map_form() -> None:
    job = run_job("device_map", 2, init="file", timeout=80)
    job.assert_ok()


@pytest.mark.timeout(90)
def test_under_torchrun() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="nanoccl-torchrun-"))
    env = dict(os.environ, NANOCCL_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    env.pop("NANOCCL_NODE_ID", None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        str(HERE / "dist_jobs.py"), "torchrun", "--result", str(workdir / "result-{rank}.json"),
        "--deadline", "70",
    ]
    proc = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True, timeout=85)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in range(2):
        result = json.loads((workdir / f"result-{rank}.json").read_text())
        assert result["failures"] == [], result


@pytest.mark.timeout(120)
def test_destroy_right_after_a_collective() -> None:
    """A rank that destroys its group and exits right after its last call does not fail a
    slower peer's share of that call (regression: a clean close on one of the nsocks
    connections used to fail the peer before the others were drained)."""
    for _ in range(3):
        job = run_job("destroy_race", 2, timeout=25)
        job.assert_ok()


def _example_binary() -> Path | None:
    for p in sorted((REPO / "build").glob("**/examples/nanoccl_example_allreduce")):
        if os.access(p, os.X_OK):
            return p
    return None


@pytest.mark.timeout(60)
def test_import_leaves_the_signals_alone(tmp_path: Path) -> None:
    """`import nanoccl` leaves the process's signal handling as it was (libfabric's PSM
    providers' libinfinipath used to catch SIGTERM, SIGSEGV, SIGBUS, SIGILL and SIGABRT as the
    extension loaded): a worker stopped with SIGTERM dies of SIGTERM and writes no backtrace
    file into its working directory."""
    program = (
        "import os, signal\n"
        "def caught():\n"
        "    line = next(l for l in open('/proc/self/status') if l.startswith('SigCgt'))\n"
        "    return int(line.split()[1], 16)\n"
        "before = caught()\n"
        "import nanoccl\n"
        "added = caught() & ~before\n"
        "print('added', [signal.Signals(i).name for i in range(1, 32)\n"
        "                if added >> (i - 1) & 1], flush=True)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "IPATH_NO_BACKTRACE"}
    proc = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=50)
    assert "added []" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
def test_cpp_example() -> None:
    exe = _example_binary()
    if exe is None:
        pytest.skip("the C++ example is not built (cmake --build ... --target "
                    "nanoccl_example_allreduce)")
    workdir = Path(tempfile.mkdtemp(prefix="nanoccl-example-"))
    store = workdir / "store"
    procs = [
        subprocess.Popen([str(exe), str(r), "2", str(store)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for r in range(2)
    ]
    outputs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=45)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outputs.append(out)
    shutil.rmtree(workdir, ignore_errors=True)
    assert all(p.returncode == 0 for p in procs), outputs
    assert all("allreduce ok" in o for o in outputs), outputs
