#!/usr/bin/env python3
"""The study runner: DP / TP / PP / ZeRO on the emulated nano-cluster, Gloo vs nanoccl.

    python bench/study.py --profile quick            # a few minutes (needs root for netns)
    python bench/study.py --profile full             # bounded to about an hour
    python bench/study.py --profile quick --dry-run  # the plan and the commands, nothing run
    python bench/study.py --profile cluster --master-addr HOST --netif eth0   # real nodes:
                                                     # prints the torchrun commands
    torchrun ... bench/study.py --profile cluster --inside --out DIR          # or runs them
    python bench/study.py --collect DIR              # report from the JSON files of DIR/runs

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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence, TextIO

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

import study_report  # noqa: E402
import study_seeds  # noqa: E402
from emucluster import (EmuCluster, EmuClusterError, NO_PRIVILEGE_HELP,  # noqa: E402
                        NoPrivilegeError, format_rate, parse_rate)

TRAIN = REPO / "trainers" / "train.py"
# What a single-rank baseline must not inherit from a surrounding torchrun.
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "GROUP_WORLD_SIZE")


# ------------------------------------------------------------------------------- profiles
@dataclass(frozen=True)
class Setup:
    nodes: int
    ppn: int

    @property
    def name(self) -> str:
        return f"{self.nodes}x{self.ppn}"

    @property
    def world(self) -> int:
        return self.nodes * self.ppn

    @staticmethod
    def parse(text: str) -> "Setup":
        try:
            nodes, ppn = (int(v) for v in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"bad setup {text!r}: use NODESxRANKS, e.g. 2x1") from None
        if nodes < 1 or ppn < 1:
            raise ValueError(f"bad setup {text!r}")
        return Setup(nodes, ppn)


@dataclass
class Profile:
    name: str
    models: tuple[str, ...]
    strategies: dict[str, tuple[str, ...]]  # per model
    setups: tuple[str, ...]
    backends: tuple[str, ...]
    batches: dict[str, tuple[int, ...]]  # per model; the reference batch is ref_batch
    ref_batch: dict[str, int]
    sweep_strategies: tuple[str, ...] = ("dp",)  # run at every batch; the rest at ref_batch
    reps: int = 1
    # More backends for some strategies, at the reference batch only (keeps the budget).
    extra_backends: dict[str, tuple[str, ...]] = field(default_factory=dict)
    steps: int = 6
    warmup: int = 2
    budget_min: float | None = None
    description: str = ""
    extra_args: tuple[str, ...] = ()


GPT_STRATEGIES = ("dp", "tp", "pp", "zero1", "zero2", "zero3", "zero3-hpz", "hsdp")

PROFILES: dict[str, Profile] = {
    "smoke": Profile(
        "smoke", ("gpt2-nano",), {"gpt2-nano": ("dp", "zero1")}, ("1x1", "1x2"), ("gloo",),
        {"gpt2-nano": (8,)}, {"gpt2-nano": 8}, reps=1, steps=3, warmup=1,
        description="seconds: the machinery only (tests)"),
    "quick": Profile(
        "quick", ("gpt2-tiny",), {"gpt2-tiny": ("dp", "tp", "pp", "zero1")},
        ("1x1", "1x2", "2x1"), ("gloo", "nanoccl"), {"gpt2-tiny": (8, 16, 32)},
        {"gpt2-tiny": 16}, reps=1, steps=6, warmup=2,
        description="a few minutes: gpt2-tiny, DP/TP/PP/ZeRO-1 on 1x1/1x2/2x1 (DP also at "
                    "batch 8 and 32), Gloo and nanoccl, 1 repetition"),
    "full": Profile(
        "full", ("gpt2-tiny", "resnet18"),
        {"gpt2-tiny": GPT_STRATEGIES, "resnet18": ("dp",)},
        ("1x1", "1x2", "2x1", "2x2", "4x1"), ("gloo", "nanoccl", "nanoccl+int8"),
        {"gpt2-tiny": (8, 16, 32), "resnet18": (8, 32)},
        {"gpt2-tiny": 16, "resnet18": 32}, reps=3, steps=6, warmup=2, budget_min=70.0,
        extra_backends={"dp": ("nanoccl+int4",),
                        "zero2": ("nanoccl+int4", "nanoccl+int4+qwz", "nanoccl+int4+qwz4"),
                        "zero3": ("nanoccl+int4+qwz", "nanoccl+int4+qwz4"),
                        "zero3-hpz": ("nanoccl+int4+qwz", "nanoccl+int4+qwz4"),
                        "hsdp": ("nanoccl+int4",)},
        description="about an hour: gpt2-tiny (DP/TP/PP/ZeRO-1/2/3, ZeRO-3 hpZ and HSDP on "
                    "2x2, DP also at "
                    "batch 8 and 32) and ResNet-18 (DP, batch 8 and 32) on 1x1..4x1, Gloo / "
                    "nanoccl / nanoccl+int8 (at the reference batch also DP, ZeRO-2 and HSDP "
                    "with int4, ZeRO-2/3 and hpZ with int4 + int8 or int4 parameters: +qwz, "
                    "+qwz4), 3 "
                    "repetitions; "
                    "runs still queued after 70 minutes are skipped and listed"),
    "cluster": Profile(
        "cluster", ("gpt2-small", "resnet18"),
        {"gpt2-small": ("dp", "tp", "pp", "zero1", "zero2", "zero3", "hsdp"),
         "resnet18": ("dp",)},
        ("1x1", "1x2", "2x1", "2x2"), ("nccl", "nanoccl"),
        {"gpt2-small": (4, 8, 16), "resnet18": (32, 128, 512, 2048)},
        {"gpt2-small": 16, "resnet18": 512}, reps=5, steps=50, warmup=10,
        description="real multi-node GPU runs (the studies' workloads, no dilation)"),
}


# ----------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Run:
    model: str
    strategy: str
    backend: str
    setup: Setup
    batch: int
    rep: int

    @property
    def key(self) -> str:
        return (f"{self.model}_{self.setup.name}_{self.strategy}_"
                f"{self.backend.replace('+', '-')}_b{self.batch}_r{self.rep}")

    @property
    def label(self) -> str:
        return (f"{self.setup.name} {self.model} {self.strategy:<5} {self.backend:<12} "
                f"b={self.batch} rep {self.rep + 1}")


@dataclass(frozen=True)
class Baseline:
    """`concurrency` single-rank runs at once: T_1 under the CPU sharing of an n-rank setup
    (`for_setup`, measured right before that setup's runs), or alone (concurrency 1)."""

    model: str
    batch: int
    concurrency: int
    rep: int
    for_setup: str = "1x1"

    @property
    def key(self) -> str:
        where = f"_for{self.for_setup}" if self.concurrency > 1 else ""
        return f"{self.model}_baseline_x{self.concurrency}{where}_b{self.batch}_r{self.rep}"

    @property
    def label(self) -> str:
        where = f" (for {self.for_setup})" if self.concurrency > 1 else ""
        return (f"1x1 {self.model} single-rank T_1, {self.concurrency} at once{where}, "
                f"b={self.batch} rep {self.rep + 1}")


def applicable(model: str, strategy: str, setup: Setup) -> str | None:
    """Why (model, strategy) cannot run on setup, or None when it can."""
    from trainers.models import gpt_config, is_gpt

    if strategy in ("tp", "pp") and not is_gpt(model):
        return f"{strategy} is implemented for the GPT models only"
    if strategy in ("tp", "pp") and setup.world < 2:
        return f"{strategy} needs >= 2 ranks"
    if strategy == "tp":
        cfg = gpt_config(model)
        if cfg.n_head % setup.world:
            return f"{cfg.n_head} heads do not split over {setup.world} ranks"
    # The trainer runs hsdp on any layout, but on one node it makes zero2's calls, and with one
    # rank per node it shards nothing (a full-gradient allreduce per block: DP without
    # buckets): the study runs it only where it differs from both.
    if strategy == "hsdp" and setup.nodes < 2:
        return "hsdp on one node is zero2"
    if strategy == "hsdp" and setup.ppn < 2:
        return "hsdp with one rank per node shards nothing (DP through FSDP2)"
    if strategy == "zero3-hpz" and (setup.nodes < 2 or setup.ppn < 2):
        return "zero3-hpz is zero3 on one node and zero2 with one rank per node"
    return None


@dataclass
class Block:
    """One cluster's worth of work: the runs of (setup, model, repetition), preceded by
    the single-rank baselines that give their T_1 under the same CPU sharing."""

    setup: Setup
    model: str
    rep: int
    baselines: list[Baseline]
    runs: list[Run]


@dataclass
class Plan:
    profile: Profile
    setups: list[Setup]
    baselines: list[Baseline]  # alone (concurrency 1); the first calibrates the dilation
    blocks: list[Block]
    notes: list[str] = field(default_factory=list)

    @property
    def runs(self) -> list[Run]:
        return [r for b in self.blocks for r in b.runs]

    @property
    def all_baselines(self) -> list[Baseline]:
        return self.baselines + [x for b in self.blocks for x in b.baselines]

    @property
    def total(self) -> int:
        return len(self.all_baselines) + len(self.runs)


def build_plan(profile: Profile, check_backends: bool = True) -> Plan:
    from trainers import backends as tb

    notes: list[str] = []
    setups = [Setup.parse(s) for s in profile.setups]
    def available(backend: str) -> bool:
        if not check_backends:
            return True
        try:
            tb.check_available(tb.parse_backend(backend))
            return True
        except (tb.BackendUnavailable, ValueError) as exc:
            notes.append(f"backend {backend} left out: {exc}")
            return False

    usable = [b for b in profile.backends if available(b)]
    extra = {strategy: [b for b in backends if b not in usable and available(b)]
             for strategy, backends in profile.extra_backends.items()}
    blocks: list[Block] = []
    batches_used: dict[str, set[int]] = {m: {profile.ref_batch[m]} for m in profile.models}
    for rep in range(profile.reps):
        for setup in setups:
            if setup.world < 2:
                continue
            for model in profile.models:
                runs: list[Run] = []
                for strategy in profile.strategies.get(model, ()):
                    why = applicable(model, strategy, setup)
                    if why:
                        if rep == 0:
                            notes.append(f"{model} {strategy} on {setup.name} left out: {why}")
                        continue
                    batches = (profile.batches[model] if strategy in profile.sweep_strategies
                               else (profile.ref_batch[model],))
                    for batch in batches:
                        if batch % setup.world and strategy not in ("tp", "pp"):
                            if rep == 0:
                                notes.append(f"{model} {strategy} b={batch} on {setup.name} "
                                             "left out: batch not divisible by the ranks")
                            continue
                        batches_used[model].add(batch)
                        more = extra.get(strategy, []) if batch == profile.ref_batch[model] else []
                        for backend in usable + more:
                            runs.append(Run(model, strategy, backend, setup, batch, rep))
                if not runs:
                    continue
                runs.sort(key=lambda r: (r.batch != profile.ref_batch[r.model], r.batch,
                                         r.strategy, r.backend))
                block_bases = [Baseline(model, b, setup.world, rep, setup.name)
                               for b in sorted({r.batch for r in runs})]
                blocks.append(Block(setup, model, rep, block_bases, runs))
    blocks.sort(key=lambda b: (b.rep, _setup_order(b.setup), b.model))
    baselines: list[Baseline] = []
    for rep in range(profile.reps):
        for model in profile.models:
            for batch in sorted(batches_used[model]):
                baselines.append(Baseline(model, batch, 1, rep))
    # The isolated reference-batch baselines first: they calibrate the time dilation.
    baselines.sort(key=lambda b: (b.batch != profile.ref_batch[b.model] or b.rep != 0,
                                  b.rep, b.model, b.batch))
    return Plan(profile, setups, baselines, blocks, notes)


def _setup_order(setup: Setup) -> tuple[int, str]:
    return study_report._setup_key(setup.name)


# ------------------------------------------------------------------------------ dilation
@dataclass
class Dilation:
    model: str
    rate_bits: int | None  # the emulated link rate (None: unshaped)
    factor: float
    text: str


def rate_text(bits: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.3g} {unit}"
    return f"{bits:.0f} bit/s"


def reference_for(model: str) -> study_seeds.DilationReference:
    return study_seeds.DILATION_REFERENCES["resnet" if model == "resnet18" else "gpt"]


def compute_dilation(model: str, mode: str, base_rate_bits: int | None, step_s: float | None,
                     params: int | None) -> Dilation:
    if base_rate_bits is None:
        return Dilation(model, None, 1.0, "links unshaped")
    base = format_rate(base_rate_bits)
    if mode == "none":
        return Dilation(model, base_rate_bits, 1.0, f"none: links at {base}")
    if mode != "auto":
        factor = float(mode)
        if factor <= 0:
            raise ValueError("--dilation must be auto, none or a positive number")
        rate = int(base_rate_bits / factor)
        return Dilation(model, rate, factor,
                        f"D = {factor:g} (given): links at {rate_text(rate)} stand for {base}")
    if not step_s or not params:
        raise ValueError(f"{model}: no 1x1 baseline to calibrate the time dilation")
    ref = reference_for(model)
    grad_bits = params * 4 * 8
    comm_target_s = step_s / ref.ratio
    rate = grad_bits / comm_target_s * base_rate_bits / ref.link_bits
    factor = base_rate_bits / rate
    text = (f"D = {factor:.1f}: one rank here takes {step_s * 1000:.0f} ms a step; the reference "
            f"({ref.name}) takes {ref.step_s * 1000:.0f} ms against {ref.comm_s:.2f} s for its "
            f"gradients at {format_rate(int(ref.link_bits))} (ratio {ref.ratio:.3f}); so "
            f"{params * 4 / 1e6:.2f} MB of gradients must take {comm_target_s * 1000:.0f} ms: "
            f"links at {rate_text(rate)} stand for {rate_text(base_rate_bits)}")
    return Dilation(model, int(rate), factor, text)


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


# ------------------------------------------------------------------------------- running
def train_argv(model: str, strategy: str, backend: str, batch: int, profile: Profile,
               json_path: Path | str, extra: Sequence[str] = ()) -> list[str]:
    return ["--model", model, "--strategy", strategy, "--backend", backend,
            "--batch", str(batch), "--steps", str(profile.steps),
            "--warmup-steps", str(profile.warmup), "--json", str(json_path),
            *profile.extra_args, *extra]


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text().strip().splitlines()[-1])
    except (OSError, json.JSONDecodeError, IndexError):
        return None


