"""bench/study.py: plan, dilation, report, and short end-to-end runs."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from study_helpers import REPO, run_study  # noqa: E402

import study  # noqa: E402  (bench/ is on sys.path through study_helpers)
import study_report  # noqa: E402
import study_seeds  # noqa: E402


def _can_make_namespaces() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def test_published_table_and_derived_references() -> None:
    assert study_seeds.nano_row("2x1", "dp").scaling == 0.11  # type: ignore[union-attr]
    assert study_seeds.nano_row("2x2", "tp").net_volume_gb == 1171.79  # type: ignore[union-attr]
    assert 29.0 < study_seeds.NANO_GPT2_SMALL_1X1_KTOK < 30.0
    ref = study_seeds.DILATION_REFERENCES["gpt"]
    assert ref.step_s == pytest.approx(16 * 1024 / 29.44e3, rel=0.01)
    assert ref.comm_s == pytest.approx(3.98, rel=0.01)
    assert study_seeds.net_scaling("gpt2-large (708M)", 2, 1) == pytest.approx(0.61, abs=0.01)


def test_dilation_keeps_the_reference_ratio() -> None:
    dil = study.compute_dilation("gpt2-tiny", "auto", 10**9, step_s=0.1, params=1_000_000)
    assert dil.rate_bits is not None
    comm_s = 4e6 * 8 / dil.rate_bits  # fp32 gradients over the dilated link
    assert 0.1 / comm_s == pytest.approx(study_seeds.DILATION_REFERENCES["gpt"].ratio, rel=1e-3)
    assert dil.factor == pytest.approx(10**9 / dil.rate_bits)
    assert "D = " in dil.text
    assert study.compute_dilation("x", "none", 10**9, None, None).rate_bits == 10**9
    assert study.compute_dilation("x", "10", 10**9, None, None).rate_bits == 10**8
    assert study.compute_dilation("x", "auto", None, None, None).rate_bits is None
    with pytest.raises(ValueError):
        study.compute_dilation("x", "auto", 10**9, None, None)


def test_quick_plan() -> None:
    plan = study.build_plan(study.PROFILES["quick"], check_backends=False)
    keys = {(r.setup.name, r.strategy, r.backend, r.batch) for r in plan.runs}
    for setup in ("1x2", "2x1"):
        for strategy in ("dp", "tp", "pp", "zero1"):
            for backend in ("gloo", "nanoccl"):
                assert (setup, strategy, backend, 16) in keys
    assert all(r.setup.world > 1 for r in plan.runs)
    # The calibration baseline (alone, reference batch) comes first; each block brings its
    # own T_1 under the same sharing.
    first = plan.baselines[0]
    assert (first.concurrency, first.batch, first.rep) == (1, 16, 0)
    assert all(b.concurrency == blk.setup.world for blk in plan.blocks for b in blk.baselines)


def test_plan_leaves_out_what_cannot_run() -> None:
    prof = study.apply_overrides(study.PROFILES["quick"], study.parse_args(
        ["--models", "resnet18", "--strategies", "dp,tp", "--setups", "1x1,1x2",
         "--batches", "6", "--backends", "gloo"]))
    plan = study.build_plan(prof, check_backends=False)
    assert {r.strategy for r in plan.runs} == {"dp"}
    assert any("tp" in n and "GPT" in n for n in plan.notes)


def test_hsdp_runs_where_it_differs_from_zero2_and_dp() -> None:
    """The full and cluster profiles run HSDP on 2x2 only (on one node it is zero2's calls,
    with one rank per node DP through FSDP2), with every backend of the profile."""
    assert study.applicable("gpt2-tiny", "hsdp", study.Setup(2, 2)) is None
    assert "zero2" in (study.applicable("gpt2-tiny", "hsdp", study.Setup(1, 2)) or "")
    assert "shards nothing" in (study.applicable("gpt2-tiny", "hsdp", study.Setup(2, 1)) or "")
    for name in ("full", "cluster"):
        profile = study.PROFILES[name]
        plan = study.build_plan(profile, check_backends=False)
        hsdp = {(r.setup.name, r.backend) for r in plan.runs if r.strategy == "hsdp"}
        extra = profile.extra_backends.get("hsdp", ())
        assert hsdp == {("2x2", b) for b in (*profile.backends, *extra)}, name
        # +qwz (parameters all-gathered as int8) is FSDP2's: zero2 and zero3 (hpZ) only.
        assert all("qwz" not in r.backend or r.strategy in ("zero2", "zero3", "zero3-hpz")
                   for r in plan.runs), name
        assert any("hsdp on 1x2 left out" in n for n in plan.notes)


def test_summarize_scaling_and_volume() -> None:
    base = {"model": "m", "batch": 8, "unit": "tokens", "status": "ok", "timed_steps": 4,
            "step_time_mean_s": 0.1}
    records = [
        {**base, "kind": "baseline", "strategy": "single", "backend": "-", "setup": "1x1",
         "world": 1, "nodes": 1, "concurrency": 1, "units_per_s": 1000.0},
        {**base, "kind": "baseline", "strategy": "single", "backend": "-", "setup": "1x1",
         "world": 1, "nodes": 1, "concurrency": 2, "for_setup": "2x1", "units_per_s": 800.0},
        {**base, "kind": "train", "strategy": "dp", "backend": "gloo", "setup": "2x1",
         "world": 2, "nodes": 2, "units_per_s": 400.0, "window_s": 2.0, "rep": 0,
         "link_tx_bytes": 8e6, "link_rx_bytes": 8e6, "rate_bits": 1e8, "dilation": 10.0},
        {**base, "kind": "train", "strategy": "dp", "backend": "gloo", "setup": "2x1",
         "world": 2, "nodes": 2, "units_per_s": 480.0, "window_s": 2.0, "rep": 1,
         "link_tx_bytes": 8e6, "link_rx_bytes": 8e6, "rate_bits": 1e8, "dilation": 10.0},
    ]
    rows = {(s.setup, s.strategy): s for s in study_report.summarize(records)}
    dp = rows[("2x1", "dp")]
    assert dp.reps == 2 and dp.throughput == pytest.approx(440.0)
    assert dp.scaling == pytest.approx(440.0 / (2 * 800.0))
    assert dp.scaling_iso == pytest.approx(440.0 / (2 * 1000.0))
    assert dp.volume_mb_step == pytest.approx(2.0)  # 8 MB over 4 steps
    assert dp.net_mbps == pytest.approx(32.0)  # (8 + 8) MB x 8 / 2 nodes / 2 s
    assert dp.net_gbps_ref == pytest.approx(0.32)
    assert dp.link_util == pytest.approx(0.16)
    assert rows[("1x1", "single")].scaling == pytest.approx(1.0)


def _study_dir(root: Path, records: list[dict[str, object]], files: list[str],
               started: str) -> Path:
    root.mkdir()
    for sub in ("runs", "logs"):
        (root / sub).mkdir()
    for name in files:
        (root / "runs" / f"{name}.json").write_text(started)
        (root / "logs" / f"{name}.log").write_text(started)
    study_report.write_runs_csv(root / "runs.csv", records)
    (root / "meta.json").write_text(json.dumps({"started": started, "steps": 6, "warmup": 2,
                                                "min_window_s": 2.0, "reps": 1,
                                                "environment": {"cpu": "cpu " + started}}))
    return root


def test_merge_puts_a_setup_measured_again_in_place_of_the_studys(tmp_path: Path) -> None:
    base = {"model": "m", "batch": 8, "unit": "tokens", "status": "ok", "timed_steps": 4,
            "step_time_mean_s": 0.1, "strategy": "single", "backend": "-", "world": 1,
            "nodes": 1}
    t1 = {**base, "kind": "baseline", "setup": "1x1", "concurrency": 1, "units_per_s": 1000.0}
    shared = {**base, "kind": "baseline", "setup": "1x1", "concurrency": 2}
    run = {**base, "kind": "train", "strategy": "dp", "backend": "gloo", "world": 2, "rep": 0}
    old = _study_dir(tmp_path / "study", [
        t1, {**shared, "for_setup": "1x2", "units_per_s": 800.0},
        {**shared, "for_setup": "2x1", "units_per_s": 900.0},
        {**run, "setup": "1x2", "nodes": 1, "units_per_s": 800.0},
        {**run, "setup": "2x1", "nodes": 2, "units_per_s": 360.0}],
        ["m_baseline_x1_b8_r0_c0", "m_baseline_x2_for1x2_b8_r0_c0",
         "m_baseline_x2_for2x1_b8_r0_c0", "m_1x2_dp_gloo_b8_r0", "m_2x1_dp_gloo_b8_r0"], "old")
    new = _study_dir(tmp_path / "again", [
        {**t1, "units_per_s": 5.0}, {**shared, "for_setup": "1x2", "units_per_s": 1000.0},
        {**run, "setup": "1x2", "nodes": 1, "units_per_s": 1600.0}],
        ["m_baseline_x1_b8_r0_c0", "m_baseline_x2_for1x2_b8_r0_c0", "m_1x2_dp_gloo_b8_r0"],
        "new")
    report = study_report.merge(new, old, "more steps")
    rows = {(r["kind"], r["setup"], r["for_setup"], r["units_per_s"])
            for r in study_report.read_runs_csv(old / "runs.csv")}
    assert rows == {("baseline", "1x1", "", "1000.0"), ("baseline", "1x1", "1x2", "1000.0"),
                    ("baseline", "1x1", "2x1", "900.0"), ("train", "1x2", "", "1600.0"),
                    ("train", "2x1", "", "360.0")}
    with (old / "summary.csv").open() as fh:
        summary = {r["setup"]: float(r["scaling"]) for r in csv.DictReader(fh)}
    assert summary["1x2"] == pytest.approx(0.8) and summary["2x1"] == pytest.approx(0.2)
    for sub, ext in (("runs", "json"), ("logs", "log")):
        text = {p.stem: p.read_text() for p in (old / sub).glob(f"*.{ext}")}
        assert text == {"m_baseline_x1_b8_r0_c0": "old", "m_baseline_x2_for1x2_b8_r0_c0": "new",
                        "m_baseline_x2_for2x1_b8_r0_c0": "old", "m_1x2_dp_gloo_b8_r0": "new",
                        "m_2x1_dp_gloo_b8_r0": "old"}
    meta = json.loads((old / "meta.json").read_text())
    assert meta["started"] == "old"
    assert meta["reruns"] == [{"setups": ["1x2"], "started": "new", "finished": None,
                               "steps": 6, "warmup": 2, "min_window_s": 2.0, "reps": 1,
                               "cpu": "cpu new", "why": "more steps"}]
    assert "Setups 1x2 measured again on new" in report.read_text()


def test_merge_of_rows_keeps_the_setups_other_rows_and_t1(tmp_path: Path) -> None:
    base = {"model": "m", "batch": 8, "unit": "tokens", "status": "ok", "timed_steps": 4,
            "step_time_mean_s": 0.1, "strategy": "single", "backend": "-", "world": 1,
            "nodes": 1}
    t1 = {**base, "kind": "baseline", "setup": "1x1", "concurrency": 1, "units_per_s": 1000.0}
    shared = {**base, "kind": "baseline", "setup": "1x1", "concurrency": 2, "for_setup": "2x1"}
    run = {**base, "strategy": "dp", "world": 2, "rep": 0, "setup": "2x1", "nodes": 2}
    old = _study_dir(tmp_path / "study", [
        t1, {**shared, "units_per_s": 900.0},
        {**run, "kind": "train", "backend": "gloo", "units_per_s": 300.0},
        {**run, "kind": "train", "backend": "nanoccl+int4", "units_per_s": 700.0},
        {**run, "kind": "prefix", "backend": "nanoccl", "units_per_s": 310.0},
        {**run, "kind": "train", "backend": "nanoccl", "status": "skipped"}],
        ["m_baseline_x2_for2x1_b8_r0_c0", "m_2x1_dp_gloo_b8_r0", "m_2x1_dp_nanoccl-int4_b8_r0",
         "m_2x1_dp_nanoccl_b8_r0_prefix"], "old")
    new = _study_dir(tmp_path / "again", [
        {**t1, "units_per_s": 5.0}, {**shared, "units_per_s": 1.0},
        {**run, "kind": "train", "backend": "nanoccl", "units_per_s": 320.0}],
        ["m_baseline_x2_for2x1_b8_r0_c0", "m_2x1_dp_nanoccl_b8_r0"], "new")
    report = study_report.merge(new, old, "run to the end", rows=["dp@nanoccl"])
    rows = {(r["kind"], r["backend"], r["for_setup"], r["units_per_s"])
            for r in study_report.read_runs_csv(old / "runs.csv")}
    assert rows == {("baseline", "-", "", "1000.0"), ("baseline", "-", "2x1", "900.0"),
                    ("train", "gloo", "", "300.0"), ("train", "nanoccl+int4", "", "700.0"),
                    ("train", "nanoccl", "", "320.0")}
    for sub, ext in (("runs", "json"), ("logs", "log")):
        text = {p.stem: p.read_text() for p in (old / sub).glob(f"*.{ext}")}
        assert text == {"m_baseline_x2_for2x1_b8_r0_c0": "old", "m_2x1_dp_gloo_b8_r0": "old",
                        "m_2x1_dp_nanoccl-int4_b8_r0": "old", "m_2x1_dp_nanoccl_b8_r0": "new"}
    meta = json.loads((old / "meta.json").read_text())
    assert meta["reruns"][0]["setups"] == ["2x1"] and meta["reruns"][0]["rows"] == ["dp@nanoccl"]
    assert "Setups 2x1 (rows dp@nanoccl) measured again on new" in report.read_text()


def test_merge_refuses_what_it_cannot_merge(tmp_path: Path) -> None:
    t1 = {"model": "m", "batch": 8, "kind": "baseline", "setup": "1x1", "concurrency": 1,
          "status": "ok"}
    only_t1 = _study_dir(tmp_path / "t1", [t1], [], "t1")
    with pytest.raises(ValueError, match="no runs on a setup other than 1x1"):
        study_report.merge(only_t1, tmp_path / "missing", "")
    proc = run_study(["--merge", str(only_t1)], timeout_s=60)
    assert proc.returncode == 2 and "--merge NEW and --into DIR go together" in proc.stderr
    proc = run_study(["--merge", str(only_t1), "--into", str(tmp_path / "missing")],
                     timeout_s=60)
    assert proc.returncode == 1 and "no runs on a setup other than 1x1" in proc.stderr


def test_merge_refuses_runs_across_nodes_at_another_link_rate(tmp_path: Path) -> None:
    base = {"model": "m", "batch": 8, "unit": "tokens", "status": "ok", "timed_steps": 4,
            "step_time_mean_s": 0.1, "strategy": "dp", "backend": "gloo", "world": 2,
            "rep": 0, "kind": "train", "units_per_s": 100.0}
    old = _study_dir(tmp_path / "study", [{**base, "setup": "2x1", "nodes": 2,
                                           "rate_bits": 40_000_000}], [], "old")
    meta = json.loads((old / "meta.json").read_text())
    meta["dilation"] = {"m": {"factor": 25.0, "rate_bits": 40_000_000, "text": "D = 25"}}
    (old / "meta.json").write_text(json.dumps(meta))
    faster = _study_dir(tmp_path / "faster", [{**base, "setup": "2x1", "nodes": 2,
                                               "rate_bits": 50_000_000}], [], "new")
    with pytest.raises(ValueError, match="m on 2x1 was measured with links at 50000000 bit/s, "
                                         r"the study in .* at 40000000 bit/s .*--dilation-of"):
        study_report.merge(faster, old, "")
    good_meta = (old / "meta.json").read_text()
    (old / "meta.json").write_text('{"dilation": [1]}')
    with pytest.raises(ValueError, match="not a study's meta.json"):
        study_report.merge(faster, old, "")
    (old / "meta.json").write_text(good_meta)
    assert study_report.read_runs_csv(old / "runs.csv")[0]["rate_bits"] == "40000000"
    # One node's ranks use no link: its runs merge whatever rate their study computed.
    one_node = _study_dir(tmp_path / "one", [{**base, "setup": "1x2", "nodes": 1,
                                              "rate_bits": 50_000_000}], [], "new")
    study_report.merge(one_node, old, "")
    assert {r["setup"] for r in study_report.read_runs_csv(old / "runs.csv")} == {"1x2", "2x1"}


def test_dilation_of_takes_a_studys_link_rates(tmp_path: Path) -> None:
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    (study_dir / "meta.json").write_text(json.dumps({"dilation": {
        "gpt2-nano": {"factor": 21.15, "rate_bits": 47281991, "text": "D = 21.1"}}}))
    dil = study.recorded_dilation(study_dir, "gpt2-nano")
    assert (dil.rate_bits, dil.factor) == (47281991, 21.15)
    assert "47.3 Mbit/s" in dil.text
    with pytest.raises(ValueError, match="records no time dilation for resnet18"):
        study.recorded_dilation(study_dir, "resnet18")
    with pytest.raises(ValueError, match="cannot read"):
        study.recorded_dilation(tmp_path / "none", "gpt2-nano")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "meta.json").write_text('{"dilation": {"gpt2-nano": '
                                                '{"factor": 2, "rate_bits": -5}}}')
    with pytest.raises(ValueError, match="rate_bits is -5"):
        study.recorded_dilation(tmp_path / "bad", "gpt2-nano")
    for text, message in (('{"dilation": {"gpt2-nano": {"factor": "x", "rate_bits": 5}}}',
                           "factor is 'x'"),
                          ('{"dilation": {"gpt2-nano": {"factor": 2, "rate_bits": true}}}',
                           "rate_bits is True"),
                          ('{"dilation": []}', "records no time dilation"),
                          ("[1]", "records no time dilation"), ("{", "cannot read")):
        (tmp_path / "bad" / "meta.json").write_text(text)
        with pytest.raises(ValueError, match=message):
            study.recorded_dilation(tmp_path / "bad", "gpt2-nano")
    smoke = ["--profile", "smoke", "--dry-run"]
    proc = run_study([*smoke, "--dilation-of", str(study_dir)], timeout_s=60)
    assert proc.returncode == 0, proc.stderr
    proc = run_study([*smoke, "--dilation-of", str(tmp_path / "bad")], timeout_s=60)
    assert proc.returncode == 2 and "cannot read" in proc.stderr
    proc = run_study([*smoke, "--dilation-of", str(study_dir), "--dilation", "20"], timeout_s=60)
    assert proc.returncode == 2 and "not with --dilation" in proc.stderr


def test_full_profile_times_about_two_seconds_a_run() -> None:
    argv = study.train_argv("gpt2-tiny", "dp", "gloo", 8, study.PROFILES["full"], "x.json")
    assert argv[argv.index("--min-window-s") + 1] == "2"
    assert "--min-window-s" not in study.train_argv("gpt2-nano", "dp", "gloo", 8,
                                                    study.PROFILES["smoke"], "x.json")
    proc = run_study(["--profile", "smoke", "--dry-run", "--min-window-s", "-1"], timeout_s=60)
    assert proc.returncode != 0 and "--min-window-s must be a finite number" in proc.stderr


def test_report_shows_each_codecs_loss_against_the_lossless_run() -> None:
    """The study table's `Final loss` and `Loss vs lossless` (nanoccl's lossless run of the
    same setup and parallelism after the same steps): a codec row's done-when is a loss."""
    base = {"model": "m", "batch": 8, "unit": "tokens", "status": "ok", "timed_steps": 4,
            "step_time_mean_s": 0.1, "kind": "train", "strategy": "zero2", "setup": "2x1",
            "world": 2, "nodes": 2, "units_per_s": 400.0, "window_s": 2.0, "rep": 0}
    records = [{**base, "backend": "gloo", "final_loss": 2.0},
               {**base, "backend": "nanoccl", "final_loss": 2.5},
               {**base, "backend": "nanoccl+int4+qwz", "final_loss": 2.55}]
    table = study_report.study_table(study_report.summarize(records), "m", 8)
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {r.split("|")[3].strip(): [c.strip() for c in r.strip("|").split("|")]
            for r in table[2:]}
    loss, delta = header.index("Final loss"), header.index("Loss vs lossless")
    assert rows["nanoccl+int4+qwz"][loss] == "2.5500"
    assert rows["nanoccl+int4+qwz"][delta] == "+2.00%"  # against nanoccl's, not Gloo's
    assert rows["nanoccl"][delta] == "+0.00%"


