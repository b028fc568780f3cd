"""bench/study.py --profile long (bench/study_long.py): held-out curves, time to the target
loss, computed rows; the bookkeeping on made-up records, and one tiny run end to end."""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus_pages import write_pages  # noqa: E402
from study_helpers import run_study  # noqa: E402

import corpus  # noqa: E402  (bench/ is on sys.path through study_helpers)
import study  # noqa: E402
import study_long  # noqa: E402
import study_report  # noqa: E402
import study_runs  # noqa: E402


def _curve(points: list[tuple[int, float, float]], sha: str = "s") -> list[dict[str, Any]]:
    """(step, time_s, loss) -> a trainer's curve, 100 tokens a step."""
    return [{"step": s, "tokens": 100 * s, "time_s": t, "loss": loss,
             "params_sha256": f"{sha}{s}"} for s, t, loss in points]


def _record(strategy: str, backend: str, curve: list[dict[str, Any]], **more: Any
            ) -> dict[str, Any]:
    return {"kind": "train", "profile": "long", "model": "gpt2-tiny", "strategy": strategy,
            "backend": backend, "setup": "2x1", "nodes": 2, "procs_per_node": 1, "world": 2,
            "batch": 16, "rep": 0, "status": "ok", "units_per_s": 1000.0,
            "step_time_mean_s": 0.1, "dilation": 20.0, "eval_every": 100,
            "eval_loss": curve[-1]["loss"], "eval_curve": study_long.encode_curve(curve),
            **more}


def test_the_first_difference_between_a_prefix_and_its_reference() -> None:
    ref = {"steps": 8, "losses": [5.0, 4.5, 4.0, 3.5, 3.0, 2.8, 2.6, 2.5],
           "held_out": {"curve": _curve([(0, 0, 6.0), (2, 1, 5.0), (4, 2, 4.0),
                                         (6, 3, 3.0), (8, 4, 2.9)])}}
    prefix = {"steps": 4, "losses": ref["losses"][:4],
              "held_out": {"curve": _curve([(0, 0, 6.0), (2, 2, 5.0), (4, 4, 4.0)])}}
    assert study_long.first_difference(prefix, ref) is None  # times may differ, bits not
    changed = json.loads(json.dumps(prefix))
    changed["losses"][2] = 4.0000001
    assert "training loss at step 3" in (study_long.first_difference(changed, ref) or "")
    changed = json.loads(json.dumps(prefix))
    changed["held_out"]["curve"][2]["params_sha256"] = "other"
    assert "params_sha256 at step 4" in (study_long.first_difference(changed, ref) or "")
    changed = json.loads(json.dumps(prefix))
    changed["held_out"]["curve"][1]["loss"] = 5.0000001
    assert "held-out loss at step 2" in (study_long.first_difference(changed, ref) or "")
    assert "no held-out evaluation" in (study_long.first_difference(
        {**prefix, "held_out": None}, ref) or "")
    assert "missing" in (study_long.first_difference({**prefix, "losses": [5.0]}, ref) or "")


def test_a_computed_curve_runs_on_the_prefixs_clock() -> None:
    ref = _curve([(0, 0.0, 6.0), (2, 9.0, 5.0), (4, 18.0, 4.0), (6, 27.0, 3.0),
                  (8, 36.0, 2.9)])
    curve, mean = study_long.computed_curve(ref, [1.0, 2.0, 3.0, 4.0], warmup=1)
    assert mean == 3.0  # the timed steps (2, 3, 4): the warm-up left out
    assert [p["time_s"] for p in curve] == [0.0, 3.0, 10.0, 16.0, 22.0]
    assert [p["loss"] for p in curve] == [6.0, 5.0, 4.0, 3.0, 2.9]  # the reference's losses


