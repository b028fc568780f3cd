"""The study's long runs (``bench/study.py --profile long``): held-out loss curves on real
text, and the time each row takes to reach a target held-out loss.

    python bench/corpus.py                      # once: Debian's python3.11-doc, prepared
    python bench/study.py --profile long --setups 2x1 --dilation-of results/study/full \\
        --out results/study/long

Every training run evaluates the held-out loss of the corpus' held-out split (bench/corpus.py)
before its first step, every ``eval_every`` steps and after its last (trainers/train.py
--eval-every; diloco: its global parameters); its curve, one point per evaluation (steps,
tokens, training time so far on this machine's clock with the links at the study's dilated
rate, held-out loss, the SHA-256 of the evaluated parameters), goes into runs.csv
(``eval_curve``, compact JSON: [step, tokens, time_s, loss, sha]).

Target: per model and setup, DDP on Gloo's (``dp@gloo``) final held-out loss + 2%. A row's
time to the target is the training time at its first evaluation at or below the target (so
at the resolution of ``eval_every``; none if it never gets there); the report gives it on
this machine's clock and divided by the time dilation D (the reference's clock, where the
link is 1 GbE), with the speed-up against DDP on Gloo and against DP with int4 error
feedback (``dp@nanoccl+int4``).

Computed rows: a lossless row (``dp@nanoccl``) whose training is the same bits as a reference
row (``dp@gloo``) need not run to the end. It runs ``prefix_steps`` steps, evaluated as the
reference is; when at every evaluation of the prefix the parameters' SHA-256 and the
held-out loss, and at every step the training loss, equal the reference's, its curve is the
reference's and its time is its own: the prefix's measured step times, then its mean timed
step time for each further step (runs.csv's ``time_source`` says so). When they differ, the
row runs to the end (``fallback="full"``), or is left without a time (``"none"``).
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for _path in (str(BENCH), str(REPO)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import study_report  # noqa: E402
from study_plan import Profile  # noqa: E402
from study_runs import decode_curve, encode_curve  # noqa: E402, F401  (runs.csv's curve column)

REFERENCE_ROW = "dp@gloo"  # defines the target
EF_ROW = "dp@nanoccl+int4"  # DP with int4 error feedback, the second yardstick
TARGET_MARGIN = 0.02


row_name = study_report.row_name  # "strategy@backend"


# ----------------------------------------------------------------------------- curves
def curve_of(doc: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The held-out curve of a trainer's result line (None without --eval-every)."""
    held = doc.get("held_out")
    return list(held["curve"]) if isinstance(held, dict) and held.get("curve") else None


