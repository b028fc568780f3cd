#!/usr/bin/env python3
"""The study runner: DP / TP / PP / ZeRO / DiLoCo on the emulated nano-cluster, Gloo vs nanoccl.

    python bench/study.py --profile quick            # a few minutes (needs root for netns)
    python bench/study.py --profile full             # bounded to about an hour
    python bench/study.py --profile quick --dry-run  # the plan and the commands, nothing run
    python bench/study.py --profile cluster --master-addr HOST --netif eth0   # real nodes:
                                                     # prints the torchrun commands
    torchrun ... bench/study.py --profile cluster --inside --out DIR          # or runs them
    python bench/study.py --collect DIR              # report from the JSON files of DIR/runs
    python bench/study.py --profile full --setups 1x2 --out NEW   # some setups again, then
    python bench/study.py --merge NEW --into results/study/full --why TEXT   # in place of
                                                     # the study's (meta.json: "reruns";
                                                     # --rows dp@nanoccl: only those rows)
    (across nodes, measure them at the study's link rates: --dilation-of results/study/full)
    python bench/study.py --profile long --setups 2x1 --dilation-of results/study/full \
        --out results/study/long                     # hours: held-out loss curves on real
                                                     # text, time to a target loss
                                                     # (bench/study_long.py)

Setups are "nodes x ranks per node" (the studies' servers x GPUs): 1x1, 1x2, 2x1, 2x2, 4x1.
Every setup runs in an EmuCluster (bench/emucluster.py): each node a network namespace,
ranks of one node on its loopback, nodes joined by tc-shaped links.

Time dilation (``--dilation auto``, the default): this CPU computes far slower than the
studies' A40 GPUs, so at the real 1 Gbit/s the network would look almost free. The runner
keeps the reference's compute-to-communication ratio instead: for each model it measures
the single-rank step time here (T_here, the 1x1 baseline) and sets the link rate so that
moving one copy of the model's fp32 gradients takes T_here / ratio_ref, where
ratio_ref = (the reference's step time) / (its gradients over 1 Gbit/s), from the study's
published 1x1 throughput (bench/study_seeds.py: GPT-2 small on one A40 at batch 16 x 1024,
29.5 ktokens/s -> 0.55 s a step vs 3.98 s for 498 MB of gradients). It prints the factor
D = rate / dilated rate; ``Gb/s @ref`` in the report multiplies measured link throughput
back by D. ``--dilation none`` keeps --rate as is; ``--dilation 20`` divides it by 20.

Output (--out, default results/study/<profile>): runs.csv (every run), summary.csv (mean
and spread over repetitions), report.md (the studies' tables beside their published
numbers), PNG plots, logs/ (each run's output) and runs/ (each run's JSON).

The code: study_plan.py (the profiles table and the plan: setups, baselines, runs in
cluster blocks), study_runs.py (the time dilation, one baseline or run on this host and its
record), study_cluster.py (real nodes: the commands, --inside, --collect) and
study_report.py (summary.csv, report.md, plots), study_long.py (the long runs' curves, time
to target and computed rows) and corpus.py (the text they train on). This file keeps the driver and the command
line, and re-exports the moved names that others use through it (nanoccl-advise --check,
the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence, TextIO

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

import study_long  # noqa: E402
import study_report  # noqa: E402
from emucluster import (EmuCluster, EmuClusterError, NO_PRIVILEGE_HELP,  # noqa: E402
                        NoPrivilegeError, parse_rate)

# Some of these names are not used here, only through this module (study.<name>, by
# bench/advise_check.py and the tests): hence F401.
from study_plan import (GPT_STRATEGIES, PROFILES, Baseline, Block, DiLoCoSpec,  # noqa: E402, F401
                        Plan, Profile, Run, Setup, applicable, build_plan)
from study_runs import (TRAIN, Dilation, compute_dilation, environment,  # noqa: E402, F401
                        rate_text, record_from_result, recorded_dilation, reference_for,
                        run_baseline, run_in_cluster, train_argv)
from study_cluster import cluster_commands, collect, run_inside  # noqa: E402, F401


# ------------------------------------------------------------------------------ progress
class Progress:
    """One line per started and finished item, with elapsed time and an ETA."""

    def __init__(self, total: int, stream: TextIO = sys.stderr) -> None:
        self.total, self.stream = total, stream
        self.done = 0
        self.started = time.monotonic()
        self.item_started = self.started

    @staticmethod
    def _clock(seconds: float) -> str:
        seconds = max(0, int(seconds))
        return f"{seconds // 60}m{seconds % 60:02d}s"

    def start(self, label: str) -> None:
        self.item_started = time.monotonic()
        self.stream.write(f"[{self.done + 1:>3}/{self.total}] {label} ...\n")
        self.stream.flush()

    def finish(self, status: str, detail: str = "") -> None:
        self.done += 1
        now = time.monotonic()
        elapsed = now - self.started
        eta = elapsed / self.done * (self.total - self.done)
        self.stream.write(f"          {status} in {now - self.item_started:.1f}s {detail} | "
                          f"elapsed {self._clock(elapsed)}, ETA {self._clock(eta)}\n")
        self.stream.flush()

    def skip(self, label: str, why: str) -> None:
        self.done += 1
        self.stream.write(f"[{self.done:>3}/{self.total}] {label}: skipped ({why})\n")
        self.stream.flush()


def _summary_detail(rec: dict[str, Any]) -> str:
    if rec.get("status") != "ok":
        return str(rec.get("error") or "")
    unit = rec.get("unit") or "samples"
    thr = float(rec.get("units_per_s") or 0.0)
    text = f"{thr / 1000:.2f} k{unit}/s, step {float(rec.get('step_time_mean_s') or 0) * 1000:.0f} ms"
    if rec.get("link_tx_bytes") not in (None, "") and int(rec.get("nodes") or 1) > 1:
        text += f", link {int(rec['link_tx_bytes']) / 1e6:.1f} MB"
    if rec.get("final_loss") is not None:
        text += f", loss {float(rec['final_loss']):.3f}"
    if rec.get("eval_loss") is not None:
        text += f", held-out {float(rec['eval_loss']):.3f}"
    if rec.get("time_source"):
        text += " (computed)"
    return text


# -------------------------------------------------------------------------------- driver
def print_plan(plan: Plan, args: argparse.Namespace, out: TextIO = sys.stdout) -> None:
    prof = plan.profile
    out.write(f"study: profile {prof.name} ({prof.description})\n")
    out.write(f"study: {len(plan.all_baselines)} baseline launch(es) + {len(plan.runs)} "
              f"training run(s) in {len(plan.blocks)} cluster block(s); {prof.steps} steps each "
              f"({prof.warmup} warm-up), {prof.reps} rep(s)\n")
    out.write(f"study: setups {', '.join(s.name for s in plan.setups)}; link rate "
              f"{args.rate}, dilation {args.dilation}"
              + (" (measured from the 1x1 baseline at start)" if args.dilation == "auto" else "")
              + ("; no shaping (host loopback)" if args.no_shaping else "") + "\n")
    if prof.budget_min:
        out.write(f"study: budget {prof.budget_min:.0f} min (runs left after it are skipped)\n")
    for note in plan.notes:
        out.write(f"study: note: {note}\n")

    base_prof = study_long.baseline_profile(prof) if prof.eval_every else prof

    def baseline_line(base: Baseline) -> str:
        argv = [sys.executable, str(TRAIN)] + train_argv(base.model, "single", "gloo",
                                                         base.batch, base_prof, "OUT.json")
        return f"  baseline, {base.concurrency} at once: {shlex.join(argv)}\n"

    for base in plan.baselines:
        out.write(baseline_line(base))
    for block in plan.blocks:
        out.write(f"  == {block.setup.name} {block.model} rep {block.rep + 1}: emucluster "
                  f"--nodes {block.setup.nodes} --procs-per-node {block.setup.ppn}\n")
        for base in block.baselines:
            out.write(baseline_line(base))
        for run in block.runs:
            prefix = study_long.prefix_length(prof)
            steps = replace(prof, steps=prefix) if run.same_as else prof
            argv = [str(TRAIN)] + train_argv(run.model, run.strategy, run.backend, run.batch,
                                             steps, "OUT.json")
            out.write(f"  torchrun (per node) {shlex.join(argv)}\n"
                      + (f"    (computed: {prefix} steps, compared with "
                         f"{run.same_as}'s bits; to the end where they differ)\n"
                         if run.same_as else ""))


def execute(plan: Plan, args: argparse.Namespace, out_dir: Path,
            recorded: dict[str, Dilation] | None = None) -> int:
    """Runs the plan; `recorded`: each model's time dilation as another study recorded it
    (--dilation-of), instead of one computed from this run's 1x1 baseline."""
    prof = plan.profile
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    base_rate = None if args.no_shaping else parse_rate(args.rate)
    meta: dict[str, Any] = {
        "profile": prof.name, "description": prof.description,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "steps": prof.steps,
        "warmup": prof.warmup, "min_window_s": prof.min_window_s, "reps": prof.reps,
        "rate": args.rate,
        "dilation_mode": f"of {args.dilation_of}" if args.dilation_of else args.dilation,
        "no_shaping": args.no_shaping,
        "ref_batch": prof.ref_batch, "notes": plan.notes, "environment": environment(),
        "dilation": {},
    }
    if prof.eval_every:
        meta.update(eval_every=prof.eval_every, eval_sequences=prof.eval_sequences,
                    prefix_steps=prof.prefix_steps)
    if getattr(args, "corpus_manifest", None):
        manifest = dict(args.corpus_manifest)
        manifest["split"] = {k: v for k, v in manifest["split"].items() if k != "held_out"}
        meta["corpus"] = {**manifest, "folder": str(args.corpus)}
    base_prof = study_long.baseline_profile(prof) if prof.eval_every else prof
    for note in plan.notes:
        print(f"study: note: {note}", flush=True)
    progress = Progress(plan.total)
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + prof.budget_min * 60 if prof.budget_min else None
    dilations: dict[str, Dilation] = {}

    def over_budget() -> bool:
        return deadline is not None and time.monotonic() > deadline

    def save() -> None:
        study_report.write_runs_csv(out_dir / "runs.csv", records)
        (out_dir / "meta.json").write_text(json.dumps(meta, indent=1))

    def baseline(base: Baseline) -> list[dict[str, Any]]:
        if over_budget():
            progress.skip(base.label, "time budget")
            return []
        progress.start(base.label)
        recs = run_baseline(base, base_prof, out_dir, args.run_timeout)
        records.extend(recs)
        ok = [r for r in recs if r["status"] == "ok"]
        progress.finish("ok" if len(ok) == len(recs) else "FAILED",
                        _summary_detail(ok[0] if ok else recs[0]))
        save()
        return ok

    for base in plan.baselines:
        ok = baseline(base)
        if base.rep == 0 and base.batch == prof.ref_batch[base.model]:
            step = float(ok[0]["step_time_mean_s"]) if ok else None
            params = int(ok[0]["params"]) if ok else None
            try:
                dil = (recorded[base.model] if recorded else
                       compute_dilation(base.model, args.dilation, base_rate, step, params))
            except ValueError as exc:
                print(f"study: {exc}", file=sys.stderr)
                save()
                return 1
            dilations[base.model] = dil
            meta["dilation"][base.model] = {"factor": dil.factor, "rate_bits": dil.rate_bits,
                                            "text": dil.text}
            print(f"study: time dilation for {base.model}: {dil.text}", flush=True)
            save()

    cluster_notes: dict[str, str] = {}
    for block in plan.blocks:
        if over_budget():
            for base in block.baselines:
                progress.skip(base.label, "time budget")
            for run in block.runs:
                progress.skip(run.label, "time budget")
                records.append(_skipped(run, prof, "time budget"))
            continue
        for base in block.baselines:
            baseline(base)
        dil = dilations.get(block.model)
        rate = f"{dil.rate_bits}bit" if dil and dil.rate_bits else "none"
        setup = block.setup
        try:
            cluster = EmuCluster(nodes=setup.nodes, procs_per_node=setup.ppn, rate=rate,
                                 shaping=not args.no_shaping)
            with cluster:
                cluster_notes[f"{setup.name} {block.model}"] = _describe_cluster(cluster)
                for run in block.runs:
                    if over_budget():
                        progress.skip(run.label, "time budget")
                        records.append(_skipped(run, prof, "time budget"))
                        continue
                    progress.start(run.label + (f" (computed from "
                                                f"{study_long.prefix_length(prof)} "
                                                f"steps if {run.same_as}'s bits)"
                                                if run.same_as else ""))
                    if run.same_as:
                        recs = study_long.run_computed(cluster, run, prof, out_dir,
                                                       args.run_timeout, dil, records)
                    else:
                        recs = [run_in_cluster(cluster, run, prof, out_dir, args.run_timeout,
                                               dil)]
                    records.extend(recs)
                    rec = recs[-1]
                    progress.finish("ok" if rec["status"] == "ok" else "FAILED",
                                    _summary_detail(rec))
                    save()
        except NoPrivilegeError as exc:
            print(NO_PRIVILEGE_HELP.format(reason=exc), file=sys.stderr)
            save()
            return 2
        except EmuClusterError as exc:
            print(f"study: cluster {setup.name} failed: {exc}", file=sys.stderr)
            for run in block.runs:
                records.append(_skipped(run, prof, f"cluster: {exc}"))
    meta["cluster"] = "; ".join(f"{k}: {v}" for k, v in cluster_notes.items()) or "-"
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    meta["seconds"] = round(time.monotonic() - progress.started, 1)
    save()
    report = study_report.build(out_dir)
    print(f"study: wrote {out_dir / 'runs.csv'}, {out_dir / 'summary.csv'}, {report} "
          f"({meta['seconds'] / 60:.1f} min)")
    print(report.read_text())
    failed = [r for r in records if r.get("status") == "failed"]
    return 1 if failed and not args.allow_failures else 0