def _study_records() -> list[dict[str, Any]]:
    gloo = _curve([(0, 0, 6.0), (100, 100, 3.0), (200, 200, 2.1), (300, 300, 2.0)])
    return [
        _record("dp", "gloo", gloo),
        _record("dp", "nanoccl", [dict(p, time_s=p["time_s"] / 2) for p in gloo],
                time_source="computed: trained the same bits as dp@gloo over its first 3 "
                            "steps", same_as="dp@gloo"),
        _record("dp", "nanoccl+int4", _curve([(0, 0, 6.0), (100, 20, 3.1), (200, 40, 2.2),
                                              (300, 60, 2.03)])),
        _record("diloco", "nanoccl+int4", _curve([(0, 0, 6.0), (100, 5, 3.3), (200, 10, 2.3),
                                                  (300, 15, 2.04)])),
        _record("diloco-h10-f2-t1", "nanoccl+int4", _curve([(0, 0, 6.0), (100, 5, 3.5),
                                                            (200, 10, 2.5), (300, 15, 2.3)])),
        _record("dp", "gloo", _curve([(0, 0, 6.0), (300, 900, 1.0)]), setup="2x2"),
    ]


def test_time_to_the_target_per_row(tmp_path: Path) -> None:
    # Through runs.csv, as the report reads them.
    study_report.write_runs_csv(tmp_path / "runs.csv", _study_records())
    rows = study_long.time_to_target(study_report.read_runs_csv(tmp_path / "runs.csv"))
    by = {(r["setup"], r["strategy"], r["backend"]): r for r in rows}
    gloo = by[("2x1", "dp", "gloo")]
    assert gloo["target"] == pytest.approx(2.0 * 1.02)
    assert (gloo["steps_to_target"], gloo["time_to_target_s"]) == (300, 300.0)
    assert gloo["time_to_target_ref_s"] == pytest.approx(300.0 / 20.0)  # / D
    assert by[("2x1", "dp", "nanoccl")]["time_to_target_s"] == 150.0
    assert by[("2x1", "dp", "nanoccl")]["time_source"].startswith("computed")
    ef = by[("2x1", "dp", "nanoccl+int4")]
    assert (ef["time_to_target_s"], ef["speedup_vs_reference"]) == (60.0, 5.0)
    diloco = by[("2x1", "diloco", "nanoccl+int4")]  # 2.04 is at the target: reached
    assert diloco["time_to_target_s"] == 15.0
    assert diloco["speedup_vs_reference"] == 20.0 and diloco["speedup_vs_ef"] == 4.0
    assert diloco["vs_reference"] == pytest.approx(0.02)
    streaming = by[("2x1", "diloco-h10-f2-t1", "nanoccl+int4")]
    assert streaming["time_to_target_s"] is None and streaming["speedup_vs_reference"] is None
    # Each setup has its own target; 2x2 has no DP int4 row to compare with.
    other = by[("2x2", "dp", "gloo")]
    assert other["target"] == pytest.approx(1.02) and other["speedup_vs_ef"] is None
    lines = "\n".join(study_long.report_lines(study_report.read_runs_csv(tmp_path / "runs.csv"),
                                              {"eval_every": 100}))
    assert "## Time to a target held-out loss" in lines and "Time to target (s)" in lines
    assert "| 2x1 | diloco | nanoccl+int4 | 300 |" in lines
    assert "not reached" in lines and "| computed |" in lines
    assert "- 2x1 dp nanoccl: computed: trained the same bits as dp@gloo" in lines