def first_at_or_below(curve: Sequence[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation whose held-out loss is at or below `target`."""
    return next((p for p in curve if p["loss"] <= target), None)


def first_difference(prefix_doc: dict[str, Any], reference_doc: dict[str, Any]) -> str | None:
    """None when the prefix run trained the same bits as the reference over its steps: the
    training loss at every step, the held-out loss and the parameters' SHA-256 at every
    evaluation; else the first difference, in words."""
    steps = int(prefix_doc.get("steps") or 0)
    mine, ref = prefix_doc.get("losses") or [], reference_doc.get("losses") or []
    if len(mine) < steps or len(ref) < steps:
        return f"training losses missing ({len(mine)} and {len(ref)} of {steps} steps)"
    for s in range(steps):
        if mine[s] != ref[s]:
            return f"training loss at step {s + 1}: {mine[s]!r} against {ref[s]!r}"
    points = {p["step"]: p for p in curve_of(reference_doc) or []}
    evaluated = curve_of(prefix_doc) or []
    if not evaluated:
        return "no held-out evaluation in the prefix"
    for p in evaluated:
        q = points.get(p["step"])
        if q is None:
            return f"the reference has no evaluation at step {p['step']}"
        for key in ("loss", "params_sha256"):
            if p.get(key) != q.get(key):
                return f"held-out {key} at step {p['step']}: {p.get(key)!r} against {q.get(key)!r}"
    return None


def computed_curve(reference: Sequence[dict[str, Any]], step_time_s: Sequence[float],
                   warmup: int) -> tuple[list[dict[str, Any]], float]:
    """The reference's curve on the prefix run's clock: up to the prefix's last step the
    sum of its measured step times, past it its mean timed step time (warm-up left out) a
    step. Returns the curve and that mean."""
    timed = list(step_time_s[warmup:]) or list(step_time_s)
    mean = statistics.fmean(timed)
    done = len(step_time_s)
    out = []
    for p in reference:
        s = p["step"]
        time_s = (math.fsum(step_time_s[:s]) if s <= done
                  else math.fsum(step_time_s) + (s - done) * mean)
        out.append({**p, "time_s": time_s})
    return out, mean


def computed_record(prefix_rec: dict[str, Any], prefix_doc: dict[str, Any],
                    reference_rec: dict[str, Any], reference_doc: dict[str, Any]) -> dict[str, Any]:
    """The row's record when its prefix trained the reference's bits (first_difference is
    None): its throughput and step time as measured, the reference's curve and final losses
    on its own clock."""
    curve, mean = computed_curve(curve_of(reference_doc) or [], prefix_doc["step_time_s"],
                                 int(prefix_doc.get("warmup_steps") or 0))
    rec = dict(prefix_rec)
    rec.update({
        "eval_curve": encode_curve(curve), "eval_loss": curve[-1]["loss"] if curve else None,
        "eval_every": reference_rec.get("eval_every"),
        "final_loss": reference_rec.get("final_loss"),
        "time_source": (f"computed: trained the same bits as {row_name(reference_rec)} over "
                        f"its first {prefix_doc.get('steps')} steps (training and held-out "
                        f"losses, parameters' SHA-256 at each evaluation); time past them "
                        f"from its mean measured step time, {mean * 1000:.1f} ms"),
        "same_as": row_name(reference_rec),
    })
    return rec


def prefix_length(profile: Profile) -> int:
    """The steps a computed row runs: prefix_steps rounded up to a whole number of
    evaluation periods (its last evaluation is one of the reference's too), more than the
    warm-up, at most the profile's steps."""
    steps = max(profile.prefix_steps, profile.warmup + 1)
    if profile.eval_every > 0:
        steps = -(-steps // profile.eval_every) * profile.eval_every
    return min(steps, profile.steps)


def baseline_profile(profile: Profile) -> Profile:
    """What the single-rank baselines (T_1, and the time dilation) of a long study run: the
    full profile's short timed window, no evaluation."""
    return replace(profile, steps=6, warmup=2, min_window_s=2.0, eval_every=0)


# ------------------------------------------------------------------------------ report
def time_to_target(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per training run with a curve: its final held-out loss, the target of its
    (model, setup) and when it first reached it; sorted by model, setup and row."""
    runs = [r for r in records if r.get("kind") == "train" and r.get("status") == "ok"
            and r.get("eval_curve")]
    out = []
    for rec in runs:
        curve = decode_curve(rec["eval_curve"])
        same = [r for r in runs if r.get("model") == rec.get("model")
                and r.get("setup") == rec.get("setup") and r.get("rep") == rec.get("rep")]
        ref = next((r for r in same if row_name(r) == REFERENCE_ROW), None)
        ef = next((r for r in same if row_name(r) == EF_ROW), None)
        ref_curve = decode_curve(ref["eval_curve"]) if ref else []
        target = ref_curve[-1]["loss"] * (1 + TARGET_MARGIN) if ref_curve else None
        hit = first_at_or_below(curve, target) if target is not None else None
        dilation = study_report._num(rec.get("dilation"))

        def hit_time(other: dict[str, Any] | None) -> float | None:
            if other is None or target is None:
                return None
            found = first_at_or_below(decode_curve(other["eval_curve"]), target)
            return found["time_s"] if found else None

        ref_time, ef_time = hit_time(ref), hit_time(ef)
        final = curve[-1] if curve else None
        out.append({
            "model": rec.get("model"), "setup": rec.get("setup"), "rep": rec.get("rep"),
            "strategy": rec.get("strategy"), "backend": rec.get("backend"),
            "steps": final["step"] if final else None,
            "tokens": final["tokens"] if final else None,
            "final_loss": final["loss"] if final else None,
            "vs_reference": (final["loss"] / ref_curve[-1]["loss"] - 1
                             if final and ref_curve else None),
            "target": target,
            "steps_to_target": hit["step"] if hit else None,
            "tokens_to_target": hit["tokens"] if hit else None,
            "time_to_target_s": hit["time_s"] if hit else None,
            "time_to_target_ref_s": (hit["time_s"] / dilation if hit and dilation else None),
            "speedup_vs_reference": (ref_time / hit["time_s"] if hit and ref_time
                                     and hit["time_s"] > 0 else None),
            "speedup_vs_ef": (ef_time / hit["time_s"] if hit and ef_time and hit["time_s"] > 0
                              else None),
            "time_source": rec.get("time_source") or "measured",
            "dilation": dilation,
        })
    out.sort(key=lambda r: (str(r["model"]), study_report._setup_key(str(r["setup"])),
                            int(r["rep"] or 0), study_report._strategy_key(str(r["strategy"])),
                            str(r["strategy"]), study_report._backend_key(str(r["backend"]))))
    return out


TTT_FIELDS = ["model", "setup", "rep", "strategy", "backend", "steps", "tokens", "final_loss",
              "vs_reference", "target", "steps_to_target", "tokens_to_target",
              "time_to_target_s", "time_to_target_ref_s", "speedup_vs_reference",
              "speedup_vs_ef", "time_source", "dilation"]


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    import csv

    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=TTT_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in TTT_FIELDS})


def report_lines(records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    rows = time_to_target(records)
    if not rows:
        return []
    f = study_report._f
    corpus = meta.get("corpus") or {}
    source = corpus.get("source") or {}
    what = (f"{corpus.get('name')} ({source.get('package') or source.get('path')}"
            f"{' ' + source['version'] if source.get('version') else ''}), held-out split "
            f"{(corpus.get('files') or {}).get('val.txt', {}).get('bytes', '?')} bytes"
            if corpus else "the runs' --data")
    lines = ["## Time to a target held-out loss (long runs)", "",
             f"Held-out loss of {what}, evaluated every {meta.get('eval_every', '?')} steps "
             "(diloco rows: their global parameters). Target: DDP on Gloo's final held-out "
             f"loss + {TARGET_MARGIN:.0%} on the same setup. `Time to target` is the training "
             "time (the slowest rank's step times summed, evaluations left out) at the first "
             "evaluation at or below it, on this machine with the links at the study's "
             "dilated rate; `@ref` divides it by the time dilation D (the reference's clock, "
             "1 GbE). `x DDP Gloo` and `x DP int4` are the speed-ups in time to the target. "
             "`vs DDP` compares the final held-out loss at equal tokens. Rows marked "
             "'computed' did not run to the end: see the note under the table.", ""]
    table = []
    notes = []
    for r in rows:
        source_cell = "measured" if r["time_source"] == "measured" else "computed"
        if source_cell == "computed":
            note = (f"{r['setup']} {r['strategy']} {r['backend']}: {r['time_source']}")
            if note not in notes:
                notes.append(note)
        table.append([str(r["setup"]), str(r["strategy"]), str(r["backend"]),
                      str(r["steps"]), f(r["tokens"] / 1e6 if r["tokens"] else None, "{:.2f}"),
                      f(r["final_loss"], "{:.4f}"), f(r["vs_reference"], "{:+.2%}"),
                      f(r["target"], "{:.4f}"), f(r["steps_to_target"], "{:.0f}"),
                      f(r["time_to_target_s"], "{:.1f}", "not reached"),
                      f(r["time_to_target_ref_s"], "{:.1f}"),
                      f(r["speedup_vs_reference"], "{:.2f}"), f(r["speedup_vs_ef"], "{:.2f}"),
                      source_cell])
    lines += study_report._md_table(
        ["Setup", "Parallelism", "Backend", "Steps", "Tokens (M)", "Final held-out loss",
         "vs DDP", "Target", "Steps to target", "Time to target (s)", "@ref (s)",
         "x DDP Gloo", "x DP int4", "Time"], table)
    lines.append("")
    lines += [f"- {n}" for n in notes]
    if notes:
        lines.append("")
    return lines


def make_plots(out_dir: Path, records: Sequence[dict[str, Any]]) -> list[str]:
    """Per model: held-out loss against tokens (top) and against time (bottom), one column
    per setup; the target dashed; computed rows dashed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # plots are optional
        return []
    rows = {(r["model"], r["setup"], r["strategy"], r["backend"]): r
            for r in time_to_target(records)}
    runs = [r for r in records if r.get("kind") == "train" and r.get("status") == "ok"
            and r.get("eval_curve")]
    written = []
    for model in sorted({str(r["model"]) for r in runs}):
        setups = sorted({str(r["setup"]) for r in runs if r["model"] == model},
                        key=study_report._setup_key)
        fig, axes = plt.subplots(2, len(setups), figsize=(6 * len(setups), 8), squeeze=False)
        for col, setup in enumerate(setups):
            mine = [r for r in runs if r["model"] == model and r["setup"] == setup]
            mine.sort(key=lambda r: (study_report._strategy_key(r["strategy"]), r["strategy"],
                                     study_report._backend_key(r["backend"])))
            target = None
            for rec in mine:
                curve = decode_curve(rec["eval_curve"])
                info = rows.get((model, setup, rec["strategy"], rec["backend"]), {})
                target = info.get("target") or target
                style = "--" if rec.get("time_source") else "-"
                label = f"{rec['strategy']} {rec['backend']}"
                timed = [p for p in curve if p["time_s"] > 0]  # a log axis: step 0 left out
                axes[0][col].plot([p["tokens"] / 1e6 for p in curve],
                                  [p["loss"] for p in curve], style, label=label)
                axes[1][col].plot([p["time_s"] for p in timed], [p["loss"] for p in timed],
                                  style, label=label)
            for row, xlabel in ((0, "tokens trained on (M)"),
                                (1, "training time (s, dilated links)")):
                ax = axes[row][col]
                if target is not None:
                    ax.axhline(target, color="grey", lw=0.8, ls=":",
                               label=f"target {target:.3f}")
                ax.set_xlabel(xlabel)
                ax.set_ylabel("held-out loss")
                ax.set_title(f"{model} {setup}")
                ax.grid(alpha=0.3)
            axes[1][col].set_xscale("log")
            axes[0][col].legend(fontsize=7)
        written.append(study_report.save_figure(fig, out_dir / f"held_out_loss_{model}.png"))
    return written


# ------------------------------------------------------------------------------ running
def run_computed(cluster: Any, run: Any, profile: Profile, out_dir: Path, timeout_s: float,
                 dilation: Any, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A computed row (run.same_as): its prefix, then its record on the reference's curve
    when it trained the same bits; else the prefix (kind "prefix", why in "error") and the
    run to the end (fallback "full") or a record without a time ("none")."""
    from study_plan import Run
    from study_runs import _load_json, run_in_cluster

    strategy, backend = run.same_as.split("@", 1)
    ref_key = Run(run.model, strategy, backend, run.setup, run.batch, run.rep).key
    ref = next((r for r in reversed(records) if r.get("kind") == "train"
                and row_name(r) == run.same_as and r.get("model") == run.model
                and r.get("setup") == run.setup.name and r.get("rep") == run.rep
                and r.get("batch") == run.batch), None)
    prefix = replace(profile, steps=prefix_length(profile))
    key = f"{run.key}_prefix"
    rec = run_in_cluster(cluster, run, prefix, out_dir, timeout_s, dilation, key=key)
    if rec.get("status") != "ok":
        return [rec]
    prefix_doc = _load_json(out_dir / "runs" / f"{key}.json") or {}
    ref_doc = _load_json(out_dir / "runs" / f"{ref_key}.json")
    if ref is None or ref.get("status") != "ok" or ref_doc is None:
        why: str | None = f"{run.same_as} has no result to compare with"
    else:
        why = first_difference(prefix_doc, ref_doc)
    if why is None:
        assert ref is not None and ref_doc is not None
        return [computed_record(rec, prefix_doc, ref, ref_doc)]
    rec.update(kind="prefix", error=f"not the bits of {run.same_as}: {why}")
    if profile.fallback == "full":
        full = run_in_cluster(cluster, replace(run, same_as=""), profile, out_dir, timeout_s,
                              dilation)
        return [rec, full]
    left = {k: rec.get(k) for k in ("profile", "model", "strategy", "backend", "setup",
                                    "nodes", "procs_per_node", "world", "batch", "rep")}
    return [rec, {**left, "kind": "train", "status": "skipped",
                  "error": f"not the bits of {run.same_as} ({why}); not run to the end "
                           "(fallback none)"}]


def corpus_for(folder: Path | None, prepare: bool = True) -> tuple[Path, dict[str, Any] | None]:
    """The prepared corpus a long study trains on and its manifest: `folder`, or
    bench/corpus.py's default folder, prepared there from python3.11-doc when it holds none
    (with `prepare`; a dry run only names it). ValueError when there is none to be had."""
    import corpus

    where = Path(folder) if folder else corpus.default_out()
    if not (where / corpus.MANIFEST).is_file():
        if folder is not None or not prepare:
            if not prepare:
                return where, None
            raise ValueError(f"{where}: no corpus (prepare one: python bench/corpus.py "
                             f"--out {where})")
        if not corpus.DEFAULT_SOURCE.is_dir():
            raise ValueError(f"no corpus in {where} and no {corpus.DEFAULT_SOURCE} to prepare "
                             f"it from: apt-get install -y {corpus.PACKAGE}, then python "
                             "bench/corpus.py")
        print(f"study: preparing the corpus in {where} (bench/corpus.py)", flush=True)
        corpus.prepare(corpus.DEFAULT_SOURCE, where)
    return where, corpus.load(where)