def record_from_result(doc: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    rec = dict(base)
    link = doc.get("link_bytes") or {}
    nano = doc.get("nanoccl_bytes") or {}
    losses = [v for v in doc.get("losses", []) if v is not None]
    rec.update({
        "status": "ok", "seq_len": doc.get("seq_len"), "unit": doc.get("unit"),
        "steps": doc.get("steps"), "warmup_steps": doc.get("warmup_steps"),
        "timed_steps": doc.get("timed_steps"), "window_s": doc.get("window_s"),
        "samples_per_s": doc.get("samples_per_s"), "units_per_s": doc.get("units_per_s"),
        "step_time_mean_s": doc.get("step_time_mean_s"),
        "step_time_std_s": doc.get("step_time_std_s"),
        "final_loss": doc.get("final_loss"), "first_loss": losses[0] if losses else None,
        "peak_rss_mb": doc.get("peak_rss_mb_max"), "params": doc.get("params"),
        "link_tx_bytes": link.get("tx_bytes"), "link_rx_bytes": link.get("rx_bytes"),
        "nanoccl_sent_bytes": nano.get("sent"), "nanoccl_inter_sent_bytes": nano.get("inter_sent"),
        "microbatches": doc.get("microbatches"), "schedule": doc.get("schedule"),
        "bucket_cap_mb": doc.get("bucket_cap_mb"),
    })
    return rec


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_baseline(base: Baseline, profile: Profile, out_dir: Path,
                 timeout_s: float) -> list[dict[str, Any]]:
    """`concurrency` single-rank runs of the same global batch at once, on this host."""
    procs: list[subprocess.Popen[bytes]] = []
    paths: list[Path] = []
    logs: list[Path] = []
    started = time.monotonic()
    try:
        for copy in range(base.concurrency):
            path = out_dir / "runs" / f"{base.key}_c{copy}.json"
            log = out_dir / "logs" / f"{base.key}_c{copy}.log"
            path.unlink(missing_ok=True)
            argv = [sys.executable, str(TRAIN)] + train_argv(
                base.model, "single", "gloo", base.batch, profile, path)
            with log.open("w") as fh:
                fh.write("$ " + shlex.join(argv) + "\n")
                fh.flush()
                procs.append(subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                                              env=_clean_env(), cwd=REPO, start_new_session=True))
            paths.append(path)
            logs.append(log)
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for proc in procs:
            _stop_group(proc)
    wall = time.monotonic() - started
    records = []
    for copy, (proc, path, log) in enumerate(zip(procs, paths, logs)):
        meta = {"kind": "baseline", "profile": profile.name, "model": base.model,
                "strategy": "single", "backend": "-", "setup": "1x1", "nodes": 1,
                "procs_per_node": 1, "world": 1, "batch": base.batch, "rep": base.rep,
                "concurrency": base.concurrency, "for_setup": base.for_setup, "copy": copy,
                "wall_s": round(wall, 2),
                "log": str(log.relative_to(out_dir))}
        doc = _load_json(path)
        if doc is None:
            rc = proc.returncode
            records.append({**meta, "status": "failed",
                            "error": "timeout" if rc is None or rc < 0 else f"exit {rc}"})
        else:
            records.append(record_from_result(doc, meta))
    return records