def test_the_report_of_a_long_study_has_its_table_csv_and_plot(tmp_path: Path) -> None:
    study_report.write_runs_csv(tmp_path / "runs.csv", _study_records())
    (tmp_path / "meta.json").write_text(json.dumps({"profile": "long", "eval_every": 100}))
    report = study_report.build(tmp_path).read_text()
    assert "Time to a target held-out loss" in report
    with (tmp_path / "time_to_target.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 6 and {r["strategy"] for r in rows} >= {"diloco", "dp"}
    assert (tmp_path / "held_out_loss_gpt2-tiny.png").is_file()
    assert "held_out_loss_gpt2-tiny" in report


class _FakeRuns:
    """study_runs.run_in_cluster and _load_json for run_computed: each run writes the doc
    given for its key."""

    def __init__(self, out: Path, docs: dict[str, dict[str, Any]]) -> None:
        self.out, self.docs, self.ran = out, docs, []

    def run_in_cluster(self, cluster: Any, run: Any, profile: Any, out_dir: Path,
                       timeout_s: float, dilation: Any, extra: Any = (),
                       key: str | None = None) -> dict[str, Any]:
        key = key or run.key
        self.ran.append((key, profile.steps))
        (out_dir / "runs" / f"{key}.json").write_text(json.dumps(self.docs[key]))
        return study_runs.record_from_result(self.docs[key], {
            "kind": "train", "model": run.model, "strategy": run.strategy,
            "backend": run.backend, "setup": run.setup.name, "world": 2, "nodes": 2,
            "batch": run.batch, "rep": run.rep})


@pytest.mark.parametrize("case", ["same", "differs-full", "differs-none"])
def test_a_computed_row_runs_to_the_end_only_where_its_bits_differ(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "runs").mkdir()
    prof = study.PROFILES["long"]
    prof = replace(prof, steps=8, warmup=1, prefix_steps=4, eval_every=4,
                         fallback="none" if case == "differs-none" else "full")
    setup = study.Setup(2, 1)
    run = study.Run("gpt2-tiny", "dp", "nanoccl", setup, 16, 0, same_as="dp@gloo")
    ref_run = study.Run("gpt2-tiny", "dp", "gloo", setup, 16, 0)
    ref_doc = {"steps": 8, "warmup_steps": 1, "losses": [5, 4, 3, 2, 1.5, 1.4, 1.3, 1.2],
               "held_out": {"curve": _curve([(0, 0, 6.0), (4, 4, 4.0), (8, 8, 2.0)])}}
    prefix_doc = {"steps": 4, "warmup_steps": 1, "losses": [5, 4, 3, 2],
                  "step_time_s": [0.5, 0.25, 0.25, 0.25],
                  "held_out": {"curve": _curve([(0, 0, 6.0), (4, 1, 4.0)],
                                               sha="x" if case != "same" else "s")}}
    (tmp_path / "runs" / f"{ref_run.key}.json").write_text(json.dumps(ref_doc))
    fake = _FakeRuns(tmp_path, {f"{run.key}_prefix": prefix_doc, run.key: ref_doc})
    monkeypatch.setattr(study_runs, "run_in_cluster", fake.run_in_cluster)
    ref_rec = study_runs.record_from_result(
        ref_doc, {"kind": "train", "model": "gpt2-tiny", "strategy": "dp", "backend": "gloo",
                  "setup": "2x1", "batch": 16, "rep": 0})
    recs = study_long.run_computed(None, run, prof, tmp_path, 60.0, None, [ref_rec])
    assert fake.ran[0] == (f"{run.key}_prefix", 4)
    if case == "same":
        assert len(recs) == 1 and len(fake.ran) == 1
        assert recs[0]["time_source"].startswith("computed: trained the same bits as dp@gloo")
        curve = study_long.decode_curve(recs[0]["eval_curve"])
        assert [(p["step"], p["loss"], p["time_s"]) for p in curve] == \
            [(0, 6.0, 0.0), (4, 4.0, 1.25), (8, 2.0, 2.25)]
        return
    assert recs[0]["kind"] == "prefix" and "params_sha256 at step 0" in recs[0]["error"]
    if case == "differs-full":
        assert fake.ran[1] == (run.key, 8) and recs[1]["status"] == "ok"
        assert "time_source" not in recs[1]
    else:
        assert len(fake.ran) == 1 and recs[1]["status"] == "skipped"
        assert "fallback none" in recs[1]["error"]
    # The prefix is left out of the summary, and listed as such in the report.
    summaries = study_report.summarize([ref_rec, *recs])
    assert [(s.strategy, s.backend, s.reps) for s in summaries if s.backend == "nanoccl"] == \
        ([("dp", "nanoccl", 1)] if case == "differs-full" else [("dp", "nanoccl", 0)])


def test_the_long_profile_plans_its_rows() -> None:
    plan = study.build_plan(study.PROFILES["long"], check_backends=False)
    for block in plan.blocks:
        rows = [(r.strategy, r.backend, r.same_as) for r in block.runs]
        assert {(s, b) for s, b, _ in rows} == {
            ("dp", "gloo"), ("dp", "nanoccl"), ("dp", "nanoccl+int8"), ("dp", "nanoccl+int4"),
            ("diloco-h10-f1-t0", "nanoccl+int4"), ("diloco", "nanoccl+int4"),
            ("diloco-h10-f2-t1", "nanoccl+int4"), ("diloco-h50-f5-t2", "nanoccl+int4")}
        assert rows[-1] == ("dp", "nanoccl", "dp@gloo")  # after its reference
        assert [r for r in rows if r[2]] == [rows[-1]]
    assert {b.setup.name for b in plan.blocks} == {"2x1", "2x2"}
    prof = study.PROFILES["long"]
    argv = study_runs.train_argv("gpt2-tiny", "dp", "gloo", 16, prof, "o.json")
    assert argv[argv.index("--eval-every") + 1] == "100"
    assert argv[argv.index("--eval-sequences") + 1] == "256"
    # A prefix ends on one of the reference's evaluations.
    assert study_long.prefix_length(prof) == 300
    assert study_long.prefix_length(replace(prof, prefix_steps=301)) == 400
    assert study_long.prefix_length(replace(prof, prefix_steps=1, eval_every=0)) == 3
    assert study_long.prefix_length(replace(prof, prefix_steps=3901, eval_every=300)) == 4000
    base = study_runs.train_argv("gpt2-tiny", "single", "gloo", 16,
                                 study_long.baseline_profile(prof), "o.json")
    assert "--eval-every" not in base and base[base.index("--steps") + 1] == "6"
    # --prefix-steps 0: every row to the end.
    args = study.parse_args(["--profile", "long", "--prefix-steps", "0"])
    plan = study.build_plan(study.apply_overrides(prof, args), check_backends=False)
    assert not any(r.same_as for r in plan.runs)


@pytest.mark.timeout(240)
def test_a_tiny_long_study_end_to_end(tmp_path: Path) -> None:
    """gpt2-nano on 2 unshaped nodes, 6 steps evaluated every 2 on a generated corpus: DDP on
    Gloo, nanoccl's lossless DDP computed from 4 steps (the same bits on 2 nodes of 1 rank),
    DP int4, DiLoCo H 2."""
    pages = tmp_path / "html"
    write_pages(pages, count=6, paragraphs=30)
    corpus.prepare(pages, tmp_path / "corpus", 0.3, None)
    out = tmp_path / "long"
    proc = run_study(["--profile", "long", "--no-shaping", "--models", "gpt2-nano", "--setups",
                      "2x1", "--strategies", "dp,diloco-h2", "--backends",
                      "gloo,nanoccl,nanoccl+int4", "--batches", "8", "--steps", "6",
                      "--warmup", "1", "--eval-every", "2", "--eval-sequences", "8",
                      "--prefix-steps", "4", "--corpus", str(tmp_path / "corpus"),
                      "--out", str(out)], timeout_s=220)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with (out / "runs.csv").open() as fh:
        runs = [r for r in csv.DictReader(fh) if r["kind"] == "train"]
    by = {(r["strategy"], r["backend"]): r for r in runs}
    assert set(by) == {("dp", "gloo"), ("dp", "nanoccl"), ("dp", "nanoccl+int4"),
                       ("diloco-h2-f1-t0", "nanoccl+int4")}, list(by)
    gloo = study_long.decode_curve(by[("dp", "gloo")]["eval_curve"])
    assert [p["step"] for p in gloo] == [0, 2, 4, 6]
    computed = by[("dp", "nanoccl")]
    assert computed["steps"] == "4" and computed["time_source"].startswith("computed")
    mine = study_long.decode_curve(computed["eval_curve"])
    assert [(p["step"], p["loss"], p["params_sha256"]) for p in mine] == \
        [(p["step"], p["loss"], p["params_sha256"]) for p in gloo]
    diloco = study_long.decode_curve(by[("diloco-h2-f1-t0", "nanoccl+int4")]["eval_curve"])
    assert diloco[0]["params_sha256"] == gloo[0]["params_sha256"]  # the same start
    with (out / "time_to_target.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 and all(r["target"] for r in rows)
    report = (out / "report.md").read_text()
    assert "## Time to a target held-out loss" in report and "diloco-h2-f1-t0" in report
    assert (out / "held_out_loss_gpt2-nano.png").is_file()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["eval_every"] == 2 and meta["corpus"]["name"] == "html"
    assert "held_out" not in meta["corpus"]["split"]