@pytest.mark.timeout(60)
def test_dry_run_quick() -> None:
    proc = run_study(["--profile", "quick", "--dry-run"], timeout_s=60)
    assert proc.returncode == 0, proc.stderr
    assert "profile quick" in proc.stdout
    assert "--strategy tp" in proc.stdout and "--strategy pp" in proc.stdout
    assert "dilation auto" in proc.stdout


@pytest.mark.timeout(60)
def test_cluster_profile_prints_commands() -> None:
    proc = run_study(["--profile", "cluster", "--master-addr", "10.0.0.1", "--setups", "2x2",
                      "--netif", "eth0", "--reps", "1"], timeout_s=60)
    assert proc.returncode == 0, proc.stderr
    assert "torchrun --nnodes 2 --nproc-per-node 2 --node-rank 1 --master-addr 10.0.0.1" \
        in proc.stdout
    assert "--netif eth0" in proc.stdout and "--collect" in proc.stdout


def _check_outputs(out: Path) -> list[dict[str, str]]:
    for name in ("runs.csv", "summary.csv", "report.md", "meta.json"):
        assert (out / name).is_file(), name
    assert list(out.glob("*.png"))
    with (out / "runs.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert rows and all(r["status"] == "ok" for r in rows), rows
    report = (out / "report.md").read_text()
    assert "| Setup | Parallelism | Backend | Sample Thrp." in report
    assert "study S" in report
    return rows


@pytest.mark.timeout(150)
def test_smoke_profile_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    proc = run_study(["--profile", "smoke", "--no-shaping", "--out", str(out)], timeout_s=140)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = _check_outputs(out)
    assert {r["strategy"] for r in rows} == {"single", "dp", "zero1"}
    assert "[  1/" in proc.stderr  # the progress display
    assert study_report.build(out).is_file()  # the report rebuilds from the CSV


@pytest.mark.timeout(150)
@pytest.mark.skipif(not _can_make_namespaces(), reason="needs root and iproute2 (network "
                    "namespaces, tc) for the emulated cluster")
def test_emulated_two_nodes_count_link_bytes(tmp_path: Path) -> None:
    out = tmp_path / "emu"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "study.py"), "--profile", "smoke", "--setups",
         "1x1,2x1", "--strategies", "dp", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        stdout, stderr = proc.communicate(timeout=140)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    rows = _check_outputs(out)
    dp = [r for r in rows if r["strategy"] == "dp"]
    assert dp and all(int(r["link_tx_bytes"]) > 0 for r in dp)
    assert "time dilation for gpt2-nano: D = " in stdout
    # The study's clusters are gone (their namespaces are named after its pid).
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                             timeout=30).stdout
    assert f"ncl{proc.pid}" not in listing


@pytest.mark.timeout(150)
def test_cluster_inside_torchrun(tmp_path: Path) -> None:
    out = tmp_path / "inside"
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--max-restarts", "0", str(REPO / "bench" / "study.py"), "--profile", "cluster",
         "--inside", "--models", "gpt2-nano", "--strategies", "dp", "--backends", "gloo",
         "--setups", "1x2", "--batches", "8", "--reps", "1", "--steps", "3", "--warmup", "1",
         "--device", "cpu", "--out", str(out)],
        capture_output=True, text=True, timeout=140, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = _check_outputs(out)
    assert {(r["kind"], r["concurrency"]) for r in rows} == {("baseline", "2"), ("train", "1")}
