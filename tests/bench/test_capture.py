"""What an eavesdropper on a node's link sees (bench/capture.py): with the secret file and
encryption, neither the secret nor any 256-byte run of the payload; in plaintext, the payload
(so the capture does see the traffic). Both with correct results.

Skips, with the reason, where namespaces cannot be made or tcpdump is missing.
"""

from __future__ import annotations

import argparse
import shutil
from types import ModuleType

import pytest

from bench_helpers import BENCH, load_module


@pytest.fixture(scope="module")
def capture_tool() -> ModuleType:
    return load_module("capture", BENCH / "capture.py")


def test_pattern_runs_are_found_at_any_phase(capture_tool: ModuleType) -> None:
    p = capture_tool.pattern(5000)
    assert capture_tool.longest_pattern_run(b"\x00" * 100 + p[1234:1234 + 300] + b"\xff") == 300
    assert capture_tool.longest_pattern_run(bytes(range(256)) * 4) < 8


@pytest.mark.timeout(300)
@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypted", "plaintext"])
def test_capture_of_a_node(capture_tool: ModuleType, encrypt: bool,
                           can_make_namespaces: None) -> None:
    if shutil.which("tcpdump") is None:
        pytest.skip("tcpdump not installed")
    report = capture_tool.capture(argparse.Namespace(
        encrypt=encrypt, nodes=2, procs_per_node=2, rate="1gbit", bytes=1 << 20, timeout=200.0))
    assert report["job_status"] == 0, report
    assert report["capture_bytes"] > 4 << 20, report  # every rank's pattern crossed the link
    assert not report["secret_found"], report
    if encrypt:
        assert report["longest_payload_run"] < capture_tool.RUN_LENGTH, report
    else:
        assert report["longest_payload_run"] >= capture_tool.RUN_LENGTH, report
