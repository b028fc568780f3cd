"""results/: summaries and plots only, and bench/results_summary.py reads nanoccl-perf's tables."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from bench_helpers import BENCH, REPO, load_module

CODE = (".py", ".cc", ".h", ".sh", ".cu")


def test_results_hold_summaries_not_code() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files", "results"], capture_output=True, text=True,
                           cwd=REPO, check=True).stdout.split()
    assert len(files) <= 160, f"{len(files)} files under results/: keep raw runs out of git"
    assert not [f for f in files if f.endswith(CODE)], "code belongs in bench/"
    for topic in {Path(f).parts[1] for f in files if len(Path(f).parts) > 2}:
        assert (REPO / "results" / topic / "README.md").is_file(), topic


@pytest.mark.parametrize("wide", [False, True])
def test_summary_reads_both_table_forms(perf: ModuleType, tmp_path: Path, wide: bool) -> None:
    summary = load_module("results_summary", BENCH / "results_summary.py")
    rows = [perf.Row("allreduce", "nanoccl", "nanoccl", 1024, 256, "float", "sum", -1, 5,
                     10.0, 0.1, 0.2, 0, 9.0, 9.5, 12.5, 13.0),
            perf.Row("allreduce", "gloo", "gloo", 1024, 256, "float", "sum", -1, 5,
                     40.0, 0.03, 0.05, 0, 39.0, 39.5, 44.0, 45.0)]
    text = ["# nanoccl-perf: 2 rank(s)", "#", "# allreduce  (float sum; busbw = algbw x 1)",
            *perf.header(["nanoccl", "gloo"], wide), perf.format_rows(rows, wide)]
    path = tmp_path / "t.txt"
    path.write_text("\n".join(f"[n0] {line}" for line in text) + "\n")
    got = summary.table_rows(path)
    assert [(r["side"], r["time_us"], r["p99_us"], r["wrong"]) for r in got] == [
        ("nanoccl", "10.0", "13.0", "0"), ("gloo", "40.0", "45.0", "0")]
    assert all(r["speedup"] == "4.000" and r["size"] == "1024" and r["launch"] == "1"
               and r["collective"] == "allreduce" for r in got)