def _describe_cluster(cluster: EmuCluster) -> str:
    if not cluster.shaping:
        return f"{cluster.nodes} node(s) x {cluster.procs_per_node} on host loopback, unshaped"
    if cluster.rate_bits is None:
        return f"{cluster.nodes} node(s) x {cluster.procs_per_node}, unshaped links"
    return (f"{cluster.nodes} node(s) x {cluster.procs_per_node}, links "
            f"{rate_text(cluster.rate_bits)} each way (tbf), ranks of a node on its loopback")


def _skipped(run: Run, profile: Profile, why: str) -> dict[str, Any]:
    return {"kind": "train", "profile": profile.name, "model": run.model,
            "strategy": run.strategy, "backend": run.backend, "setup": run.setup.name,
            "nodes": run.setup.nodes, "procs_per_node": run.setup.ppn, "world": run.setup.world,
            "batch": run.batch, "rep": run.rep, "status": "skipped", "error": why}


# ----------------------------------------------------------------------------------- CLI
def _csv(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="The nanoccl study: DP/TP/PP/ZeRO on the emulated "
                                            "nano-cluster, Gloo vs nanoccl.")
    p.add_argument("--profile", default="quick", choices=sorted(PROFILES))
    p.add_argument("--dry-run", action="store_true", help="print the plan and commands only")
    p.add_argument("--out", default=None, help="results folder (default results/study/<profile>)")
    p.add_argument("--rate", default="1gbit", help="the link rate the study stands for")
    p.add_argument("--dilation", default="auto",
                   help="auto (keep the reference's compute/comm ratio), none, or a factor")
    p.add_argument("--dilation-of", default=None, metavar="DIR",
                   help="the time dilation (link rate per model) of the study in DIR, to "
                        "measure some of its setups again for --merge")
    p.add_argument("--no-shaping", action="store_true",
                   help="no namespaces: all nodes on the host loopback, unshaped (no root)")
    p.add_argument("--models", type=_csv, default=None, help="override, comma-separated")
    p.add_argument("--strategies", type=_csv, default=None,
                   help="override, comma-separated; diloco rows: diloco (H 50) or "
                        "diloco-h<H>[-f<F>][-t<TAU>], e.g. diloco-h10-f4-t2 (nanoccl backends, "
                        "2 nodes and more)")
    p.add_argument("--setups", type=_csv, default=None, help="override, e.g. 1x1,1x2,2x1")
    p.add_argument("--backends", type=_csv, default=None,
                   help="override: gloo, nccl, nanoccl, nanoccl+<codec>")
    p.add_argument("--batches", type=_csv, default=None,
                   help="override the global batch sizes (first = reference)")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--min-window-s", type=float, default=None,
                   help="time about this many seconds a run (more steps where they are "
                        "short; 0: --steps only)")
    p.add_argument("--budget-min", type=float, default=None,
                   help="stop starting runs after this many minutes (0: no budget)")
    p.add_argument("--run-timeout", type=float, default=None,
                   help="seconds per run (default 900; the long profile 14400)")
    p.add_argument("--corpus", type=Path, default=None, metavar="DIR",
                   help="the long profile's text: a corpus folder of bench/corpus.py (default "
                        "its default, prepared from python3.11-doc where missing)")
    p.add_argument("--eval-every", type=int, default=None,
                   help="held-out loss every N steps (the long profile: 100)")
    p.add_argument("--eval-sequences", type=int, default=None,
                   help="held-out sequences per evaluation (the long profile: 256)")
    p.add_argument("--prefix-steps", type=int, default=None,
                   help="long profile: steps of a computed row (nanoccl's lossless DDP), "
                        "compared with Gloo's bits (default 300; 0: run it to the end)")
    p.add_argument("--fallback", choices=("full", "none"), default=None,
                   help="long profile: a computed row that does not train the reference's "
                        "bits runs to the end (full, the default) or gets no time (none)")
    p.add_argument("--allow-failures", action="store_true", help="exit 0 even if runs failed")
    p.add_argument("--collect", default=None, metavar="DIR",
                   help="build the report from DIR/runs/*.json (cluster mode)")
    p.add_argument("--merge", default=None, metavar="NEW",
                   help="with --into: the setups a study run of NEW measured (its --setups) "
                        "replace those of the study in --into (report built again)")
    p.add_argument("--into", default=None, metavar="DIR", help="see --merge")
    p.add_argument("--why", default="", help="--merge: why they were measured again (meta.json)")
    p.add_argument("--rows", type=_csv, default=None, metavar="STRATEGY@BACKEND,...",
                   help="--merge: only these rows of the setups replace (or join) the study's; "
                        "its T_1 and other rows stay")
    p.add_argument("--inside", action="store_true",
                   help="cluster mode under an existing torchrun: run this launch's setup")
    p.add_argument("--master-addr", default="NODE0_ADDRESS", help="cluster mode: node 0")
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("--netif", default=None, help="cluster mode: the NIC whose counters to read")
    p.add_argument("--device", default=None, help="cluster --inside: cpu or cuda")
    return p.parse_args(argv)


