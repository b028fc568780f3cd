"""Helpers for the study tests: launch trainers/train.py as N ranks on loopback.

Ranks are started directly with the env:// variables torchrun would set (no torchrun
agent: one process less per launch on a 2-core machine). Every launch has a deadline.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "trainers" / "train.py"
STUDY = REPO / "bench" / "study.py"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))

# Messages with which torch refuses a parallelism on CPU (a skip, not a failure).
CPU_REFUSALS = ("NotImplementedError", "not supported on CPU", "only supports CUDA",
                "requires CUDA", "No backend type associated with device type cpu")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Launch:
    returncodes: list[int | None]
    output: str
    result: dict[str, Any] | None

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.returncodes) and self.result is not None

    def refused_on_cpu(self) -> str | None:
        for line in self.output.splitlines():
            if any(msg in line for msg in CPU_REFUSALS):
                return line.strip()
        return None


def launch(world: int, args: Sequence[str], tmp: Path, timeout_s: float = 90.0,
           rank_env: dict[int, dict[str, str]] | None = None) -> Launch:
    """Runs trainers/train.py as `world` ranks on 127.0.0.1; kills them at the deadline.
    `rank_env`: extra environment per rank (NANOCCL_NODE_ID to emulate nodes)."""
    tmp.mkdir(parents=True, exist_ok=True)
    result_path = tmp / f"result_{time.monotonic_ns()}.json"
    port = free_port()
    procs: list[subprocess.Popen[str]] = []
    logs = []
    base_env = {k: v for k, v in os.environ.items()
                if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    base_env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    for rank in range(world):
        env = dict(base_env)
        if world > 1 or "--standalone" not in args:
            env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.update((rank_env or {}).get(rank, {}))
        log = (tmp / f"rank{rank}_{port}.log").open("w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, str(TRAIN), *args, "--json", str(result_path),
             "--timeout", str(int(timeout_s))],
            stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    output = ""
    for rank, log in enumerate(logs):
        log.seek(0)
        output += f"--- rank {rank}\n" + log.read()
        log.close()
    result = None
    if result_path.is_file():
        result = json.loads(result_path.read_text().strip().splitlines()[-1])
    return Launch([p.returncode for p in procs], output, result)


def node_env(nodes: int, per_node: int, **extra: str) -> dict[int, dict[str, str]]:
    """`rank_env` for launch(): ranks numbered node by node, as torchrun numbers them, on
    `nodes` emulated nodes (NANOCCL_NODE_ID) of `per_node` ranks; `extra` for every rank."""
    return {r: {"NANOCCL_NODE_ID": f"node{r // per_node}", "LOCAL_RANK": str(r % per_node),
                "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(r // per_node), **extra}
            for r in range(nodes * per_node)}


def run_study(args: Sequence[str], timeout_s: float = 150.0) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, str(STUDY), *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env, cwd=REPO)