def run_in_cluster(cluster: EmuCluster, run: Run, profile: Profile, out_dir: Path,
                   timeout_s: float, dilation: Dilation | None,
                   extra: Sequence[str] = ()) -> dict[str, Any]:
    path = out_dir / "runs" / f"{run.key}.json"
    log = out_dir / "logs" / f"{run.key}.log"
    path.unlink(missing_ok=True)
    argv = [str(TRAIN)] + train_argv(run.model, run.strategy, run.backend, run.batch, profile,
                                     path, extra)
    meta: dict[str, Any] = {
        "kind": "train", "profile": profile.name, "model": run.model, "strategy": run.strategy,
        "backend": run.backend, "setup": run.setup.name, "nodes": run.setup.nodes,
        "procs_per_node": run.setup.ppn, "world": run.setup.world, "batch": run.batch,
        "rep": run.rep, "concurrency": 1, "copy": 0,
        "rate_bits": dilation.rate_bits if dilation else None,
        "dilation": dilation.factor if dilation else None,
        "log": str(log.relative_to(out_dir)),
    }
    started = time.monotonic()
    before = cluster.link_bytes()
    with log.open("w") as fh:
        fh.write("$ torchrun (per node) " + shlex.join(argv) + "\n")
        fh.flush()
        rc = cluster.run(argv, timeout_s=timeout_s, out=fh, fail_grace_s=15.0)
    after = cluster.link_bytes()
    meta["wall_s"] = round(time.monotonic() - started, 2)
    if before and after:
        meta["link_run_tx_bytes"] = sum(after[i].tx_bytes - before[i].tx_bytes for i in after)
        meta["link_run_rx_bytes"] = sum(after[i].rx_bytes - before[i].rx_bytes for i in after)
    # The result is written after every rank finished training (rank 0 gathers first), so
    # a rank that dies while shutting down afterwards does not void the measurement.
    doc = _load_json(path)
    if doc is None:
        reason = "timeout" if rc == 124 else f"exit {rc}"
        tail = _error_tail(log)
        return {**meta, "status": "failed", "error": f"{reason}: {tail}" if tail else reason}
    rec = record_from_result(doc, meta)
    if rc != 0:
        rec["error"] = f"exit {rc} after writing its result"
    return rec


