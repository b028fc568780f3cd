"""Helpers for the bench tool tests (nanoccl-perf, emucluster, ab_main).

The tools are loaded from their files, so these tests need neither an installed
nor a built nanoccl package: everything runs on gloo.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType


REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
PERF = REPO / "torch_ext" / "nanoccl" / "perf.py"


def load_module(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    if str(path.parent) not in sys.path and path.parent == BENCH:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def torchrun(nproc: int, argv: list[str], timeout: float = 150.0,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs argv under a standalone torchrun on loopback; never waits past timeout."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
                    PYTHONUNBUFFERED="1", **(env or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), "--max-restarts", "0", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=REPO)
