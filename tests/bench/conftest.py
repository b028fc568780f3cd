"""Fixtures for the bench tool tests; the helpers live in bench_helpers.py (a unique module
name, so that these tests run beside other suites' conftest.py files)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_helpers import BENCH, PERF, load_module  # noqa: E402


@pytest.fixture(scope="session")
def perf() -> ModuleType:
    return load_module("nanoccl_perf_under_test", PERF)


@pytest.fixture(scope="session")
def emucluster() -> ModuleType:
    return load_module("emucluster", BENCH / "emucluster.py")


@pytest.fixture
def can_make_namespaces(emucluster: ModuleType) -> None:
    probe = emucluster.EmuCluster(nodes=1, rate="none")
    try:
        probe.up()
    except emucluster.NoPrivilegeError as exc:
        pytest.skip(f"cannot create network namespaces here: {exc}")
    except emucluster.EmuClusterError as exc:
        pytest.skip(f"cannot build the emulated cluster here: {exc}")
    finally:
        probe.down()