def _error_tail(log: Path) -> str:
    """The most telling line of a failed run's log (the trainer's own message if any)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        text = line.split("] ", 1)[-1].strip()
        if text.startswith("train: ") or "Error" in text:
            return text[:160]
    return ""


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
    return text


# -------------------------------------------------------------------------------- driver
def environment() -> dict[str, Any]:
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    from trainers import backends as tb

    try:
        nanoccl = tb.import_nanoccl()
        where = f"{getattr(nanoccl, '__version__', '?')} ({Path(nanoccl.__file__).parent})"
        setting = tb.compression_setting(nanoccl)
        where += f", codecs: {'yes (' + setting + ')' if setting else 'not available yet'}"
    except tb.BackendUnavailable as exc:
        where = f"not available ({exc})"
    import torch

    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "nanoccl": where}


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

    def baseline_line(base: Baseline) -> str:
        argv = [sys.executable, str(TRAIN)] + train_argv(base.model, "single", "gloo",
                                                         base.batch, prof, "OUT.json")
        return f"  baseline, {base.concurrency} at once: {shlex.join(argv)}\n"

    for base in plan.baselines:
        out.write(baseline_line(base))
    for block in plan.blocks:
        out.write(f"  == {block.setup.name} {block.model} rep {block.rep + 1}: emucluster "
                  f"--nodes {block.setup.nodes} --procs-per-node {block.setup.ppn}\n")
        for base in block.baselines:
            out.write(baseline_line(base))
        for run in block.runs:
            argv = [str(TRAIN)] + train_argv(run.model, run.strategy, run.backend, run.batch,
                                             prof, "OUT.json")
            out.write(f"  torchrun (per node) {shlex.join(argv)}\n")


def execute(plan: Plan, args: argparse.Namespace, out_dir: Path) -> int:
    prof = plan.profile
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    base_rate = None if args.no_shaping else parse_rate(args.rate)
    meta: dict[str, Any] = {
        "profile": prof.name, "description": prof.description,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "steps": prof.steps,
        "warmup": prof.warmup, "reps": prof.reps, "rate": args.rate,
        "dilation_mode": args.dilation, "no_shaping": args.no_shaping,
        "ref_batch": prof.ref_batch, "notes": plan.notes, "environment": environment(),
        "dilation": {},
    }
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
        recs = run_baseline(base, prof, out_dir, args.run_timeout)
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
                dil = compute_dilation(base.model, args.dilation, base_rate, step, params)
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
                    progress.start(run.label)
                    rec = run_in_cluster(cluster, run, prof, out_dir, args.run_timeout, dil)
                    records.append(rec)
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


# ------------------------------------------------------------------------- cluster mode
def cluster_commands(plan: Plan, args: argparse.Namespace, out: TextIO = sys.stdout) -> None:
    """The commands of a real multi-node study, one block per run, node by node."""
    prof = plan.profile
    out_dir = args.out or "results/study/cluster"
    extra = ["--netif", args.netif] if args.netif else []
    out.write("# nanoccl study on a real cluster: run each block's lines on the node named,\n"
              f"# with this repository at the same path and {out_dir} shared (or copied back).\n"
              "# Then: python bench/study.py --collect " + out_dir + "\n")
    for note in plan.notes:
        out.write(f"# note: {note}\n")
    for base in plan.all_baselines:
        out.write(f"\n# {base.label}: on node 0, {base.concurrency} copies at once "
                  "(one per GPU)\n")
        for copy in range(base.concurrency):
            path = f"{out_dir}/runs/{base.key}_c{copy}.json"
            argv = ["python", "trainers/train.py"] + train_argv(
                base.model, "single", "gloo", base.batch, prof, path, ["--device", "cuda"])
            out.write(f"CUDA_VISIBLE_DEVICES={copy} {shlex.join(argv)} &\n")
        out.write("wait\n")
    for k, run in enumerate(plan.runs):
        path = f"{out_dir}/runs/{run.key}.json"
        out.write(f"\n# {run.label}\n")
        for node in range(run.setup.nodes):
            argv = ["torchrun", "--nnodes", str(run.setup.nodes), "--nproc-per-node",
                    str(run.setup.ppn), "--node-rank", str(node), "--master-addr",
                    args.master_addr, "--master-port", str(args.master_port + k % 100),
                    "trainers/train.py"] + train_argv(run.model, run.strategy, run.backend,
                                                      run.batch, prof, path, extra)
            out.write(f"[node {node}] {shlex.join(argv)}\n")


def run_inside(plan: Plan, args: argparse.Namespace, out_dir: Path) -> int:
    """Under an existing torchrun: every rank runs its single-rank baseline at once (T_1
    under the same sharing), then each run of the plan whose setup matches this launch,
    each with a fresh rendezvous port (rank 0 hosts the store: static rendezvous,
    --master-addr = node 0)."""
    from trainers import train

    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    rank = int(os.environ["RANK"])
    setup = Setup(world // local, local)
    prof = plan.profile
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    device = ["--device", args.device] if args.device else []
    extra = device + (["--netif", args.netif] if args.netif else [])
    port = int(os.environ.get("MASTER_PORT", "29500"))
    saved = {k: os.environ.get(k) for k in _LAUNCH_VARS}
    for rep in range(prof.reps):
        for model in prof.models:
            for batch in sorted({r.batch for r in plan.runs if r.model == model} |
                                {prof.ref_batch[model]}):
                base = Baseline(model, batch, world, rep, setup.name)
                path = out_dir / "runs" / f"{base.key}_c{rank}.json"
                train.main(train_argv(model, "single", "gloo", batch, prof, path,
                                      device + ["--standalone"]))
    mine = [r for r in plan.runs if r.setup == setup]
    for k, run in enumerate(mine):
        os.environ["MASTER_PORT"] = str(port + 1 + k)
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        path = out_dir / "runs" / f"{run.key}.json"
        if rank == 0:
            print(f"study: [{k + 1}/{len(mine)}] {run.label}", flush=True)
        train.main(train_argv(run.model, run.strategy, run.backend, run.batch, prof, path,
                              extra))
    for key, value in saved.items():
        if value is not None:
            os.environ[key] = value
    if rank == 0:
        return collect(out_dir, prof, setups=[setup])
    return 0


def collect(out_dir: Path, prof: Profile | None = None,
            setups: Sequence[Setup] | None = None) -> int:
    """Builds runs.csv and the report from the JSON files in out_dir/runs."""
    records: list[dict[str, Any]] = []
    for path in sorted((out_dir / "runs").glob("*.json")):
        doc = _load_json(path)
        if doc is None or doc.get("kind") != "nanoccl_train_result":
            continue
        name = path.stem
        world = int(doc["world_size"])
        base = {"profile": prof.name if prof else "cluster", "model": doc["model"],
                "strategy": doc["strategy"], "backend": doc["backend"],
                "batch": doc["global_batch"], "world": world, "nodes": doc["nodes"],
                "procs_per_node": doc["procs_per_node"],
                "setup": f"{doc['nodes']}x{doc['procs_per_node']}",
                "rep": int(name.split("_r")[-1].split("_")[0]) if "_r" in name else 0}
        if "_baseline_x" in name:
            tail = name.split("_baseline_x")[1]
            conc = int(tail.split("_")[0])
            for_setup = tail.split("_for")[1].split("_")[0] if "_for" in tail else "1x1"
            base.update(kind="baseline", setup="1x1", backend="-", concurrency=conc,
                        for_setup=for_setup, copy=int(name.rsplit("_c", 1)[1]))
        else:
            base.update(kind="train", concurrency=1, copy=0)
        records.append(record_from_result(doc, base))
    if not records:
        print(f"study: no results in {out_dir / 'runs'}", file=sys.stderr)
        return 1
    study_report.write_runs_csv(out_dir / "runs.csv", records)
    meta_path = out_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    if prof is not None:
        meta.update(profile=prof.name, steps=prof.steps, warmup=prof.warmup, reps=prof.reps,
                    ref_batch=prof.ref_batch)
    meta.setdefault("profile", "cluster")
    meta.setdefault("environment", environment())
    meta.setdefault("cluster", "real nodes" + (
        f" ({', '.join(s.name for s in setups)})" if setups else ""))
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    meta_path.write_text(json.dumps(meta, indent=1))
    report = study_report.build(out_dir)
    print(f"study: wrote {report}")
    return 0


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
    p.add_argument("--no-shaping", action="store_true",
                   help="no namespaces: all nodes on the host loopback, unshaped (no root)")
    p.add_argument("--models", type=_csv, default=None, help="override, comma-separated")
    p.add_argument("--strategies", type=_csv, default=None, help="override, comma-separated")
    p.add_argument("--setups", type=_csv, default=None, help="override, e.g. 1x1,1x2,2x1")
    p.add_argument("--backends", type=_csv, default=None,
                   help="override: gloo, nccl, nanoccl, nanoccl+<codec>")
    p.add_argument("--batches", type=_csv, default=None,
                   help="override the global batch sizes (first = reference)")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--budget-min", type=float, default=None,
                   help="stop starting runs after this many minutes (0: no budget)")
    p.add_argument("--run-timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--allow-failures", action="store_true", help="exit 0 even if runs failed")
    p.add_argument("--collect", default=None, metavar="DIR",
                   help="build the report from DIR/runs/*.json (cluster mode)")
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
        prof.strategies = {m: args.strategies for m in prof.models}
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
    if args.budget_min is not None:
        prof.budget_min = args.budget_min or None
    if prof.warmup >= prof.steps:
        raise SystemExit("study: --warmup must be smaller than --steps")
    for s in prof.setups:
        Setup.parse(s)
    return prof


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.collect:
        return collect(Path(args.collect))
    prof = apply_overrides(PROFILES[args.profile], args)
    out_dir = Path(args.out) if args.out else REPO / "results" / "study" / prof.name
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
        return execute(plan, args, out_dir)
    except KeyboardInterrupt:
        print("study: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
