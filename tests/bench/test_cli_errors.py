"""nanoccl-tune and nanoccl-advise: a wrong option or value is one line and exit status 2
(nanoccl-perf's, under a launcher, are in test_perf.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench_helpers import REPO


@pytest.mark.parametrize("argv, says", [
    (["nanoccl.tune", "--bogus"], "nanoccl-tune: error: unrecognized arguments: --bogus"),
    (["nanoccl.tune", "--timeout", "soon"], "nanoccl-tune: error: argument --timeout"),
    (["nanoccl.advise", "--model", "gpt2-small", "--batch", "x", "--cluster", "2x2"],
     "nanoccl-advise: error: argument --batch: invalid int value: 'x'"),
    (["nanoccl.advise", "--model", "gpt2-small", "--batch", "8", "--cluster", "2y2",
      "--inter-gbps", "1", "--step-seconds", "0.5"], "nanoccl-advise: cluster '2y2'"),
])
def test_a_wrong_value_is_one_line(argv: list[str], says: str) -> None:
    proc = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert proc.stdout == ""