def apply_overrides(profile: Profile, args: argparse.Namespace) -> Profile:
    prof = replace(profile)
    if args.models:
        prof.models = args.models
        prof.strategies = {m: profile.strategies.get(m, GPT_STRATEGIES if m.startswith("gpt2")
                                                      else ("dp",)) for m in args.models}
        prof.batches = {m: profile.batches.get(m, (16,)) for m in args.models}
        prof.ref_batch = {m: profile.ref_batch.get(m, prof.batches[m][0]) for m in args.models}
    if args.strategies:
        names = []
        for strategy in args.strategies:
            try:
                spec = DiLoCoSpec.parse(strategy)
            except ValueError as exc:
                raise SystemExit(f"study: {exc}") from None
            names.append(strategy if spec is None else spec.name)  # one name a variant
        prof.strategies = {m: tuple(dict.fromkeys(names)) for m in prof.models}
    if args.setups:
        prof.setups = args.setups
    if args.backends:
        prof.backends = args.backends
        prof.extra_backends = {}
    if args.batches:
        values = tuple(int(b) for b in args.batches)
        prof.batches = {m: values for m in prof.models}
        prof.ref_batch = {m: values[0] for m in prof.models}
    if args.reps is not None:
        prof.reps = args.reps
    if args.steps is not None:
        prof.steps = args.steps
    if args.warmup is not None:
        prof.warmup = args.warmup
    if args.min_window_s is not None:
        if not 0 <= args.min_window_s < float("inf"):
            raise SystemExit("study: --min-window-s must be a finite number >= 0")
        prof.min_window_s = args.min_window_s
    if args.budget_min is not None:
        prof.budget_min = args.budget_min or None
    if args.eval_every is not None:
        if args.eval_every < 0:
            raise SystemExit("study: --eval-every must be >= 0")
        prof.eval_every = args.eval_every
    if args.eval_sequences is not None:
        if args.eval_sequences < 1:
            raise SystemExit("study: --eval-sequences must be >= 1")
        prof.eval_sequences = args.eval_sequences
    if args.prefix_steps is not None:
        if args.prefix_steps < 0:
            raise SystemExit("study: --prefix-steps must be >= 0")
        prof.prefix_steps = args.prefix_steps
    if prof.computed and prof.prefix_steps == 0:
        prof.computed = {}
    if prof.computed and prof.prefix_steps <= prof.warmup:
        raise SystemExit("study: --prefix-steps must be larger than --warmup (or 0)")
    if args.fallback is not None:
        prof.fallback = args.fallback
    if prof.warmup >= prof.steps:
        raise SystemExit("study: --warmup must be smaller than --steps")
    if prof.min_window_s > 0 and prof.warmup < 1:
        raise SystemExit("study: --min-window-s needs a warm-up step (--warmup >= 1)")
    for s in prof.setups:
        Setup.parse(s)
    return prof


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.collect:
        return collect(Path(args.collect))
    if args.merge or args.into:
        if not (args.merge and args.into):
            print("study: --merge NEW and --into DIR go together", file=sys.stderr)
            return 2
        try:
            report = study_report.merge(Path(args.merge), Path(args.into), args.why,
                                        args.rows or ())
        except (OSError, ValueError, KeyError) as exc:
            print(f"study: merge: {exc}", file=sys.stderr)
            return 1
        print(f"study: {args.merge} merged into {args.into}: {report}")
        return 0
    prof = apply_overrides(PROFILES[args.profile], args)
    if args.run_timeout is None:
        args.run_timeout = 14400.0 if prof.eval_every else 900.0
    out_dir = Path(args.out) if args.out else REPO / "results" / "study" / prof.name
    if prof.corpus and prof.name != "cluster":
        try:
            args.corpus, args.corpus_manifest = study_long.corpus_for(args.corpus,
                                                                      prepare=not args.dry_run)
        except ValueError as exc:
            print(f"study: {exc}", file=sys.stderr)
            return 2
        prof.extra_args = (*prof.extra_args, "--data", str(args.corpus))
    if prof.name == "cluster":
        plan = build_plan(prof, check_backends=False)
        if args.inside:
            if "RANK" not in os.environ:
                print("study: --inside runs under torchrun", file=sys.stderr)
                return 2
            return run_inside(plan, args, out_dir)
        args.out = args.out or str(Path("results") / "study" / "cluster")
        cluster_commands(plan, args)
        return 0
    plan = build_plan(prof)
    recorded: dict[str, Dilation] = {}
    if args.dilation_of:
        if args.dilation != "auto" or args.no_shaping:
            print("study: --dilation-of takes the link rates of a study: not with --dilation "
                  "or --no-shaping", file=sys.stderr)
            return 2
        try:
            recorded = {m: recorded_dilation(Path(args.dilation_of), m) for m in prof.models}
        except ValueError as exc:
            print(f"study: {exc}", file=sys.stderr)
            return 2
    if args.dry_run:
        print_plan(plan, args)
        return 0
    if not args.no_shaping and os.geteuid() != 0:
        print(NO_PRIVILEGE_HELP.format(reason="not root"), file=sys.stderr)
        return 2
    if not plan.runs and not plan.all_baselines:
        print("study: nothing to run", file=sys.stderr)
        return 1
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        return execute(plan, args, out_dir, recorded)
    except KeyboardInterrupt:
        print("study: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
