"""What a rank computes, for nanoccl-advise (advise.py): one device's step measured here
(`--probe`), and each strategy's own framework time a step (DDP's hooks and bucket copies,
FSDP2's hooks and DTensor optimizer, DTensor's dispatch), measured by running the reference
trainer on one rank (`--probe-framework`) or given (`--framework-seconds`); the model adds it
to a rank's step on the critical path (framework_seconds())."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from nanoccl.advise_traffic import AdviseError, ModelSpec

# Strategies whose framework time a step the one-rank probe measures (probe_framework_seconds);
# hpZ takes ZeRO-3's (on one rank it would run as ZeRO-2) and the pipeline has none (a
# pipeline needs two stages).
FRAMEWORK_PROBED = ("dp", "zero1", "zero2", "zero3", "hsdp", "tp")


def framework_time_ok(name: str, seconds: float) -> bool:
    """A framework time the model takes: a strategy of FRAMEWORK_PROBED, finite seconds >= 0."""
    return name in FRAMEWORK_PROBED and seconds >= 0 and math.isfinite(seconds)


def framework_seconds(strategy: str, framework_s: Mapping[str, float] | None) -> float:
    """A strategy's framework time a step from what the probe measured or the user gave
    (FRAMEWORK_PROBED's names); 0 where not known. hpZ takes ZeRO-3's."""
    if not framework_s:
        return 0.0
    return max(0.0, float(framework_s.get("zero3" if strategy == "zero3-hpz" else strategy,
                                          0.0)))


@dataclass
class StepProbe:
    """One device's step on the global batch (step_s) and two parts of it: the optimizer's
    step (optimizer_s) and the part of forward and backward that does not shrink with the
    batch (fixed_s: 0 where only one batch was measured)."""

    step_s: float
    optimizer_s: float
    fixed_s: float = 0.0


def repository() -> Path:
    """The nanoccl repository this package runs from (an editable install), whose reference
    trainers and tools the probes run as programs; AdviseError where there is none."""
    repo = Path(__file__).resolve().parents[2]
    if not (repo / "trainers" / "train.py").is_file() or not (repo / "bench").is_dir():
        raise AdviseError("the probes run the reference trainers (trainers/, bench/): they need "
                          "the nanoccl repository, not only the installed package; give the "
                          "step time instead (--step-seconds, --framework-seconds)")
    return repo


def probe_step_seconds(spec: ModelSpec, steps: int = 3,
                       small_batch: int | None = None, timeout_s: float = 600.0) -> StepProbe:
    """One device's training step on the whole global batch, measured here, and the part of
    it that is the optimizer's step: bench/advise_probe_step.py runs the reference model (real
    weights on CPU, or the first CUDA device) with the trainers' AdamW on random data, in a
    process of its own; the medians of `steps` after one warm-up step. With `small_batch` (a
    rank's batch, smaller than the global one) the step is measured there too, and the
    forward and backward taken as a fixed part plus a part proportional to the batch, through
    the two points (fixed_s)."""
    import json
    import subprocess

    import torch

    repo = repository()
    # The child computes with this process's threads (a caller that set one thread a rank, as
    # the study's ranks have, measures with one).
    cmd = [sys.executable, str(repo / "bench" / "advise_probe_step.py"), "--model", spec.name,
           "--batch", str(spec.batch), "--steps", str(steps),
           "--threads", str(torch.get_num_threads())]
    if spec.gpt:
        cmd += ["--gpt", f"{spec.layers},{spec.heads},{spec.hidden},{spec.vocab},{spec.seq}"]
    if small_batch and 1 <= small_batch < spec.batch:
        cmd += ["--small-batch", str(small_batch)]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=repo)
    except subprocess.TimeoutExpired:
        raise AdviseError(f"step probe: took over {timeout_s:g} s") from None
    if run.returncode != 0:
        tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-5:])
        raise AdviseError(f"step probe failed (exit {run.returncode}):\n{tail}")
    got = json.loads(run.stdout.strip().splitlines()[-1])
    return StepProbe(got["step_s"], got["optimizer_s"], got.get("fixed_s", 0.0))


def probe_framework_seconds(spec: ModelSpec, strategies: Sequence[str] = FRAMEWORK_PROBED,
                            steps: int = 12, warmup: int = 3,
                            timeout_s: float = 600.0) -> dict[str, float]:
    """Each strategy's framework time a step, measured here: its step on one rank less the
    plain step (probe_one_rank_steps()). A negative difference is noise (0 in the model:
    framework_seconds())."""
    got = probe_one_rank_steps(spec, strategies, steps, warmup, timeout_s)
    return {s: got[s] - got["single"] for s in strategies}


def probe_one_rank_steps(spec: ModelSpec, strategies: Sequence[str] = FRAMEWORK_PROBED,
                         steps: int = 12, warmup: int = 3,
                         timeout_s: float = 600.0) -> dict[str, float]:
    """The reference trainer's step (trainers/train.py under torchrun, one rank, backend
    nanoccl, the whole global batch) with each strategy and with none ("single"): the medians
    of the steps after `warmup`, in seconds. On one rank nothing is split or sent, so a
    strategy's step less the plain one is the framework's own work: DDP's hooks and bucket
    copies, FSDP2's hooks and DTensor optimizer, DTensor's dispatch (TP runs on one rank with
    train.py's `--probe-one-rank`)."""
    import json
    import os
    import statistics
    import subprocess
    import tempfile

    import torch

    unknown = [s for s in strategies if s not in FRAMEWORK_PROBED]
    if unknown:
        raise AdviseError(f"cannot probe {', '.join(unknown)}: probed are "
                          f"{', '.join(FRAMEWORK_PROBED)}")
    if steps <= warmup or warmup < 0:
        raise AdviseError("the probe needs steps > warmup >= 0")
    train = repository() / "trainers" / "train.py"
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def step_seconds(strategy: str, folder: str) -> float:
        out = Path(folder) / f"{strategy}.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "1", str(train), "--model", spec.name, "--strategy",
               strategy, "--backend", "nanoccl", "--device", device, "--batch",
               str(spec.batch), "--steps", str(steps), "--warmup-steps", str(warmup),
               "--print-every", "0", "--json", str(out)]
        if spec.gpt:
            cmd += ["--seq-len", str(spec.seq)]
        if strategy == "tp":
            cmd.append("--probe-one-rank")
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                 env={**os.environ, "OMP_NUM_THREADS":
                                      os.environ.get("OMP_NUM_THREADS", "1")})
        except subprocess.TimeoutExpired:
            raise AdviseError(f"framework probe: {strategy} on one rank took over "
                              f"{timeout_s:g} s") from None
        if run.returncode != 0 or not out.is_file():
            tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-5:])
            raise AdviseError(f"framework probe: {strategy} on one rank failed "
                              f"(exit {run.returncode}):\n{tail}")
        times = json.loads(out.read_text())["step_time_s"][warmup:]
        return statistics.median(times)

    with tempfile.TemporaryDirectory(prefix="nanoccl-probe-") as folder:
        return {s: step_seconds(s, folder) for s in ("single", *strategies)}


def parse_framework_seconds(text: str) -> dict[str, float]:
    """--framework-seconds: NAME=SECONDS[,NAME=SECONDS...], names of FRAMEWORK_PROBED."""
    out: dict[str, float] = {}
    for item in (t.strip() for t in text.split(",")):
        name, _, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not framework_time_ok(name, seconds):
            raise AdviseError(f"--framework-seconds {item!r}: NAME=SECONDS with NAME one of "
                              f"{', '.join(FRAMEWORK_PROBED)} and SECONDS >= 0")
        out[name] = seconds
    return out
