"""What the study runs: the profiles table, the setups, and the plan (used by bench/study.py).

A profile names the models, strategies, setups ("nodes x ranks per node"), backends and
batch sizes of a study. build_plan() turns it into the single-rank baselines run alone and
the cluster blocks: per (setup, model, repetition), the baselines that give T_1 under that
setup's CPU sharing, then its training runs; what cannot run (applicable()) is left out
with a note.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for _path in (str(BENCH), str(REPO)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import study_report  # noqa: E402


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
    # More timed steps where a run's steps are short: the trainer's --min-window-s (0: off).
    min_window_s: float = 0.0
    budget_min: float | None = None
    description: str = ""
    extra_args: tuple[str, ...] = ()
    # Long runs (bench/study_long.py): the held-out loss every eval_every steps (0: none) on
    # eval_sequences sequences; corpus: train on the prepared corpus (bench/corpus.py).
    eval_every: int = 0
    eval_sequences: int = 256
    corpus: bool = False
    # Only these backends for a strategy family ("diloco": every diloco row), where given.
    strategy_backends: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Rows ("strategy@backend") that run prefix_steps steps and, where they train the same
    # bits as the row named, take its curve on their own clock (study_long); "full": a row
    # that does not runs to the end, "none": it is left without a time.
    computed: dict[str, str] = field(default_factory=dict)
    prefix_steps: int = 0
    fallback: str = "full"


GPT_STRATEGIES = ("dp", "tp", "pp", "zero1", "zero2", "zero3", "zero3-hpz", "hsdp")

# A diloco row times at least this many whole H-step cycles (every H consecutive inner steps
# hold one exchange of each fragment, so a whole number of cycles is its steady state).
DILOCO_CYCLES = 2


@dataclass(frozen=True)
class DiLoCoSpec:
    """A diloco row of the study: "diloco" (H 50, one fragment, no overlap, outer lr 0.7) or
    "diloco-h<H>[-f<F>][-t<TAU>][-lr<LR>]", e.g. "diloco-h10-f4-t2" (Streaming DiLoCo, 4
    fragments, each exchange 2 inner steps behind) or "diloco-h10-lr0.35" (the outer Nesterov's
    lr; momentum 0.9 always). The outer codec is the row's backend's."""

    sync_every: int = 50
    fragments: int = 1
    overlap_steps: int = 0
    outer_lr: float = 0.7

    @staticmethod
    def parse(strategy: str) -> "DiLoCoSpec | None":
        """The spec of a diloco strategy name, None for the other strategies; ValueError for
        a malformed one."""
        if strategy != "diloco" and not strategy.startswith("diloco-"):
            return None
        usage = ("use diloco or diloco-h<H>[-f<F>][-t<TAU>][-lr<LR>], e.g. diloco-h10-f4-t2 "
                 "or diloco-h10-lr0.35")
        values: dict[str, float] = {"h": 50, "f": 1, "t": 0, "lr": 0.7}
        for part in strategy.split("-")[1:]:
            key = "lr" if part.startswith("lr") else part[:1]
            text = part[len(key):]
            if key == "lr" and re.fullmatch(r"\d+(\.\d*)?|\.\d+", text):
                values[key] = float(text)
            elif key in values and key != "lr" and text.isdigit():
                values[key] = int(text)
            else:
                raise ValueError(f"bad diloco strategy {strategy!r}: {usage}")
        spec = DiLoCoSpec(int(values["h"]), int(values["f"]), int(values["t"]), values["lr"])
        if (spec.sync_every < 1 or spec.fragments < 1
                or not 0 <= spec.overlap_steps < spec.sync_every
                or not 0 < spec.outer_lr <= 10):
            raise ValueError(f"bad diloco strategy {strategy!r}: H >= 1, F >= 1, 0 <= TAU < H, "
                             "0 < LR <= 10")
        return spec

    @property
    def name(self) -> str:
        """The canonical strategy name: "diloco" for the defaults, else every field (the lr
        only where it is not the default)."""
        if self == DiLoCoSpec():
            return "diloco"
        lr = "" if self.outer_lr == DiLoCoSpec.outer_lr else f"-lr{self.outer_lr:g}"
        return f"diloco-h{self.sync_every}-f{self.fragments}-t{self.overlap_steps}{lr}"

    @staticmethod
    def of_result(doc: dict[str, Any]) -> str:
        """The strategy name of a trainer's result line: a diloco run's canonical name from
        its "diloco" field, else the trainer's strategy."""
        fields = doc.get("diloco")
        if doc.get("strategy") != "diloco" or not isinstance(fields, dict):
            return str(doc.get("strategy"))
        return DiLoCoSpec(int(fields["sync_every"]), int(fields["fragments"]),
                          int(fields["overlap_steps"]),
                          float(fields.get("outer_lr", DiLoCoSpec.outer_lr))).name

    def trainer_args(self) -> list[str]:
        return ["--sync-every", str(self.sync_every), "--fragments", str(self.fragments),
                "--overlap-steps", str(self.overlap_steps), "--outer-lr", f"{self.outer_lr:g}"]

    def steps(self, steps: int, warmup: int) -> int:
        """The run's steps: at least the warm-up and DILOCO_CYCLES cycles of H."""
        return max(steps, warmup + DILOCO_CYCLES * self.sync_every)

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
        {"gpt2-tiny": 16, "resnet18": 32}, reps=3, steps=6, warmup=2, min_window_s=2.0,
        budget_min=70.0,
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
                    "repetitions, each timing at least 4 steps and about 2 s; "
                    "runs still queued after 70 minutes are skipped and listed"),
    "cluster": Profile(
        "cluster", ("gpt2-small", "resnet18"),
        {"gpt2-small": ("dp", "tp", "pp", "zero1", "zero2", "zero3", "hsdp"),
         "resnet18": ("dp",)},
        ("1x1", "1x2", "2x1", "2x2"), ("nccl", "nanoccl"),
        {"gpt2-small": (4, 8, 16), "resnet18": (32, 128, 512, 2048)},
        {"gpt2-small": 16, "resnet18": 512}, reps=5, steps=50, warmup=10,
        description="real multi-node GPU runs (the studies' workloads, no dilation)"),
    "long": Profile(
        "long", ("gpt2-tiny",),
        {"gpt2-tiny": ("dp", "diloco-h10-f1-t0", "diloco", "diloco-h10-f2-t1",
                       "diloco-h50-f5-t2")},
        ("2x1", "2x2"), ("gloo", "nanoccl", "nanoccl+int8", "nanoccl+int4"),
        {"gpt2-tiny": (16,)}, {"gpt2-tiny": 16}, reps=1, steps=4000, warmup=2,
        eval_every=100, eval_sequences=256, corpus=True,
        strategy_backends={"diloco": ("nanoccl+int4",)},
        computed={"dp@nanoccl": "dp@gloo"}, prefix_steps=300,
        description="hours: gpt2-tiny on real text (bench/corpus.py), 4000 steps, held-out "
                    "loss every 100: DDP on Gloo and nanoccl, DP with int8/int4 error "
                    "feedback, DiLoCo H 10 and 50 with int4 outer gradients, streaming and "
                    "not; time to DDP-on-Gloo's final held-out loss + 2% (study_long.py); "
                    "nanoccl's lossless DDP runs 300 steps and is computed where it trains "
                    "Gloo's bits"),
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
    # A computed row (Profile.computed): the row ("strategy@backend") of the same block whose
    # bits it must train over its prefix; "" for a run to the end.
    same_as: str = ""

    @property
    def row(self) -> str:
        return f"{self.strategy}@{self.backend}"

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
    if DiLoCoSpec.parse(strategy) is not None and setup.nodes < 2:
        return "diloco on one node is dp (no outer steps)"
    return None


