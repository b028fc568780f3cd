"""pytest hooks for the torch.distributed tests (the job runner is job_runner.py).

Each job batches many checks, since starting a rank (importing torch) costs seconds on a
small machine.

Timeouts: every test carries ``@pytest.mark.timeout(N)``. With pytest-timeout installed it
enforces them; without it, this file does the same with SIGALRM.

A failing ``import nanoccl`` skips these tests only where nobody asked for them to run: under
CI (``CI=true``) and in ``scripts/test.sh`` (``NANOCCL_TEST_REQUIRE_IMPORT=1``) it ends the
run with an error naming the import failure, so a broken extension cannot pass as a green run.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent

try:
    import nanoccl  # noqa: F401

    HAVE_NANOCCL = True
    NANOCCL_IMPORT_ERROR = ""
except Exception as exc:  # noqa: BLE001 - any failure means "not installed"
    HAVE_NANOCCL = False
    NANOCCL_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "timeout(seconds): fail the test after this many seconds")


def import_required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or \
        os.environ.get("NANOCCL_TEST_REQUIRE_IMPORT") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAVE_NANOCCL:
        return
    if import_required():
        raise pytest.UsageError(
            f"import nanoccl failed: {NANOCCL_IMPORT_ERROR} (the torch tests cannot run; "
            "under CI and scripts/test.sh that is a failure, not a skip)")
    skip = pytest.mark.skip(
        reason=f"nanoccl is not installed ({NANOCCL_IMPORT_ERROR}); "
        "run `pip install --no-build-isolation -e .`"
    )
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    marker = item.get_closest_marker("timeout")
    plugin = item.config.pluginmanager.hasplugin("timeout")
    if marker is None or plugin or not hasattr(signal, "SIGALRM"):
        yield
        return
    seconds = int(marker.args[0])

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"test exceeded its {seconds} s timeout")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
