"""nanoccl-advise: which parallelism, codec and bucket size for this model on this cluster.

    nanoccl-advise --model gpt2-small --batch 16 --cluster 2x2 --inter-gbps 1 \\
        --step-seconds 0.556 --png advice.png

For every strategy the reference trainers run (trainers/strategies.py: DP, ZeRO-1, ZeRO-2/3 as
FSDP2, HSDP, PP with GPipe or 1F1B, TP, and across nodes DiLoCo: nanoccl.diloco), each with the
codecs nanoccl would apply to its calls, the
advisor predicts the step time, the scaling factor S = T_1 / (n x step), the bytes a step puts
on each link class and the memory a device needs, and ranks the configurations that fit.

Where the numbers come from:
- Traffic: the calls each trainer makes in one step, as nanoccl.stats() counts them in the
  study runs (results/study/full/runs.csv; tests/study/test_advise.py checks them against
  bytes measured through nanoccl): DDP's gradient buckets (DDP's own bucketing rule,
  nanoccl.tune.ddp_bucket_sizes); ZeroRedundancyOptimizer's one broadcast per parameter from
  its owner after the step; FSDP2's allgather per unit in forward (and again in backward for
  ZeRO-3) and reduce-scatter per unit in backward; HSDP's the same within a node, then each
  rank's shard allreduced across nodes (the replicate groups of a node share its link);
  DTensor TP's 2 forward and 4 backward
  allreduces of a block's activations; the pipeline's activations and their gradients at
  each stage boundary, per microbatch (and, for a stack that keeps GPT-2's embedding tied,
  STUDY_STACK, its gradient allreduced between the first and the last stage after the flush).
- Time of each call: nanoccl's planner and cost model (collectives/cost_model.h) through
  nanoccl._C.predict_collective, from a link profile: the tuner's file (nanoccl-tune), or
  bandwidth and latency per link class given here plus this machine's codec rates.
- Overlap of communication with compute (stated in the output): forward is 1/3 and backward
  2/3 of a device's compute; DDP's buckets run one after another as backward produces them
  (nanoccl.tune.ddp_step_seconds); FSDP2's allgathers are prefetched (a unit waits for its
  own) and its reduce-scatters follow each unit's backward; TP's allreduces and ZeRO-1's
  broadcasts are on the critical path; a pipeline step is simulated microbatch by
  microbatch (GPipe or 1F1B order; a stage waits for its input, each boundary link carries
  one message at a time each way). The calls of one group run one after another (nanoccl's
  queue), and compute never slows down for communication (no CPU contention modelled).
- Compute a rank: its share of one device's step (the batch split n ways; TP splits the
  blocks' matmuls and repeats the output head's on every rank), its share of the optimizer's
  step (`--optimizer-seconds`, a part of the device's step: as the strategy shards the
  parameters, all of it under DP, optimizer_share()), the part of its forward and backward
  that does not shrink with the batch (`--fixed-seconds`: whole on every rank, on a stage
  once a microbatch), plus the strategy's own framework time a step where it is known (DDP,
  FSDP2's hooks, DTensor's dispatch: the trainer's step on one rank less the plain model's,
  `--probe-framework`, or given by `--framework-seconds`; nanoccl/advise_probe.py), on the
  critical path. The pipeline has none measured (it needs two ranks).
- Memory (fp32 training with AdamW, 16 bytes a parameter, sharded as each strategy shards
  it) plus the activations backward keeps (advise_models.py: the reference models' shapes).

``--check N`` then trains the N best and stock DP on the emulated cluster of this machine and
prints predicted against measured (bench/advise_check.py of the repository, run as a program).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from nanoccl.cli import OneLineParser
from nanoccl.advise_probe import (FRAMEWORK_PROBED, framework_seconds, framework_time_ok,
                                  parse_framework_seconds, probe_framework_seconds,
                                  probe_one_rank_steps, probe_step_seconds, repository)
from nanoccl.advise_traffic import (REFERENCE_STACK, STUDY_STACK, AdviseError, Call, Cluster,
                                    ModelSpec, Stack, ddp_buckets, diloco_calls, fsdp_calls,
                                    gpt_by_hand,
                                    hsdp_calls, link_bytes, model_spec, parse_cluster,
                                    pp_tied_embedding_call, strategy_refusal, tp_calls,
                                    tree_edges, zero1_broadcasts)
from nanoccl.advise_schedule import FORWARD_SHARE, fsdp_step, pipeline_step
from nanoccl.tune import BUCKET_CANDIDATES_MB, ddp_step_seconds

__all__ = ["REFERENCE_STACK", "STUDY_STACK", "AdviseError", "Call", "Cluster", "Config",
           "ModelSpec", "Predictor", "Stack", "advise", "evaluate", "gpt_by_hand", "link_bytes",
           "main", "model_spec", "parse_cluster", "pipeline_step", "profile_by_hand",
           "profile_from_file", "tree_edges", "FRAMEWORK_PROBED", "framework_seconds",
           "probe_framework_seconds", "probe_one_rank_steps", "probe_step_seconds",
           "tp_compute_share"]

CODECS = ("none", "bf16", "int8", "int4")
# DiLoCo's (H, F, tau) the advisor predicts: the study's long profile's rows.
DILOCO_SETTINGS = ((10, 1, 0), (50, 1, 0), (10, 2, 1), (50, 5, 2))
# The group's codec applies to calls of at least this many bytes (NANOCCL_COMPRESSION_MIN_BYTES'
# default); DDP's error-feedback hook, FSDP2's compress_fsdp and HSDP's replicate group (as the
# trainers set them up) compress every call (Call.hook).
COMPRESSION_MIN_BYTES = 1 << 20
BYTES_PER_PARAM = 16  # fp32 parameter + gradient + AdamW's two moments
OVERLAP_TEXT = (
    "overlap: forward 1/3, backward 2/3 of compute; DP/ZeRO-1 buckets overlap backward in "
    "order (DDP); ZeRO-1's broadcasts after the step are exposed; FSDP2 allgathers prefetched, "
    "reduce-scatters after each unit's backward; TP allreduces exposed; PP's schedule "
    "simulated (a stage waits for its inputs, a boundary link carries one message at a time "
    "each way); calls of one group run one after another")


# --------------------------------------------------------------------------- link profile
def profile_from_file(path: str) -> str:
    """The text of a link profile saved by nanoccl-tune; AdviseError naming the file."""
    from nanoccl import _C

    try:
        loaded = _C.load_link_profile(path)
    except ValueError as exc:
        raise AdviseError(f"link profile: {exc}") from None
    if loaded is None:
        raise AdviseError(f"link profile: no file at {path} (run nanoccl-tune first, or give "
                          "--inter-gbps)")
    return str(loaded["text"])


def profile_by_hand(inter_gbps: float, inter_latency_us: float, intra_gbps: float,
                    intra_latency_us: float, cpu_share: float = 1.0,
                    cpu_rates: str | None = None) -> str:
    """A link profile from bandwidth (Gbit/s, one direction) and latency per link class; the
    reduce and codec rates are `cpu_rates` (a profile's text) or measured here (~50 ms)."""
    from nanoccl import _C

    for what, v in (("inter-node bandwidth", inter_gbps), ("intra-node bandwidth", intra_gbps)):
        if not v > 0:
            raise AdviseError(f"{what} {v} Gbit/s: must be > 0")
    if inter_latency_us < 0 or intra_latency_us < 0:
        raise AdviseError("latencies must be >= 0")
    rates = cpu_rates if cpu_rates is not None else _C.measure_cpu_rates()
    keep = [ln for ln in rates.splitlines()
            if ln.split()[:1] and ln.split()[0] in ("reduce_MBps", "codec")]
    inter, intra = inter_gbps * 1e3 / 8, intra_gbps * 1e3 / 8
    return "\n".join([
        "version 1", "shape given", "transport tcp", "nsocks 1", "measured by-hand",
        f"inter alpha_us {inter_latency_us:g} pair_MBps {inter:g} node_MBps {inter:g}",
        f"intra alpha_us {intra_latency_us:g} pair_MBps {intra:g} node_MBps {intra:g}",
        f"cpu_share {min(max(cpu_share, 0.01), 1.0):g}", *keep]) + "\n"


# ------------------------------------------------------------------------------- calls
@dataclass
class Priced:
    call: Call
    seconds: float
    algorithm: str
    codec: str
    intra_bytes: float  # sent over all ranks
    inter_bytes: float
    # The call's time is the rank's own cores' work (Gloo's TCP over loopback on CPU ranks
    # that fill the machine): it cannot hide under compute, it adds to the step.
    exposed: bool = False


def hidden_seconds(priced: Sequence[Priced]) -> list[float]:
    """Each call's time for the overlap schedules: an exposed call's none (exposed_seconds)."""
    return [0.0 if p.exposed else p.seconds for p in priced]


def exposed_seconds(priced: Sequence[Priced]) -> float:
    return sum(p.seconds for p in priced if p.exposed)


class Predictor:
    """Prices calls with nanoccl's planner and cost model (cached per distinct call)."""

    def __init__(self, cluster: Cluster, profile: str, settings: dict[str, str] | None = None):
        self.cluster, self.profile, self.settings = cluster, profile, dict(settings or {})
        self._cache: dict[tuple[Any, ...], tuple[str, str, float, float]] = {}
        self._groups: dict[tuple[int, int], Predictor] = {}

    def _group(self, nodes: int, per_node: int) -> "Predictor":
        if (nodes, per_node) not in self._groups:
            self._groups[(nodes, per_node)] = Predictor(Cluster(nodes, per_node), self.profile,
                                                        self.settings)
        return self._groups[(nodes, per_node)]

    def _price_in_mesh(self, call: Call, codec: str) -> Priced:
        """A call on one of HSDP's mesh groups; every such group runs it at once. A node's
        ranks (shard) stay on their node; the replicate groups (one a local rank) share each
        node's link, so their time is one allreduce of all of them between the nodes."""
        c = self.cluster
        alone = dataclasses.replace(call, group="world")
        if call.group == "shard":
            p = self._group(1, c.per_node).price(alone, codec)
            return Priced(call, p.seconds, p.algorithm, p.codec, p.intra_bytes * c.nodes, 0.0)
        if call.group == "ends":  # the first and the last rank: two nodes where there are
            ends = self._group(2, 1) if c.nodes > 1 else self._group(1, 2)
            p = ends.price(alone, codec)
            return Priced(call, p.seconds, p.algorithm, p.codec, p.intra_bytes, p.inter_bytes)
        if call.group != "replicate":
            raise AdviseError(f"no process group {call.group!r}")
        across = self._group(c.nodes, 1)
        one = across.price(alone, codec)  # the group's codec choice, by its own call's size
        together = across.price(Call(call.op, call.count * c.per_node, call.phase, hook=True),
                                one.codec if one.codec not in ("", "none") else "none")
        return Priced(call, together.seconds, one.algorithm, one.codec,
                      one.intra_bytes * c.per_node, one.inter_bytes * c.per_node)

    def _predict(self, op: str, count: int, codec: str, crossing: int = 1
                 ) -> tuple[str, str, float, float]:
        from nanoccl import _C

        key = (op, count, codec, crossing)
        if key not in self._cache:
            try:
                self._cache[key] = _C.predict_collective(
                    op, count, "float32", self.cluster.nodes, self.cluster.per_node,
                    self.profile, codec, crossing, self.settings)
            except ValueError as exc:
                raise AdviseError(str(exc)) from None
        return self._cache[key]

    def price(self, call: Call, codec: str) -> Priced:
        c = self.cluster
        if call.group != "world":
            return self._price_in_mesh(call, codec)
        nbytes = 4.0 * call.count
        if call.op == "send":
            inter = call.src // c.per_node != call.dst // c.per_node
            op = "send_inter" if inter else "send_intra"
            _, _, seconds, _ = self._predict(op, call.count, "")
            return Priced(call, seconds, "direct", "none", 0 if inter else nbytes,
                          nbytes if inter else 0)
        if call.op == "allgather" and call.quantized and c.nodes > 1:
            # all_gather_compressed: each owner's encoded part gathered, inside nodes too; the
            # encoded size from the codec's ratio on this count (codec time not counted).
            ratio = self._predict("reduce_scatter", call.count, call.quantized)[3]
            count = max(1, math.ceil(call.count * ratio))
            algorithm, _, seconds, _ = self._predict("allgather", count, "")
            intra, inter = link_bytes("allgather", algorithm, 4.0 * count, c.nodes, c.per_node)
            return Priced(call, seconds, algorithm, call.quantized, intra, inter)
        use = codec if codec != "none" and (call.hook or nbytes >= COMPRESSION_MIN_BYTES) else ""
        if call.op not in ("allreduce", "reduce_scatter"):
            use = ""
        algorithm, chosen, seconds, ratio = self._predict(call.op, call.count, use)
        intra, inter = link_bytes(call.op, algorithm, nbytes, c.nodes, c.per_node, ratio,
                                  call.root)
        return Priced(call, seconds, algorithm, chosen, intra, inter)


# ------------------------------------------------------------------------ a configuration
@dataclass
class Config:
    """One configuration the advisor predicts, and what it predicts of it."""

    strategy: str
    codec: str = "none"
    bucket_mb: float | None = None  # dp, zero1: DDP's bucket_cap_mb (None: DDP's default)
    gather_codec: str = "none"  # zero2, zero3: parameters all-gathered by this codec (+qwz)
    microbatches: int = 0  # pp
    schedule: str = "1f1b"  # pp
    sync_every: int = 0  # diloco: H inner steps between a fragment's outer steps
    fragments: int = 1  # diloco: F (streaming where > 1)
    overlap_steps: int = 0  # diloco: tau, the inner steps a fragment's exchange overlaps
    step_s: float = math.inf
    comm_s: float = 0.0  # every call's predicted time, summed
    inter_bytes: float = 0.0  # sent over all ranks, a step
    intra_bytes: float = 0.0
    memory_bytes: float = 0.0  # the busiest device
    framework_s: float = 0.0  # the strategy's own framework time a step, in step_s
    optimizer_s: float = 0.0  # the rank's optimizer step (its share of AdamW), in step_s
    scaling: float = 0.0
    fits: bool = True
    refused: str | None = None  # why it cannot run (trainers' rules, memory)
    calls: list[Priced] = field(default_factory=list)

    @property
    def note(self) -> str:
        """What the table says beside a row that runs."""
        if self.strategy == "diloco":
            return "step time only: its loss at equal tokens is not DP's (results/study/long)"
        return ""

    @property
    def label(self) -> str:
        name = {"dp": "DP", "zero1": "ZeRO-1", "zero2": "ZeRO-2 (FSDP2)",
                "zero3": "ZeRO-3 (FSDP2)", "zero3-hpz": "ZeRO-3 hpZ (FSDP2)",
                "hsdp": "HSDP (FSDP2)", "tp": "TP",
                "pp": "PP", "diloco": "DiLoCo"}[self.strategy]
        if self.strategy in ("dp", "zero1"):
            name += f" bucket {self.bucket_mb:g} MB" if self.bucket_mb else " (DDP buckets)"
        if self.strategy == "pp":
            name += f" {self.schedule} m={self.microbatches}"
        if self.strategy == "diloco":
            name += f" H={self.sync_every}"
            if self.fragments > 1 or self.overlap_steps:
                name += f" streaming F={self.fragments} tau={self.overlap_steps}"
        return (name + ("" if self.codec == "none" else f" +{self.codec}")
                + ("" if self.gather_codec == "none" else f" +qwz ({self.gather_codec} "
                   "parameters)"))


def memory_bytes(spec: ModelSpec, cluster: Cluster, cfg: Config) -> float:
    """Bytes the busiest device holds: fp32 parameters, gradients and AdamW's two moments
    (16 bytes a parameter) as the strategy shards them, plus the activations backward keeps
    (advise_models.py; the framework's own workspace is not included)."""
    n, P = cluster.world, spec.params
    act = spec.act_bytes_per_sample * spec.stack.activation_bytes / 4
    unit = 4.0 * max(spec.units)
    local = spec.batch / n
    if cfg.strategy == "dp":
        return BYTES_PER_PARAM * P + act * local
    if cfg.strategy == "diloco":  # DP's, the global snapshot and the outer momentum, and the
        # residual of the rank's slice under a quantizing codec
        residual = 4.0 * P / cluster.per_node if cfg.codec in ("int8", "int4") else 0.0
        return (BYTES_PER_PARAM + 8.0) * P + residual + act * local
    if cfg.strategy == "zero1":
        return 8.0 * P + 8.0 * P / n + act * local
    if cfg.strategy == "zero2":  # whole parameters, a unit's gradients before its shard
        return 4.0 * P + 12.0 * P / n + unit + act * local
    if cfg.strategy == "hsdp":  # zero2's, sharded over a node's ranks only
        return 4.0 * P + 12.0 * P / cluster.per_node + unit + act * local
    if cfg.strategy == "zero3":  # shards, plus a gathered unit and the prefetched one
        return BYTES_PER_PARAM * P / n + 2 * 2 * unit + act * local
    if cfg.strategy == "zero3-hpz":  # and every unit's node shard from forward to backward
        return BYTES_PER_PARAM * P / n + 4.0 * P / cluster.per_node + 2 * 2 * unit + act * local
    if cfg.strategy == "tp":  # the blocks' 12 d^2 split, the rest replicated; about half the
        split = 12.0 * spec.hidden ** 2 * spec.layers  # activations live in the split layers
        return BYTES_PER_PARAM * (P - split + split / n) + act * spec.batch * (0.5 + 0.5 / n)
    assert spec.stage_params is not None
    stage = max(spec.stage_params(n))
    in_flight = cfg.microbatches if cfg.schedule == "gpipe" else min(cfg.microbatches, n)
    return BYTES_PER_PARAM * stage + act * spec.batch / cfg.microbatches / n * in_flight


def tp_compute_share(spec: ModelSpec, n: int) -> float:
    """The part of one device's compute a TP rank does: the blocks' matmuls (12 d^2 a layer)
    split n ways, the output head's (vocab x d, tied to the embedding) on every rank; the
    matmuls' parameters stand for their work."""
    split = 12.0 * spec.hidden ** 2 * spec.layers
    head = float(spec.vocab * spec.hidden)
    return (split / n + head) / (split + head) if split + head > 0 else 1.0 / n


def optimizer_share(spec: ModelSpec, cluster: Cluster, strategy: str) -> float:
    """The part of one device's optimizer step (AdamW over every parameter) a rank runs: DP
    keeps every parameter's moments on every rank (all of it); ZeRO-1/2/3 and hpZ shard them
    over the world, HSDP over a node's ranks; TP over its split blocks (tp_compute_share);
    the pipeline's busiest stage its own parameters."""
    n = cluster.world
    if strategy in ("dp", "diloco"):
        return 1.0
    if strategy == "hsdp":
        return 1.0 / cluster.per_node
    if strategy == "tp":
        return tp_compute_share(spec, n)
    if strategy == "pp":
        assert spec.stage_params is not None
        return max(spec.stage_params(n)) / spec.params
    return 1.0 / n


def diloco_step(inner_s: float, exchanges: Sequence[float], sync_every: int,
                overlap_steps: int) -> float:
    """A DiLoCo step: the inner step, plus each fragment's outer exchange (`exchanges`, one a
    fragment: each local rank's slice across nodes, then the node's allgather) once every H
    steps. Without overlap (tau 0) an exchange stops the ranks; with it, it runs under the
    next tau inner steps and only what they do not cover is exposed. Either way the link
    carries every fragment's exchange once every H steps: where they take longer than H
    inner steps, the link sets the pace."""
    exposed = sum(max(0.0, e - overlap_steps * inner_s) for e in exchanges)
    return max(inner_s + exposed / sync_every, sum(exchanges) / sync_every)


def evaluate(spec: ModelSpec, cluster: Cluster, predictor: Predictor, cfg: Config,
             one_device_s: float, device_bytes: float,
             framework_s: Mapping[str, float] | None = None,
             optimizer_s: float = 0.0, fixed_s: float = 0.0, run_steps: int = 0) -> Config:
    """Fills in cfg's predictions: `one_device_s` is one device's step on the whole global
    batch (compute only), `device_bytes` a device's memory, `framework_s` the strategies'
    framework time a step (framework_seconds()), `optimizer_s` the part of `one_device_s`
    that is the optimizer's step: it does not shrink with a rank's batch, only with the
    parameters the strategy leaves the rank (optimizer_share()); `fixed_s` the part of a
    forward and backward pass that does not shrink with the batch (each operator's dispatch
    and launch, work that does not grow with the samples): every rank runs it whole, a
    pipeline stage its layers' share once a microbatch. The rest is split as the batch is;
    with both 0 the whole step is. `run_steps` (0: not known): the run's length, which DiLoCo's
    H must fit at least twice."""
    n = cluster.world
    cfg.refused = strategy_refusal(spec, cluster, cfg.strategy, cfg.microbatches)
    if not cfg.refused and cfg.strategy == "diloco" and run_steps and run_steps < 2 * cfg.sync_every:
        cfg.refused = (f"H={cfg.sync_every} leaves a run of {run_steps} steps "
                       f"{run_steps // cfg.sync_every} outer step(s): the nodes would train apart")
    if not cfg.refused and cfg.strategy == "diloco" and cfg.fragments > len(spec.grads):
        cfg.refused = f"{cfg.fragments} fragments of {len(spec.grads)} parameter tensors"
    if cfg.refused:
        return cfg
    cfg.memory_bytes = memory_bytes(spec, cluster, cfg)
    cfg.fits = cfg.memory_bytes <= device_bytes
    if not cfg.fits:
        cfg.refused = (f"does not fit: needs {cfg.memory_bytes / 2**30:.1f} GiB a device, "
                       f"has {device_bytes / 2**30:.1f}")

    def price(call: Call) -> Priced:
        return predictor.price(call, cfg.codec)

    optimizer_s = min(max(0.0, optimizer_s), one_device_s)
    fixed_s = min(max(0.0, fixed_s), one_device_s - optimizer_s)
    batch_s = one_device_s - optimizer_s - fixed_s  # what shrinks with the batch
    compute = batch_s / n + fixed_s
    fwd, bwd = compute * FORWARD_SHARE, compute * (1 - FORWARD_SHARE)
    cfg.optimizer_s = optimizer_s * optimizer_share(spec, cluster, cfg.strategy)
    if cfg.strategy in ("dp", "zero1"):
        buckets = ddp_buckets(spec, cfg.bucket_mb)
        priced = [price(c) for c, _ in buckets]
        total = sum(nbytes for nbytes, _ in spec.grads)
        end = ddp_step_seconds(hidden_seconds(priced), [r for _, r in buckets], total, bwd)
        cfg.step_s = fwd + max(bwd, end) + cfg.optimizer_s + exposed_seconds(priced)
        if cfg.strategy == "zero1":
            priced += [price(c) for c in zero1_broadcasts(spec, n)]
            cfg.step_s += sum(p.seconds for p in priced[len(buckets):])
    elif cfg.strategy in ("zero2", "zero3", "zero3-hpz"):
        gather = "" if cfg.gather_codec == "none" else cfg.gather_codec
        forward, again, reduce = fsdp_calls(spec, 2 if cfg.strategy == "zero2" else 3, gather,
                                            hpz=cfg.strategy == "zero3-hpz")
        groups = [[price(c) for c in calls] for calls in (forward, again, reduce)]
        shares = [u / spec.params for u in spec.units]
        cfg.step_s = fsdp_step(fwd, bwd, shares, *[hidden_seconds(g) for g in groups])
        priced = [p for g in groups for p in g]
        cfg.step_s += cfg.optimizer_s + exposed_seconds(priced)
    elif cfg.strategy == "hsdp":  # a unit's reduce-scatter, then its shard across nodes
        forward, reduce, cross = hsdp_calls(spec, cluster.per_node)
        gathers, scatters, allreduces = [[price(c) for c in calls]
                                         for calls in (forward, reduce, cross)]
        shares = [u / spec.params for u in spec.units]
        cfg.step_s = fsdp_step(fwd, bwd, shares, hidden_seconds(gathers), [],
                               [a + b for a, b in zip(hidden_seconds(scatters),
                                                      hidden_seconds(allreduces))])
        priced = gathers + scatters + allreduces
        cfg.step_s += cfg.optimizer_s + exposed_seconds(priced)
    elif cfg.strategy == "diloco":
        inner, cross, gather = diloco_calls(spec, cluster.per_node, cfg.fragments)
        ddp = [predictor.price(c, "none") for c, _ in inner]  # inside the node: lossless
        total = sum(nbytes for nbytes, _ in spec.grads)
        end = ddp_step_seconds(hidden_seconds(ddp), [r for _, r in inner], total, bwd)
        inner_s = fwd + max(bwd, end) + cfg.optimizer_s + exposed_seconds(ddp)
        outer = [price(c) for c in cross] + [predictor.price(c, "none") for c in gather]
        per_fragment = [p.seconds for p in outer[:len(cross)]]
        for i, p in enumerate(outer[len(cross):]):
            per_fragment[i] += p.seconds
        cfg.step_s = diloco_step(inner_s, per_fragment, cfg.sync_every, cfg.overlap_steps)
        # A step's share: the inner calls every step, a fragment's exchange every H / F steps.
        priced = ddp + [dataclasses.replace(p, seconds=p.seconds / cfg.sync_every,
                                            intra_bytes=p.intra_bytes / cfg.sync_every,
                                            inter_bytes=p.inter_bytes / cfg.sync_every)
                        for p in outer]
    elif cfg.strategy == "tp":
        priced = [price(c) for c in tp_calls(spec)]
        cfg.step_s = (batch_s * tp_compute_share(spec, n) + fixed_s + cfg.optimizer_s
                      + sum(p.seconds for p in priced))
    else:
        m = cfg.microbatches
        count = spec.activation_count(spec.batch // m * spec.seq * spec.hidden)
        boundary = [price(Call("send", count, "forward", src=s, dst=s + 1)) for s in range(n - 1)]
        cfg.step_s = pipeline_step(n, m, cfg.schedule, batch_s / (m * n) + fixed_s / n,
                                   [p.seconds for p in boundary]) + cfg.optimizer_s
        priced = [p for p in boundary for _ in range(2 * m)]  # F and B, every microbatch
        tied = pp_tied_embedding_call(spec)
        if tied is not None:  # after the flush, before the optimizer step: exposed
            priced.append(price(tied))
            cfg.step_s += priced[-1].seconds
    cfg.framework_s = framework_seconds("dp" if cfg.strategy == "diloco" else cfg.strategy,
                                        framework_s)
    cfg.step_s += cfg.framework_s
    cfg.calls = priced
    cfg.comm_s = sum(p.seconds for p in priced)
    cfg.inter_bytes = sum(p.inter_bytes for p in priced)
    cfg.intra_bytes = sum(p.intra_bytes for p in priced)
    cfg.scaling = one_device_s / (n * cfg.step_s) if cfg.step_s > 0 else 0.0
    if not math.isfinite(cfg.step_s):
        cfg.refused = cfg.refused or "the link profile lacks a link class this cluster uses"
    return cfg


def best_bucket_mb(spec: ModelSpec, cluster: Cluster, predictor: Predictor, codec: str,
                   one_device_s: float) -> float:
    """The DDP bucket_cap_mb (of nanoccl.tune's candidates) predicted fastest: the same
    choice as nanoccl.tune.ddp_bucket_cap_mb, without a live group."""
    def step(cap: float) -> float:
        return evaluate(spec, cluster, predictor, Config("dp", codec, bucket_mb=cap),
                        one_device_s, math.inf).step_s
    return min(BUCKET_CANDIDATES_MB, key=lambda c: (step(c), c))


def candidates(spec: ModelSpec, cluster: Cluster, predictor: Predictor,
               one_device_s: float, codecs: Sequence[str] = CODECS) -> list[Config]:
    """Every configuration worth predicting: each strategy with each codec that touches its
    calls (none where there is one node, or for the pipeline's sends; a tied embedding's
    allreduce takes them); DP and ZeRO-1 with DDP's default buckets and with the recommended
    size; PP with GPipe and 1F1B over p, 2p, 4p, ... microbatches. TP and PP once only where
    the trainers do not run them."""
    n = cluster.world
    usable = [c for c in codecs if c == "none" or cluster.nodes > 1]
    out: list[Config] = []
    for codec in usable:
        tuned = best_bucket_mb(spec, cluster, predictor, codec, one_device_s)
        for strategy in ("dp", "zero1"):
            out.append(Config(strategy, codec))
            out.append(Config(strategy, codec, bucket_mb=tuned))
        out += [Config(s, codec) for s in ("zero2", "zero3", "zero3-hpz", "hsdp")]
        if codec != "none":  # +qwz: FSDP2's parameters all-gathered as int8 as well
            out += [Config(s, codec, gather_codec="int8")
                    for s in ("zero2", "zero3", "zero3-hpz")]
        if spec.gpt or codec == "none":
            out.append(Config("tp", codec))
        if cluster.nodes > 1:  # the study's DiLoCo rows: H 10 and 50, streaming and not
            out += [Config("diloco", codec, sync_every=h, fragments=f, overlap_steps=tau)
                    for h, f, tau in DILOCO_SETTINGS]
    # The pipeline's sends go as they are; a tied embedding's gradient allreduce (between the
    # first and the last stage) takes the group's codec.
    pp_codecs = usable if pp_tied_embedding_call(spec) is not None else ["none"]
    m = n
    while m <= (max(n, spec.batch) if spec.gpt else n):
        out += [Config("pp", codec, microbatches=m, schedule=s)
                for codec in pp_codecs for s in ("1f1b", "gpipe")]
        m *= 2
    return out


def advise(spec: ModelSpec, cluster: Cluster, profile: str, one_device_s: float,
           device_bytes: float, settings: dict[str, str] | None = None,
           codecs: Sequence[str] = CODECS,
           framework_s: Mapping[str, float] | None = None,
           optimizer_s: float = 0.0, fixed_s: float = 0.0,
           run_steps: int = 0) -> list[Config]:
    """Every candidate predicted; those that can run ranked fastest first (ties by label, so
    the order is the same at every call), the others after them. `optimizer_s`, `fixed_s`:
    the parts of `one_device_s` that are the optimizer's step and that do not shrink with
    the batch (evaluate())."""
    if cluster.world < 2:
        raise AdviseError(f"cluster {cluster}: one device, nothing to parallelize")
    if not (one_device_s > 0 and math.isfinite(one_device_s)):
        raise AdviseError(f"one device's step time {one_device_s!r}: must be a time > 0")
    if not (0 <= optimizer_s and 0 <= fixed_s and optimizer_s + fixed_s <= one_device_s):
        raise AdviseError(f"optimizer time {optimizer_s!r} s and fixed time {fixed_s!r} s: "
                          f"each >= 0, together at most one device's step "
                          f"({one_device_s:g} s), of which they are parts")
    for c in codecs:
        if c not in CODECS:
            raise AdviseError(f"codec {c!r}: choose from {', '.join(CODECS)}")
    predictor = Predictor(cluster, profile, settings)
    for name, v in (framework_s or {}).items():
        if not framework_time_ok(name, v):
            raise AdviseError(f"framework time {name}={v!r}: a strategy of "
                              f"{', '.join(FRAMEWORK_PROBED)} and seconds >= 0")
    if run_steps < 0:
        raise AdviseError(f"run of {run_steps} steps: must be >= 0 (0: not known)")
    done = [evaluate(spec, cluster, predictor, c, one_device_s, device_bytes, framework_s,
                     optimizer_s, fixed_s, run_steps)
            for c in candidates(spec, cluster, predictor, one_device_s, codecs)]
    unique: dict[str, Config] = {}
    for c in done:
        unique.setdefault(c.label, c)
    ranked = sorted((c for c in unique.values() if not c.refused),
                    key=lambda c: (round(c.step_s, 12), c.label))
    return ranked + sorted((c for c in unique.values() if c.refused), key=lambda c: c.label)


# ---------------------------------------------------------------------------------- output
def stock_dp(ranked: Sequence[Config]) -> Config | None:
    """DP as the trainers run it by default: DDP's bucket size, no codec."""
    return next((c for c in ranked if c.strategy == "dp" and c.codec == "none"
                 and c.bucket_mb is None and not c.refused), None)


def table(ranked: Sequence[Config], spec: ModelSpec, cluster: Cluster,
          stock: Config | None = None) -> str:
    """The ranking as a Markdown table; `x stock DP` compares with `stock` (stock_dp())."""
    head = ("| # | configuration | step s | S | x stock DP | comm s | inter MB/step | "
            "intra MB/step | GiB/device | note |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [f"{spec.name}, global batch {spec.batch}"
             + (f" x {spec.seq} tokens" if spec.gpt else "")
             + f", {spec.params / 1e6:.1f} M parameters, cluster {cluster} "
             f"({cluster.world} devices)"
             + ("" if spec.stack == REFERENCE_STACK else f"; {spec.stack.name}"),
             OVERLAP_TEXT, "", head]
    for i, c in enumerate(ranked, 1):
        if c.refused and not c.memory_bytes:
            lines.append(f"| - | {c.label} | - | - | - | - | - | - | - | {c.refused} |")
            continue
        speed = f"{stock.step_s / c.step_s:.2f}" if stock else "-"
        lines.append(
            f"| {'-' if c.refused else i} | {c.label} | {c.step_s:.3f} | {c.scaling:.3f} | "
            f"{speed} | {c.comm_s:.3f} | {c.inter_bytes / 1e6:.1f} | {c.intra_bytes / 1e6:.1f} | "
            f"{c.memory_bytes / 2**30:.2f} | {c.refused or c.note} |")
    return "\n".join(lines)


def plot(ranked: Sequence[Config], path: Path, title: str) -> str | None:
    """A bar chart of the scaling factors (runnable configurations); None, or why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # matplotlib is optional
        return f"no PNG: matplotlib is not importable ({exc})"
    rows = [c for c in ranked if not c.refused][:20]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.5))
    ax.barh([c.label for c in rows][::-1], [c.scaling for c in rows][::-1], color="tab:blue")
    ax.set_xlabel("predicted scaling factor S = T_1 / (n x step)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# ------------------------------------------------------------------------------------ CLI
def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="nanoccl-advise",
        description="Predict and rank DP, ZeRO-1/2/3, HSDP, PP, TP and DiLoCo (with nanoccl's "
                    "codecs) for a model on a cluster, from a link profile and one device's "
                    "step time.")
    m = p.add_argument_group("model (a reference trainer's, or a GPT by hand)")
    m.add_argument("--model", help="a name of trainers/models.py (gpt2-small, resnet18, ...)")
    m.add_argument("--params", type=int, help="by hand: parameters in all")
    m.add_argument("--layers", type=int, help="by hand: transformer blocks")
    m.add_argument("--hidden", type=int, help="by hand: hidden size")
    m.add_argument("--heads", type=int, help="by hand: attention heads (default hidden/64)")
    m.add_argument("--seq", type=int, help="tokens a sequence (default: the model's context)")
    m.add_argument("--batch", type=int, required=True, help="global batch (sequences, images)")
    m.add_argument("--activations", choices=("float32", "bfloat16", "float16"),
                   default="float32", help="the activations' type, on the wire (TP's "
                   "allreduces, PP's sends) and in memory: bfloat16/float16 under autocast or "
                   "a half-precision model (default float32, as the reference trainers)")
    m.add_argument("--tied-embedding", action="store_true",
                   help="GPT: the pipeline keeps the embedding tied to the output head, as "
                   "Megatron and ColossalAI do, and allreduces its gradient between the first "
                   "and the last stage every step (the reference trainers untie it)")
    c = p.add_argument_group("cluster and links")
    c.add_argument("--cluster", required=True, help="nodes x devices per node, e.g. 2x2")
    c.add_argument("--profile", help="a link profile saved by nanoccl-tune")
    c.add_argument("--inter-gbps", type=float, help="by hand: inter-node Gbit/s, one way")
    c.add_argument("--inter-latency-us", type=float, default=50.0)
    c.add_argument("--intra-gbps", type=float, default=100.0,
                   help="by hand: intra-node Gbit/s (default 100: PCIe-class)")
    c.add_argument("--intra-latency-us", type=float, default=10.0)
    c.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                   help="a nanoccl setting the group would run with (algo=ring, chunk_bytes=...)")
    t = p.add_argument_group("compute and memory")
    t.add_argument("--step-seconds", type=float,
                   help="one device's training step on the whole global batch")
    t.add_argument("--optimizer-seconds", type=float, default=0.0,
                   help="of --step-seconds, the optimizer's step over every parameter: a rank "
                   "runs its share of it as the strategy shards the parameters, not as it "
                   "splits the batch (default 0: the whole step split as the batch)")
    t.add_argument("--fixed-seconds", type=float, default=0.0,
                   help="of --step-seconds, the part of forward and backward that does not "
                   "shrink with the batch (operators' dispatch and launch): every rank runs it "
                   "whole (default 0)")
    t.add_argument("--probe", action="store_true",
                   help="measure --step-seconds, --optimizer-seconds and --fixed-seconds "
                   "here: a few steps of the model on this machine, at the global batch and "
                   "at a rank's")
    t.add_argument("--framework-seconds", metavar="NAME=S,...",
                   help="each strategy's own framework time a step on a rank (DDP, FSDP2's "
                   "hooks, DTensor's dispatch), e.g. zero2=0.012,tp=0.02; names: "
                   + ", ".join(FRAMEWORK_PROBED) + " (default: none counted)")
    t.add_argument("--probe-framework", action="store_true",
                   help="measure --framework-seconds here: the reference trainer on one rank "
                   "with each strategy, less its plain step (a reference model only)")
    t.add_argument("--steps", type=int, default=0,
                   help="the run's length in steps: DiLoCo rows whose H it fits less than "
                   "twice are refused with that reason (default 0: not known)")
    t.add_argument("--device-memory-gb", type=float, default=48.0,
                   help="memory of one device, GiB (default 48: an A40)")
    o = p.add_argument_group("output")
    o.add_argument("--codecs", default=",".join(CODECS), help="codecs to consider")
    o.add_argument("--top", type=int, default=0, help="show only the N best (0: all)")
    o.add_argument("--png", help="write a bar chart of the scaling factors here")
    k = p.add_argument_group("check (bench/advise_check.py: the emulated cluster, root; "
                             "from the repository)")
    k.add_argument("--check", type=int, default=0, metavar="N",
                   help="train the N best configurations and stock DP on the emulated cluster "
                        "of this machine and print predicted against measured")
    k.add_argument("--check-model", help="the model the check trains (default --model; a "
                   "smaller stand-in where the advised one is too slow here, e.g. gpt2-tiny)")
    k.add_argument("--check-batch", type=int, help="its global batch (default --batch)")
    k.add_argument("--check-dilation", default="auto",
                   help="auto (the emulated link keeps the advised gradients-to-step ratio), "
                        "none (--inter-gbps as is) or a factor D (--inter-gbps / D)")
    k.add_argument("--check-steps", type=int, default=6, help="steps a run (default 6)")
    k.add_argument("--check-warmup", type=int, default=2,
                   help="of them, left out of the timing (default 2)")
    k.add_argument("--check-out", help="where the check writes check.md, check.json and the "
                   "runs' logs (default: a new temporary folder)")
    return p


def spec_from_args(args: argparse.Namespace) -> ModelSpec:
    by_hand = args.layers is not None or args.hidden is not None or args.params is not None
    if args.model and by_hand:
        raise AdviseError("give --model or the sizes by hand (--params --layers --hidden), "
                          "not both")
    if args.model:
        spec = model_spec(args.model, args.batch, args.seq)
    elif args.layers is None or args.hidden is None:
        raise AdviseError("no model: give --model NAME, or --params --layers --hidden --seq")
    else:
        spec = gpt_by_hand(args.params, args.layers, args.hidden, args.seq or 1024, args.batch,
                           args.heads)
    if args.activations != "float32":
        spec.stack = dataclasses.replace(spec.stack, name=f"{args.activations} activations",
                                         activation_bytes=2)
    if args.tied_embedding:
        if not spec.gpt:
            raise AdviseError("--tied-embedding is for GPT models (a pipeline's tied "
                              "embedding and output head)")
        name = "tied embedding" if spec.stack is REFERENCE_STACK else (
            f"{spec.stack.name}, tied embedding")
        spec.stack = dataclasses.replace(spec.stack, name=name, pp_tied_embedding=True)
    return spec


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        spec = spec_from_args(args)
        cluster = parse_cluster(args.cluster)
        if args.check:
            if args.check < 0 or args.check_steps <= args.check_warmup or args.check_warmup < 0:
                raise AdviseError("--check N needs N >= 1 and --check-steps > --check-warmup "
                                  ">= 0")
            if args.inter_gbps is None:
                raise AdviseError("--check emulates the inter-node link --inter-gbps gives: "
                                  "give it (a --profile cannot be emulated)")
            if args.activations != "float32" or args.tied_embedding:
                raise AdviseError("--check trains the reference trainers, in float32, their "
                                  "pipeline's embedding untied: leave --activations and "
                                  "--tied-embedding out")
            if not args.model and not args.check_model:
                raise AdviseError("--check trains a reference model: give --check-model for a "
                                  "model given by hand")
        if args.profile and args.inter_gbps is not None:
            raise AdviseError("give --profile or --inter-gbps, not both")
        if args.profile:
            profile = profile_from_file(args.profile)
        elif args.inter_gbps is not None:
            profile = profile_by_hand(args.inter_gbps, args.inter_latency_us, args.intra_gbps,
                                      args.intra_latency_us)
        else:
            raise AdviseError("no links: give --profile FILE (nanoccl-tune) or --inter-gbps")
        settings = dict(s.split("=", 1) for s in args.setting if "=" in s)
        if len(settings) != len(args.setting):
            raise AdviseError(f"--setting takes NAME=VALUE, got {args.setting}")
        if args.step_seconds is None and not args.probe:
            raise AdviseError("give --step-seconds (one device, whole global batch) or --probe")
        if args.probe and (args.step_seconds is not None or args.optimizer_seconds
                           or args.fixed_seconds):
            raise AdviseError("--probe measures --step-seconds, --optimizer-seconds and "
                              "--fixed-seconds: give them or --probe, not both")
        if args.framework_seconds and args.probe_framework:
            raise AdviseError("give --framework-seconds or --probe-framework, not both")
        if args.probe_framework and not args.model:
            raise AdviseError("--probe-framework runs a reference model: give --model")
        probe = (probe_step_seconds(spec, small_batch=spec.batch // cluster.world)
                 if args.probe else None)
        step, optimizer, fixed = ((probe.step_s, probe.optimizer_s, probe.fixed_s) if probe
                                  else (args.step_seconds, args.optimizer_seconds,
                                        args.fixed_seconds))
        framework = (probe_framework_seconds(spec) if args.probe_framework else
                     parse_framework_seconds(args.framework_seconds)
                     if args.framework_seconds else {})
        codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
        ranked = advise(spec, cluster, profile, step, args.device_memory_gb * 2**30, settings,
                        codecs, framework, optimizer, fixed, args.steps)
    except AdviseError as exc:
        print(f"nanoccl-advise: {exc}", file=sys.stderr)
        return 2
    shown = ranked[: args.top] if args.top > 0 else ranked
    print(f"one device's step: {step:.4f} s" + (f", of which the optimizer {optimizer:.4f} s"
                                                 if optimizer else "")
          + (f", fixed (not shrinking with the batch) {fixed:.4f} s" if fixed else "")
          + (" (probed here)" if args.probe else ""))
    if framework:
        print("framework time a step, a rank" + (" (probed here)" if args.probe_framework
                                                  else "") + ": "
              + ", ".join(f"{k} {v:.4f} s" for k, v in framework.items()))
    print(table(shown, spec, cluster, stock_dp(ranked)))
    runnable = [c for c in ranked if not c.refused]
    if not runnable:
        print("\nnothing fits: every configuration needs more memory than a device has, or "
              "cannot run here (see the notes)")
    else:
        # DiLoCo trains with another optimizer (its loss at equal tokens differs): the
        # recommendation is among the configurations that train as DP does, DiLoCo beside it.
        same = [c for c in runnable if c.strategy != "diloco"]
        best = same[0] if same else runnable[0]
        print(f"\nrecommended: {best.label} (S {best.scaling:.3f}, {best.step_s:.3f} s a step)")
        outer = next((c for c in runnable if c.strategy == "diloco"), None)
        if outer is not None and same:
            print(f"low-communication: {outer.label} (S {outer.scaling:.3f}, {outer.step_s:.3f} "
                  "s a step; another optimizer: time to a loss is in results/study/long)")
        tuned = next((c for c in runnable if c.strategy == "dp" and c.bucket_mb), None)
        if tuned:
            print(f"DDP bucket_cap_mb predicted fastest: {tuned.bucket_mb:g} (for {tuned.label}; "
                  "DDP's default is 25, its first bucket 1)")
    if args.png:
        why = plot(ranked, Path(args.png), f"{spec.name} b{spec.batch} on {cluster}")
        print(why or f"wrote {args.png}")
    if args.check:
        print(flush=True)
        return run_check_program({
            "cluster": str(cluster), "top": args.check,
            "model": args.check_model or spec.name, "batch": args.check_batch or spec.batch,
            "inter_gbps": args.inter_gbps, "advised_step_s": step,
            "advised_params": spec.params, "dilation": args.check_dilation,
            "steps": args.check_steps, "warmup": args.check_warmup,
            "out_dir": args.check_out, "codecs": list(codecs) if codecs else None,
            "advised": [{k: v for k, v in dataclasses.asdict(c).items() if k != "calls"}
                        for c in ranked]})
    return 0


def run_check_program(request: dict[str, Any]) -> int:
    """--check: bench/advise_check.py of the repository runs the advice on the emulated
    cluster, as a program (the package imports nothing from bench/); its output is relayed."""
    import json
    import subprocess
    import tempfile

    try:
        repo = repository()
    except AdviseError as exc:
        print(f"nanoccl-advise: --check: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="nanoccl-check-") as folder:
        path = Path(folder) / "request.json"
        path.write_text(json.dumps(request))
        with subprocess.Popen([sys.executable, str(repo / "bench" / "advise_check.py"),
                               str(path)], stdout=subprocess.PIPE, text=True,
                              cwd=repo) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                print(line, end="", flush=True)
        return 0 if proc.returncode == 0 else 2


if __name__ == "__main__":
    sys.exit(main())