def backend_applicable(strategy: str, backend: str) -> str | None:
    """Why `strategy` cannot run on `backend`, or None when it can."""
    if DiLoCoSpec.parse(strategy) is not None and not backend.startswith("nanoccl"):
        return "diloco runs on nanoccl only"
    return None


def family(strategy: str) -> str:
    """'diloco' for every diloco row, else the strategy."""
    return "diloco" if DiLoCoSpec.parse(strategy) is not None else strategy


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
                        only = profile.strategy_backends.get(family(strategy))
                        for backend in usable + more:
                            if only is not None and backend not in only:
                                continue
                            why = backend_applicable(strategy, backend)
                            if why:
                                note = f"{model} {strategy} on {backend} left out: {why}"
                                if note not in notes:
                                    notes.append(note)
                                continue
                            runs.append(Run(model, strategy, backend, setup, batch, rep))
                if not runs:
                    continue
                runs = _computed_rows(profile, runs, notes if rep == 0 else [])
                runs.sort(key=lambda r: (r.batch != profile.ref_batch[r.model], r.batch,
                                         bool(r.same_as), r.strategy, r.backend))
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


def _computed_rows(profile: Profile, runs: list[Run], notes: list[str]) -> list[Run]:
    """Marks the rows of profile.computed whose reference row is in the same block (same
    batch): they run after it (the sort puts them last), for a prefix only."""
    out = []
    for run in runs:
        ref = profile.computed.get(run.row)
        if ref and any(r.row == ref and r.batch == run.batch for r in runs):
            run = replace(run, same_as=ref)
        elif ref:
            note = (f"{run.model} {run.row} on {run.setup.name} runs to the end: {ref} is not "
                    "in the study to compare it with")
            if note not in notes:
                notes.append(note)
        out.append(run)
    return out


def _setup_order(setup: Setup) -> tuple[int, str]:
    return study_report._setup_key(setup.name)
