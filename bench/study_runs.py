"""Running the study's items on this host (used by bench/study.py and nanoccl-advise --check).

The time dilation of the emulated links (see bench/study.py's docstring), the trainer's
command line (trainers/train.py), a group of single-rank baselines at once, one training
run on an EmuCluster (bench/emucluster.py), the record (a runs.csv row) made of a run's
JSON result, and the description of this host that goes into meta.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for _path in (str(BENCH), str(REPO)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import study_seeds  # noqa: E402
from emucluster import EmuCluster, format_rate, stop_process_group  # noqa: E402
from study_plan import Baseline, DiLoCoSpec, Profile, Run  # noqa: E402

TRAIN = REPO / "trainers" / "train.py"


def encode_curve(curve: Sequence[dict[str, Any]]) -> str:
    """runs.csv's eval_curve: [[step, tokens, time_s, loss, sha], ...] (floats round-trip)."""
    return json.dumps([[p["step"], p["tokens"], p["time_s"], p["loss"],
                        p.get("params_sha256")] for p in curve], separators=(",", ":"))


def decode_curve(text: Any) -> list[dict[str, Any]]:
    if not text:
        return []
    return [{"step": int(s), "tokens": int(t), "time_s": float(ts), "loss": float(loss),
             "params_sha256": sha} for s, t, ts, loss, sha in json.loads(text)]
# What a single-rank baseline must not inherit from a surrounding torchrun.
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "GROUP_WORLD_SIZE")


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


def recorded_dilation(study_dir: Path, model: str) -> Dilation:
    """The time dilation a study in study_dir ran `model` under (its meta.json), to measure
    some of its setups again at the same link rate (--dilation-of, then --merge)."""
    meta_path = Path(study_dir) / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--dilation-of: cannot read {meta_path}: {exc}") from exc
    dilations = meta.get("dilation") if isinstance(meta, dict) else None
    rec = dilations.get(model) if isinstance(dilations, dict) else None
    if not isinstance(rec, dict) or "factor" not in rec or "rate_bits" not in rec:
        raise ValueError(f"--dilation-of: {meta_path} records no time dilation for {model}")
    rate, factor = rec["rate_bits"], rec["factor"]
    if rate is not None and (type(rate) is not int or rate <= 0):
        raise ValueError(f"--dilation-of: {meta_path}: {model}'s rate_bits is {rate!r}")
    if type(factor) not in (int, float) or not 0 < factor < float("inf"):
        raise ValueError(f"--dilation-of: {meta_path}: {model}'s factor is {factor!r}")
    where = f"links at {rate_text(rate)}" if rate else "links unshaped"
    return Dilation(model, rate, factor,
                    f"D = {factor:.1f} as in {study_dir} ({where})")


# ------------------------------------------------------------------------------- running
def train_argv(model: str, strategy: str, backend: str, batch: int, profile: Profile,
               json_path: Path | str, extra: Sequence[str] = ()) -> list[str]:
    """The trainer's command line for a run; a diloco row ("diloco-h10-f4-t2") becomes
    --strategy diloco with its H, F and tau, and runs whole H-step cycles (DiLoCoSpec)."""
    steps = profile.steps
    diloco = DiLoCoSpec.parse(strategy)
    if diloco is not None:
        strategy = "diloco"
        steps = diloco.steps(steps, profile.warmup)
        extra = [*diloco.trainer_args(), *extra]
    return ["--model", model, "--strategy", strategy, "--backend", backend,
            "--batch", str(batch), "--steps", str(steps),
            "--warmup-steps", str(profile.warmup), "--json", str(json_path),
            *(["--min-window-s", f"{profile.min_window_s:g}"] if profile.min_window_s > 0
              else []),
            *(["--eval-every", str(profile.eval_every), "--eval-sequences",
               str(profile.eval_sequences)] if profile.eval_every > 0 else []),
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
    # The loss after the steps asked for, the same for every row of a profile, where a run
    # timed more steps to fill its window (--min-window-s): rows' losses stay comparable.
    asked = doc.get("steps_asked") or doc.get("steps") or 0
    every = doc.get("losses") or []
    final = every[asked - 1] if 0 < asked <= len(every) and every[asked - 1] is not None \
        else doc.get("final_loss")
    rec.update({
        "status": "ok", "seq_len": doc.get("seq_len"), "unit": doc.get("unit"),
        "steps": doc.get("steps"), "warmup_steps": doc.get("warmup_steps"),
        "timed_steps": doc.get("timed_steps"), "window_s": doc.get("window_s"),
        "samples_per_s": doc.get("samples_per_s"), "units_per_s": doc.get("units_per_s"),
        "step_time_mean_s": doc.get("step_time_mean_s"),
        "step_time_std_s": doc.get("step_time_std_s"),
        "final_loss": final, "first_loss": losses[0] if losses else None,
        "peak_rss_mb": doc.get("peak_rss_mb_max"), "params": doc.get("params"),
        "link_tx_bytes": link.get("tx_bytes"), "link_rx_bytes": link.get("rx_bytes"),
        "nanoccl_sent_bytes": nano.get("sent"), "nanoccl_inter_sent_bytes": nano.get("inter_sent"),
        "microbatches": doc.get("microbatches"), "schedule": doc.get("schedule"),
        "bucket_cap_mb": doc.get("bucket_cap_mb"),
    })
    held = doc.get("held_out")
    if isinstance(held, dict) and held.get("curve"):  # --eval-every (study_long.py)
        rec.update({"eval_every": held.get("every"), "eval_loss": held.get("final_loss"),
                    "eval_curve": encode_curve(held["curve"])})
    return rec


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
            stop_process_group(proc, grace_s=5.0)
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
                   extra: Sequence[str] = (), key: str | None = None) -> dict[str, Any]:
    """One training run; its files are runs/<key>.json and logs/<key>.log (key: run.key)."""
    key = key or run.key
    path = out_dir / "runs" / f"{key}.json"
    log = out_dir / "logs" / f"{key}.log"
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


# --------------------------------------------------------------------------- environment
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
