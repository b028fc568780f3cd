"""The main job's reporting (table, JSON, CSV, PNG) and one small end-to-end run."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bench_helpers import BENCH, REPO, load_module


@pytest.fixture(scope="module")
def ab_main() -> ModuleType:
    return load_module("ab_main", BENCH / "ab_main.py")


def _perf_doc() -> dict:
    rows = []
    for size in (1 << 20, 2 << 20):
        for label, t in (("nanoccl", 1000.0), ("gloo", 1100.0)):
            algbw = size / (t * 1e-6) / 1e9
            rows.append({"collective": "allreduce", "backend": label, "label": label,
                         "size": size, "count": size // 4, "type": "float", "redop": "sum",
                         "root": -1, "iters": 5, "time_us": t, "algbw": algbw,
                         "busbw": algbw * 1.5, "wrong": 0, "min_us": t * 0.9,
                         "median_us": t, "max_us": t * 1.2})
    return {"meta": {"labels": ["nanoccl", "gloo"], "world_size": 4}, "rows": rows,
            "speedup": [{"collective": "allreduce", "size": s, "speedup": 1.1}
                        for s in (1 << 20, 2 << 20)]}


def _ddp_doc() -> dict:
    side = {"step_ms": [300.0, 200.0, 100.0, 110.0], "losses": [0.4, 0.3, 0.2, 0.1],
            "mean_step_ms": 105.0, "median_step_ms": 105.0, "samples_per_s": 1200.0,
            "final_loss": 0.1}
    return {"meta": {"depth": 4, "width": 64, "params": 1000, "grad_bytes": 4000,
                     "batch_per_rank": 8, "steps": 4, "warmup_steps": 2},
            "sides": [dict(side, label="nanoccl", backend="nanoccl"),
                      dict(side, label="gloo", backend="gloo", mean_step_ms=126.0)],
            "max_param_diff": 0.0}


def test_summary_and_outputs(ab_main: ModuleType, tmp_path: Path) -> None:
    meta = {"title": "nanoccl vs gloo -- 2 nodes x 2 ranks, 1gbit", "standin": False,
            "nanoccl": "x", "side_b": "gloo", "seconds": 12.0,
            "tcp_goodput_mbit": {"n1->n0": 940.0, "n0->n1": 941.0},
            "link_bytes": {"perf": {"n0": {"tx": 10, "rx": 10}}}}
    lines = ab_main.summary(_perf_doc(), _ddp_doc(), meta)
    text = "\n".join(lines)
    assert "speedup" in text and "1.100" in text and "1.200" in text
    assert "final loss" in text
    ab_main._write_outputs(tmp_path, meta, _perf_doc(), _ddp_doc(), lines)
    with open(tmp_path / "allreduce.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 and rows[0]["busbw_gbs"] and rows[0]["speedup"] == "1.1000"
    with open(tmp_path / "ddp.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 8
    assert (tmp_path / "ab_main.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((tmp_path / "ab_main.json").read_text())
    assert doc["meta"]["title"] == meta["title"] and doc["perf"]["rows"]


def test_summary_with_the_tuned_sides(ab_main: ModuleType, tmp_path: Path) -> None:
    """The compression=auto allreduce job and the DDP side with the hook and tuned bucket."""
    auto = _perf_doc()
    for row in auto["rows"]:
        if row["label"] == "nanoccl":
            row["label"], row["plan"] = "nanoccl+auto", "allreduce/hierarchical/int8"
    auto["meta"]["labels"] = ["nanoccl+auto", "gloo"]
    ddp = _ddp_doc()
    ddp["sides"].append(dict(ddp["sides"][0], label="nanoccl+int8+EF,5MB", bucket_cap_mb=5,
                             tuned=True, mean_step_ms=42.0))
    meta = {"title": "t", "standin": False, "nanoccl": "x", "side_b": "gloo", "seconds": 1.0,
            "hook_codec": "int8"}
    lines = ab_main.summary(_perf_doc(), ddp, meta, auto)
    text = "\n".join(lines)
    assert "nanoccl+auto time(ms)" in text and "hierarchical/int8" in text
    side = next(ln for ln in lines if "nanoccl+int8+EF,5MB" in ln)
    assert "5 tuned" in side and side.split()[-1] == "3.000"  # 126 ms / 42 ms
    ab_main._write_outputs(tmp_path, meta, _perf_doc(), ddp, lines, auto)
    with open(tmp_path / "allreduce.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 8 and {r["plan"] for r in rows} == {"", "allreduce/hierarchical/int8"}
    assert json.loads((tmp_path / "ab_main.json").read_text())["perf_auto"]["rows"]
    # Without the auto job's results, the summary says so.
    assert "perf_auto job failed" in "\n".join(ab_main.summary(_perf_doc(), ddp, meta, None))


def test_standin_is_labelled(ab_main: ModuleType) -> None:
    meta = {"title": "gloo vs gloo (stand-in: nanoccl not built)", "standin": True,
            "nanoccl": "import nanoccl failed", "side_b": "gloo", "seconds": 1.0}
    text = "\n".join(ab_main.summary(None, None, meta))
    assert "NOTE: side A is not nanoccl" in text and "no results" in text


def test_end_to_end_on_loopback(tmp_path: Path) -> None:
    """The whole pipeline, small: 2 'nodes' x 1 rank on loopback, gloo on both sides."""
    proc = subprocess.run([sys.executable, str(BENCH / "ab_main.py"), "--no-shaping",
                           "--procs-per-node", "1", "--backend", "gloo", "-b", "64K", "-e", "128K",
                           "-n", "2", "--steps", "5", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=170, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "A/B: gloo vs gloo" in proc.stdout
    for name in ("ab_main.json", "allreduce.csv", "ddp.csv", "ab_main.png", "summary.txt"):
        assert (tmp_path / name).stat().st_size > 0, name


def test_end_to_end_with_nanoccl_auto_and_the_tuned_ddp_side(tmp_path: Path) -> None:
    """nanoccl as side A: lossless and compression=auto allreduce against Gloo, and DDP with
    the int8 error-feedback side on its tuned bucket, on 2 loopback 'nodes' x 1 rank."""
    proc = subprocess.run([sys.executable, str(BENCH / "ab_main.py"), "--no-shaping",
                           "--procs-per-node", "1", "-b", "64K", "-e", "128K", "-n", "2",
                           "--steps", "5", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=170, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "ab_main.json").read_text())
    assert doc["perf_auto"]["meta"]["labels"] == ["nanoccl+auto", "gloo"]
    assert all(r["plan"] for r in doc["perf_auto"]["rows"] if r["backend"] == "nanoccl")
    sides = doc["ddp"]["sides"]
    assert [s["backend"] for s in sides] == ["nanoccl", "gloo", "nanoccl"]
    assert sides[2]["tuned"] and sides[2]["bucket_cap_mb"] > 0
    assert all(r["wrong"] == 0 for r in doc["perf"]["rows"] + doc["perf_auto"]["rows"])
    # The links were measured for this run, into its own file (not the user's saved profile).
    assert (tmp_path / "link_profile.txt").is_file()
