"""Runs a job of N rank processes for the torch.distributed tests; nothing hangs.

Each test runs one *job*: N processes of ``python tests/torch/dist_jobs.py <scenario>``,
one per rank, meeting through env://, tcp:// or file:// on 127.0.0.1. A rank writes a JSON
result file; the parent kills the whole job at its deadline. (A module of its own, not
conftest.py: pytest imports every folder's conftest.py as "conftest", so tests that import
helpers from "conftest" get another folder's when suites run together.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


HERE = Path(__file__).resolve().parent
JOBS = HERE / "dist_jobs.py"


def native_stacks(pid: int) -> str:
    """Every thread's native stack of a hung rank (a hang in C++ shows no Python frame)."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "[no gdb: native stacks not captured]"
    try:
        proc = subprocess.run(
            [gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 30"],
            capture_output=True, text=True, timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"[gdb failed: {exc}]"
    frames = [line for line in proc.stdout.splitlines()
              if line.startswith(("Thread ", "#"))]
    return "native stacks (gdb):\n" + "\n".join(frames)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class RankResult:
    rank: int
    returncode: int
    timed_out: bool  # killed by the harness at the job's deadline
    output: str
    result: dict[str, Any] | None  # the rank's JSON result, if it wrote one

    def describe(self) -> str:
        return f"--- rank {self.rank} (exit {self.returncode}) ---\n{self.output[-4000:]}"


@dataclasses.dataclass
class JobResult:
    ranks: list[RankResult]
    elapsed: float

    def describe(self) -> str:
        return "\n".join(r.describe() for r in self.ranks)

    def results(self) -> list[dict[str, Any]]:
        """Every rank's result; fails the test with all outputs if one is missing."""
        missing = [r.rank for r in self.ranks if r.result is None]
        assert not missing, f"ranks {missing} wrote no result\n{self.describe()}"
        return [r.result for r in self.ranks if r.result is not None]

    def assert_ok(self) -> list[dict[str, Any]]:
        """Every rank finished, exit 0, with no failed check."""
        results = self.results()
        problems = []
        for r, res in zip(self.ranks, results):
            if r.timed_out:
                problems.append(f"rank {r.rank} hung: killed at the job deadline")
            elif r.returncode != 0:
                problems.append(f"rank {r.rank} exited with {r.returncode}")
            for failure in res.get("failures", []):
                problems.append(f"rank {r.rank}: {failure}")
        assert not problems, "\n".join(problems[:60]) + "\n" + self.describe()
        return results


def run_job(
    scenario: str,
    world_size: int,
    *,
    timeout: float = 90.0,
    pg_timeout: float = 20.0,
    init: str = "env",
    env: dict[str, str] | None = None,
    rank_env: dict[int, dict[str, str]] | None = None,
    args: list[str] | None = None,
    script: Path | None = None,
) -> JobResult:
    """Runs `scenario` of dist_jobs.py on `world_size` rank processes.

    init: "env" (MASTER_ADDR/PORT), "tcp" or "file". pg_timeout: the process group's timeout
    (every collective's deadline). The job is killed after `timeout` seconds. script: the
    rank program (default dist_jobs.py; others follow its command line).
    """
    workdir = Path(tempfile.mkdtemp(prefix="nanoccl-test-"))
    port = free_port()
    if init == "env":
        init_method = "env://"
    elif init == "tcp":
        init_method = f"tcp://127.0.0.1:{port}"
    elif init == "file":
        init_method = f"file://{workdir / 'rendezvous'}"
    else:
        raise ValueError(init)
    base_env = dict(os.environ)
    base_env.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world_size),
            "NANOCCL_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",
        }
    )
    base_env.pop("NANOCCL_NODE_ID", None)
    base_env.update(env or {})
    procs: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
    start = time.monotonic()
    for rank in range(world_size):
        rank_environment = dict(base_env)
        rank_environment["RANK"] = str(rank)
        rank_environment.update((rank_env or {}).get(rank, {}))
        out_path = workdir / f"rank{rank}.log"
        res_path = workdir / f"rank{rank}.json"
        cmd = [
            sys.executable,
            str(script or JOBS),
            scenario,
            "--rank",
            str(rank),
            "--world-size",
            str(world_size),
            "--init-method",
            init_method,
            "--pg-timeout",
            str(pg_timeout),
            "--result",
            str(res_path),
            "--deadline",
            str(timeout - 5),
            *(args or []),
        ]
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=rank_environment, cwd=workdir
            )
        procs.append((proc, out_path, res_path))
    deadline = start + timeout
    for proc, _, _ in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    timed_out = set()
    native: dict[int, str] = {}
    for rank, (proc, _, _) in enumerate(procs):
        if proc.poll() is None:
            timed_out.add(rank)
            native[rank] = native_stacks(proc.pid)
            proc.kill()
            proc.wait()
    ranks: list[RankResult] = []
    for rank, (proc, out_path, res_path) in enumerate(procs):
        output = out_path.read_text(errors="replace")
        if rank in timed_out:
            output += f"\n[killed by the test harness after {timeout} s]\n{native[rank]}"
        result = json.loads(res_path.read_text()) if res_path.exists() else None
        ranks.append(RankResult(rank, proc.returncode, rank in timed_out, output, result))
    return JobResult(ranks, time.monotonic() - start)
