"""nanoccl-advise (torch_ext/nanoccl/advise.py): its traffic model of each strategy against the
bytes nanoccl counts per op while the reference trainers run it (2 ranks on loopback, as two
emulated nodes or one node), its input validation, and its ranking."""

from __future__ import annotations

import dataclasses
import math
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from study_helpers import Launch, launch, node_env  # noqa: E402

advise = pytest.importorskip("nanoccl.advise")
_C = pytest.importorskip("nanoccl._C")
if not hasattr(_C, "predict_collective"):
    pytest.skip("nanoccl._C predates predict_collective: rebuild the extension",
                allow_module_level=True)

MODEL, BATCH, SEQ = "gpt2-nano", 4, 32
# Two warm-up steps, as the study takes: DDP rebuilds its buckets (and broadcasts their
# layout) in the second step, a one-off outside the steady state the model describes.
COMMON = ["--model", MODEL, "--batch", str(BATCH), "--steps", "4", "--warmup-steps", "2",
          "--print-every", "0"]
# A fixed profile: the traffic does not depend on it, and no rates are measured in a test.
RATES = ("reduce_MBps 5000\n"
         "codec int8 encode_MBps 2000 decode_MBps 3000 accumulate_MBps 2500\n"
         "codec int4 encode_MBps 1500 decode_MBps 2500 accumulate_MBps 2000\n"
         "codec bf16 encode_MBps 4000 decode_MBps 4000 accumulate_MBps 4000\n")
PROFILE = advise.profile_by_hand(1.0, 50.0, 100.0, 10.0, cpu_rates=RATES)
# Links that cost (almost) nothing: a step is the compute.
FAST = advise.profile_by_hand(1e6, 1e-3, 1e6, 1e-3, cpu_rates="reduce_MBps 1000000000\n")
# name: (strategy, backend, extra trainer flags, two nodes?)
CASES = {
    "dp": ("dp", "nanoccl", [], True),
    "dp-int8": ("dp", "nanoccl+int8", [], True),
    "dp-one-node": ("dp", "nanoccl", [], False),
    "zero1": ("zero1", "nanoccl", [], True),
    "zero2": ("zero2", "nanoccl", [], True),
    "zero2-int8": ("zero2", "nanoccl+int8", [], True),  # compress_fsdp: every reduce-scatter
    "zero3-int8-qwz": ("zero3", "nanoccl+int8+qwz", [], True),  # and int8 parameters
    "zero3": ("zero3", "nanoccl", [], True),
    "tp": ("tp", "nanoccl", [], True),
    "pp": ("pp", "nanoccl", ["--microbatches", "2", "--schedule", "1f1b"], True),
}
_runs: dict[str, Launch] = {}


def predicted(case: str) -> advise.Config:
    strategy, backend, _, two_nodes = CASES[case]
    cluster = advise.Cluster(2, 1) if two_nodes else advise.Cluster(1, 2)
    spec = advise.model_spec(MODEL, BATCH, SEQ)
    codec, _, qwz = (backend.partition("+")[2] or "none").partition("+")
    cfg = advise.Config(strategy, codec, microbatches=2, gather_codec="int8" if qwz else "none")
    return advise.evaluate(spec, cluster, advise.Predictor(cluster, PROFILE), cfg, 1.0, math.inf)


def per_op(cfg: advise.Config) -> dict[str, float]:
    """Bytes a step sends per op, under nanoccl.stats()' op names."""
    out: dict[str, float] = defaultdict(float)
    for p in cfg.calls:
        out["send/recv" if p.call.op == "send" else p.call.op] += p.intra_bytes + p.inter_bytes
    return dict(out)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(CASES))
def test_traffic_model_matches_the_bytes_nanoccl_counts(case: str, tmp_path: Path) -> None:
    strategy, backend, extra, two_nodes = CASES[case]
    nodes = {r: {"NANOCCL_NODE_ID": f"node{r if two_nodes else 0}"} for r in range(2)}
    res = launch(2, COMMON + ["--strategy", strategy, "--backend", backend, *extra], tmp_path,
                 timeout_s=50, rank_env=nodes)
    if not res.ok and strategy in ("tp", "pp") and res.refused_on_cpu():
        pytest.skip(f"torch refuses {strategy} on CPU: {res.refused_on_cpu()}")
    assert res.ok, res.output[-3000:]
    assert res.result is not None
    moved = res.result["nanoccl_bytes"]
    steps = res.result["timed_steps"]
    cfg = predicted(case)
    assert not cfg.refused, cfg.refused
    # Link classes: all across the two emulated nodes, or all within the one node.
    assert moved["inter_sent"] / steps == pytest.approx(cfg.inter_bytes, rel=0.02)
    assert moved["intra_sent"] / steps == pytest.approx(cfg.intra_bytes, rel=0.02, abs=64)
    assert (cfg.inter_bytes > 0) == two_nodes
    # Per op: every op the trainer used, and only those, with the modelled bytes.
    measured = {k[len("sent_"):]: v / steps for k, v in moved.items()
                if k.startswith("sent_") and v > 0}
    model = per_op(cfg)
    assert set(measured) == set(model), (measured, model)
    for op, nbytes in model.items():
        assert measured[op] == pytest.approx(nbytes, rel=0.02), op
    if "int8" in backend:  # the codec's quarter of the float32 bytes on the wire
        lossless = predicted(case.split("-int8")[0])
        squeezed = per_op(cfg)["allreduce" if strategy == "dp" else "reduce_scatter"]
        assert squeezed < 0.3 * per_op(lossless)["allreduce" if strategy == "dp"
                                                 else "reduce_scatter"]
    if backend.endswith("+qwz"):  # and the parameters' all-gathers, inside the node too
        assert per_op(cfg)["allgather"] < 0.3 * per_op(predicted(strategy))["allgather"]


def on_2x2(strategy: str, backend: str, tmp_path: Path, ops: set[str]) -> advise.Config:
    """Runs `strategy` through the trainer on 2 emulated nodes x 2 ranks and checks the
    advisor's bytes a step (per link class and per op: exactly `ops`) against nanoccl's
    counts; returns the advisor's prediction."""
    res = launch(4, COMMON + ["--strategy", strategy, "--backend", backend], tmp_path,
                 timeout_s=80, rank_env=node_env(2, 2))
    assert res.ok, res.output[-3000:]
    assert res.result is not None
    moved, steps = res.result["nanoccl_bytes"], res.result["timed_steps"]
    cluster = advise.Cluster(2, 2)
    codec, _, qwz = (backend.partition("+")[2] or "none").partition("+")
    cfg = advise.evaluate(advise.model_spec(MODEL, BATCH, SEQ), cluster,
                          advise.Predictor(cluster, PROFILE),
                          advise.Config(strategy, codec, gather_codec="int8" if qwz else "none"),
                          1.0, math.inf)
    assert not cfg.refused, cfg.refused
    assert moved["inter_sent"] / steps == pytest.approx(cfg.inter_bytes, rel=0.02)
    assert moved["intra_sent"] / steps == pytest.approx(cfg.intra_bytes, rel=0.02)
    measured = {k[len("sent_"):]: v / steps for k, v in moved.items()
                if k.startswith("sent_") and v > 0}
    model = per_op(cfg)
    assert set(measured) == set(model) == ops
    for op, nbytes in model.items():
        assert measured[op] == pytest.approx(nbytes, rel=0.02), op
    return cfg


@pytest.mark.timeout(90)
def test_hsdp_traffic_on_2x2_matches_the_bytes_nanoccl_counts(tmp_path: Path) -> None:
    """HSDP's mesh groups: allgathers and reduce-scatters within each node, each rank's
    shard allreduced across the nodes, as the advisor prices them."""
    on_2x2("hsdp", "nanoccl", tmp_path, {"allgather", "reduce_scatter", "allreduce"})


@pytest.mark.timeout(90)
@pytest.mark.parametrize("backend", ["nanoccl", "nanoccl+int8+qwz"])
def test_zero3_hpz_traffic_on_2x2_matches_the_bytes_nanoccl_counts(backend: str,
                                                                  tmp_path: Path) -> None:
    """ZeRO-3 hpZ: forward's allgathers across the nodes (int8 with +qwz), the backward's
    within each node (lossless: decoded parameters), reduce-scatters across, as priced."""
    cfg = on_2x2("zero3-hpz", backend, tmp_path, {"allgather", "reduce_scatter"})
    # Fewer bytes across nodes than ZeRO-3's, whose backward gathers across them again.
    cluster = advise.Cluster(2, 2)
    zero3 = advise.evaluate(advise.model_spec(MODEL, BATCH, SEQ), cluster,
                            advise.Predictor(cluster, PROFILE),
                            advise.Config("zero3", cfg.codec, gather_codec=cfg.gather_codec),
                            1.0, math.inf)
    assert cfg.inter_bytes < 0.8 * zero3.inter_bytes


def test_hsdp_is_refused_where_it_would_be_another_strategy() -> None:
    spec = advise.model_spec(MODEL, BATCH, SEQ)
    for shape in ("1x2", "2x1"):
        cluster = advise.parse_cluster(shape)
        for strategy in ("hsdp", "zero3-hpz"):
            cfg = advise.evaluate(spec, cluster, advise.Predictor(cluster, PROFILE),
                                  advise.Config(strategy), 1.0, math.inf)
            assert cfg.refused and "several nodes of several ranks" in cfg.refused, strategy


# ------------------------------------------------------------------------ input validation
def test_unknown_model_and_bad_sizes_are_named() -> None:
    with pytest.raises(advise.AdviseError, match="unknown model 'gpt5'"):
        advise.model_spec("gpt5", 8)
    with pytest.raises(advise.AdviseError, match="do not hold 12 layers"):
        advise.gpt_by_hand(1_000_000, 12, 768, 1024, 8)
    with pytest.raises(advise.AdviseError, match="does not split into 5 heads"):
        advise.gpt_by_hand(None, 2, 64, 32, 8, heads=5, vocab=256)
    with pytest.raises(advise.AdviseError, match="batch 0"):
        advise.model_spec(MODEL, 0)
    # By hand, the sizes of gpt2-small give gpt2-small's parameters back.
    small = advise.model_spec("gpt2-small", 8)
    hand = advise.gpt_by_hand(small.params, 12, 768, 1024, 8)
    assert hand.params == small.params and hand.vocab == 50257


@pytest.mark.parametrize("text", ["2x", "0x2", "2x0", "axb", "2x2x2", ""])
def test_bad_cluster_shapes_are_refused(text: str) -> None:
    with pytest.raises(advise.AdviseError, match="cluster"):
        advise.parse_cluster(text)


def test_one_device_is_nothing_to_advise() -> None:
    with pytest.raises(advise.AdviseError, match="cluster 1x1: one device"):
        advise.advise(advise.model_spec(MODEL, BATCH, SEQ), advise.parse_cluster("1x1"),
                      PROFILE, 1.0, math.inf)


def test_profile_files_are_checked(tmp_path: Path) -> None:
    bad = tmp_path / "profile.txt"
    bad.write_text("version 1\nshape 2x2\ninter alpha_us fast\n")
    with pytest.raises(advise.AdviseError, match="profile.txt:3"):
        advise.profile_from_file(str(bad))
    with pytest.raises(advise.AdviseError, match="no file at"):
        advise.profile_from_file(str(tmp_path / "missing.txt"))
    with pytest.raises(advise.AdviseError, match="bandwidth"):
        advise.profile_by_hand(0.0, 50, 100, 10, cpu_rates=RATES)
    # A profile without inter-node links cannot price a cluster of two nodes.
    one_node = PROFILE.replace(PROFILE.splitlines()[5], "inter none")
    ranked = advise.advise(advise.model_spec(MODEL, BATCH, SEQ), advise.Cluster(2, 1),
                           one_node, 1.0, math.inf, codecs=["none"])
    assert ranked and all(c.refused for c in ranked)


def test_a_model_that_does_not_fit_is_reported_not_ranked(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    spec = advise.model_spec("gpt2-medium", 4)
    cluster = advise.parse_cluster("2x2")
    # 355 M parameters: 5.7 GB of model state for DP, a quarter of it under ZeRO-3, plus
    # 1.5 GB of activations for the one sequence a device holds.
    limit = 5 * 2**30
    ranked = advise.advise(spec, cluster, PROFILE, 0.5, limit, codecs=["none"])
    runnable = [c for c in ranked if not c.refused]
    assert {c.strategy for c in runnable} >= {"zero1", "zero3", "pp"}
    assert all(c.memory_bytes <= limit for c in runnable)
    for strategy in ("dp", "tp"):
        refused = next(c for c in ranked if c.strategy == strategy)
        assert refused.refused and "does not fit" in refused.refused, strategy
        assert ranked.index(refused) > ranked.index(runnable[-1])
    # Nothing fits: the CLI says so and ranks nothing.
    code = advise.main(["--model", "gpt2-small", "--batch", "16", "--cluster", "2x2",
                        "--inter-gbps", "1", "--step-seconds", "0.5",
                        "--device-memory-gb", "0.1", "--codecs", "none"])
    out = capsys.readouterr().out
    assert code == 0
    assert "nothing fits" in out and "does not fit" in out and "recommended:" not in out


def test_cli_errors_are_messages(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model", MODEL, "--batch", "4", "--cluster", "2x1", "--inter-gbps", "1"]
    assert advise.main(base) == 2
    assert "--step-seconds" in capsys.readouterr().err
    assert advise.main(base + ["--step-seconds", "-1"]) == 2
    assert "must be a time > 0" in capsys.readouterr().err
    assert advise.main(base + ["--step-seconds", "1", "--codecs", "int3"]) == 2
    assert "codec 'int3'" in capsys.readouterr().err
    assert advise.main(base + ["--step-seconds", "1", "--setting", "algo=nope"]) == 2
    assert "nope" in capsys.readouterr().err


# ------------------------------------------------------------- a rank's compute and framework
def test_framework_time_is_on_each_strategys_critical_path() -> None:
    spec = advise.model_spec(MODEL, BATCH, SEQ)
    given = {"dp": 0.01, "zero1": 0.02, "zero2": 0.03, "zero3": 0.04, "hsdp": 0.05, "tp": 0.06}
    for strategy, extra in [("dp", 0.01), ("zero1", 0.02), ("zero2", 0.03), ("zero3", 0.04),
                            ("zero3-hpz", 0.04), ("hsdp", 0.05), ("tp", 0.06), ("pp", 0.0)]:
        cluster = advise.Cluster(2, 1 if strategy in ("tp", "pp") else 2)
        predictor = advise.Predictor(cluster, PROFILE)

        def step(framework: dict[str, float] | None) -> advise.Config:
            cfg = advise.Config(strategy, microbatches=2)
            return advise.evaluate(spec, cluster, predictor, cfg, 1.0, math.inf, framework)
        plain, timed = step(None), step(given)
        assert not timed.refused, (strategy, timed.refused)
        assert timed.framework_s == pytest.approx(extra), strategy
        assert timed.step_s == pytest.approx(plain.step_s + extra), strategy
        assert timed.scaling == pytest.approx(1.0 / (cluster.world * timed.step_s)), strategy
    cluster = advise.Cluster(2, 2)
    predictor = advise.Predictor(cluster, PROFILE)
    # A negative probe difference is noise: nothing added.
    cfg = advise.evaluate(spec, cluster, predictor, advise.Config("zero2"), 1.0, math.inf,
                          {"zero2": -0.01})
    assert cfg.framework_s == 0.0
    with pytest.raises(advise.AdviseError, match="framework time pp"):
        advise.advise(spec, cluster, PROFILE, 1.0, math.inf, framework_s={"pp": 0.1})


class _Exposed(advise.Predictor):
    """Every call the rank's own cores' work (as GlooStandIn's on one node)."""

    def price(self, call: advise.Call, codec: str) -> advise.Priced:
        return dataclasses.replace(super().price(call, codec), exposed=True)


def test_an_exposed_call_adds_to_the_step_instead_of_hiding_under_compute() -> None:
    spec = advise.model_spec(MODEL, BATCH, SEQ)
    for strategy in ("dp", "zero1", "zero2", "zero3", "hsdp", "tp"):
        cluster = advise.Cluster(2, 1 if strategy == "tp" else 2)
        bucket = 0.05 if strategy in ("dp", "zero1") else None  # buckets ready in backward
        cfgs = [advise.evaluate(spec, cluster, predictor(cluster, PROFILE),
                                advise.Config(strategy, bucket_mb=bucket), 1.0, math.inf)
                for predictor in (advise.Predictor, _Exposed)]
        hidden, exposed = cfgs
        assert exposed.comm_s == pytest.approx(hidden.comm_s) and hidden.comm_s > 0, strategy
        if strategy == "tp":  # its calls are on the critical path either way
            assert exposed.step_s == pytest.approx(hidden.step_s)
            continue
        # The compute (a quarter of 1 s a rank), then every call after it.
        assert exposed.step_s == pytest.approx(0.25 + exposed.comm_s), strategy
        assert exposed.step_s > hidden.step_s, strategy


def test_the_gloo_stand_in_prices_one_node_as_gloo_over_loopback() -> None:
    import advise_study  # bench/ is on sys.path through study_helpers

    fit = {"allreduce": {"alpha_us": 400.0, "MBps": 1000.0}}
    one_node = advise_study.GlooStandIn(advise.Cluster(1, 2), PROFILE, fit)
    p = one_node.price(advise.Call("allreduce", 1 << 20, "backward"), "none")
    assert p.exposed and p.seconds == pytest.approx(400e-6 + 4 * (1 << 20) / 1e9)
    # Gloo has no reduce-scatter: torch runs an allreduce of the same buffer.
    rs = one_node.price(advise.Call("reduce_scatter", 1 << 20, "backward"), "none")
    assert rs.seconds == pytest.approx(p.seconds) and rs.call.op == "allreduce"
    # No fit for the op, or across nodes: nanoccl's flat ring stands in, overlapped.
    assert not one_node.price(advise.Call("broadcast", 1 << 20, "step"), "none").exposed
    two_nodes = advise_study.GlooStandIn(advise.Cluster(2, 1), PROFILE, fit)
    assert not two_nodes.price(advise.Call("allreduce", 1 << 20, "backward"), "none").exposed
    assert advise_study.gloo_loopback(Path("/nonexistent/gloo_probe.json")) is None


def test_the_study_check_counts_setups_meeting_the_criterion(tmp_path: Path) -> None:
    """A setup meets it with every row within 25%, or with its rank order right."""
    import advise_study

    def row(setup: str, backend: str, measured: float, predicted: float) -> dict[str, object]:
        return {"model": "gpt2-tiny", "batch": 16, "setup": setup, "strategy": "dp",
                "backend": backend, "measured_step_s": 1.0, "predicted_step_s": 1.0,
                "measured_S": measured, "predicted_S": predicted,
                "rel_error": predicted / measured - 1, "measured_inter_mb": math.nan,
                "measured_link_mb": math.nan, "predicted_inter_mb": 0.0,
                "measured_sent_mb": math.nan, "predicted_sent_mb": 0.0}

    rows = [row("2x1", "a", 0.1, 0.2), row("2x1", "b", 0.2, 0.3), row("2x1", "c", 0.3, 0.4),
            row("2x2", "a", 0.1, 0.3), row("2x2", "b", 0.2, 0.1), row("2x2", "c", 0.3, 0.2),
            row("1x2", "a", 0.5, 0.55), row("1x2", "b", 0.6, 0.5), row("1x2", "c", 0.7, 0.6)]
    summary = advise_study.write_readme(tmp_path, rows, "cmd")
    assert (summary["met"], summary["groups"]) == (2, 3)
    text = (tmp_path / "README.md").read_text()
    assert "Spearman >= 0.8: 2 of 3 (not: gpt2-tiny b16 2x2)." in text


def test_a_tp_rank_computes_its_share_of_the_blocks_and_the_whole_head() -> None:
    small = advise.model_spec("gpt2-small", 16)
    blocks, head = 12 * 768**2 * 12, 50257 * 768
    for n in (2, 4):
        assert advise.tp_compute_share(small, n) == pytest.approx(
            (blocks / n + head) / (blocks + head))
    # With links that cost (almost) nothing, a TP rank's step is that share of the device's step.
    cluster = advise.Cluster(1, 4)
    cfg = advise.evaluate(small, cluster, advise.Predictor(cluster, FAST), advise.Config("tp"),
                          1.0, math.inf)
    assert cfg.step_s == pytest.approx(advise.tp_compute_share(small, 4), rel=1e-3)
    assert 0.25 < cfg.step_s < 0.5


def test_a_rank_runs_the_optimizer_as_its_strategy_shards_the_parameters() -> None:
    # With FAST links a step is compute. Of one device's 1 s, 0.2 s is the optimizer: DP
    # repeats it on every rank, ZeRO-1/2/3 and hpZ split it over the world, HSDP over a node,
    # a TP rank runs its share of the blocks' and the whole head's.
    spec = advise.model_spec("gpt2-tiny", 8, SEQ)  # 4 heads, 4 layers: TP and PP over 4
    cluster = advise.Cluster(2, 2)
    predictor = advise.Predictor(cluster, FAST)
    shares = {"dp": 1.0, "zero1": 0.25, "zero2": 0.25, "zero3": 0.25, "zero3-hpz": 0.25,
              "hsdp": 0.5, "tp": advise.tp_compute_share(spec, 4)}
    for strategy, share in shares.items():
        def step(optimizer: float) -> advise.Config:
            return advise.evaluate(spec, cluster, predictor, advise.Config(strategy), 1.0,
                                   math.inf, None, optimizer)
        plain, split = step(0.0), step(0.2)
        assert not split.refused, (strategy, split.refused)
        assert split.optimizer_s == pytest.approx(0.2 * share), strategy
        batch_share = advise.tp_compute_share(spec, 4) if strategy == "tp" else 0.25
        assert split.step_s - plain.step_s == pytest.approx(0.2 * (share - batch_share),
                                                            abs=1e-6), strategy
    # The pipeline's busiest stage runs its own parameters' optimizer, after the flush.
    pp = advise.evaluate(spec, cluster, predictor, advise.Config("pp", microbatches=4), 1.0,
                         math.inf, None, 0.2)
    assert pp.optimizer_s == pytest.approx(0.2 * max(spec.stage_params(4)) / spec.params)


def test_the_fixed_part_of_a_step_is_run_whole_by_every_rank() -> None:
    # Of one device's 1 s, 0.3 s does not shrink with the batch: a DP rank of 4 runs
    # 0.3 + 0.7 / 4; a pipeline stage runs a quarter of it once a microbatch, so more
    # microbatches cost more.
    spec = advise.model_spec("gpt2-tiny", 8, SEQ)
    cluster = advise.Cluster(4, 1)
    predictor = advise.Predictor(cluster, FAST)

    def step(cfg: advise.Config, fixed: float) -> float:
        return advise.evaluate(spec, cluster, predictor, cfg, 1.0, math.inf, None, 0.0,
                               fixed).step_s
    assert step(advise.Config("dp"), 0.3) == pytest.approx(0.3 + 0.7 / 4, rel=1e-3)
    assert step(advise.Config("tp"), 0.3) == pytest.approx(
        0.3 + 0.7 * advise.tp_compute_share(spec, 4), rel=1e-3)
    for m in (4, 8):
        slot = 0.7 / (m * 4) + 0.3 / 4
        assert step(advise.Config("pp", microbatches=m), 0.3) == pytest.approx(
            (m + 4 - 1) * slot, rel=1e-3)
    assert (step(advise.Config("pp", microbatches=8), 0.3)
            > step(advise.Config("pp", microbatches=4), 0.3))
    for bad in [(-0.1, 0.0), (0.0, -0.1), (0.6, 0.5), (math.nan, 0.0)]:
        with pytest.raises(advise.AdviseError, match="optimizer time .* fixed time"):
            advise.advise(spec, cluster, FAST, 1.0, math.inf, optimizer_s=bad[0],
                          fixed_s=bad[1])


def test_the_step_probe_measures_the_optimizer_and_the_fixed_part() -> None:
    probe = advise.probe_step_seconds(advise.model_spec(MODEL, 8, SEQ), 2, small_batch=2)
    assert probe.step_s > 0
    assert 0 < probe.optimizer_s < probe.step_s
    assert 0 <= probe.fixed_s <= probe.step_s - probe.optimizer_s
    only = advise.probe_step_seconds(advise.model_spec(MODEL, 8, SEQ), 2)
    assert only.fixed_s == 0.0 and 0 < only.optimizer_s < only.step_s


def test_optimizer_and_fixed_seconds_on_the_command_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model", MODEL, "--batch", "4", "--cluster", "2x1", "--inter-gbps", "1",
            "--codecs", "none", "--top", "3"]
    assert advise.main(base + ["--step-seconds", "1", "--optimizer-seconds", "0.25",
                               "--fixed-seconds", "0.125"]) == 0
    assert ("one device's step: 1.0000 s, of which the optimizer 0.2500 s, fixed (not "
            "shrinking with the batch) 0.1250 s") in capsys.readouterr().out
    assert advise.main(base + ["--step-seconds", "1", "--optimizer-seconds", "2"]) == 2
    assert "optimizer time 2.0 s" in capsys.readouterr().err
    assert advise.main(base + ["--probe", "--fixed-seconds", "0.1"]) == 2
    assert "not both" in capsys.readouterr().err


def test_framework_seconds_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model", MODEL, "--batch", "4", "--cluster", "2x1", "--inter-gbps", "1",
            "--step-seconds", "1", "--codecs", "none", "--top", "3"]
    assert advise.main(base + ["--framework-seconds", "zero2=0.25,tp=0.5"]) == 0
    out = capsys.readouterr().out
    assert "framework time a step, a rank: zero2 0.2500 s, tp 0.5000 s" in out
    for bad in ("zero2", "zero2=-1", "pp=0.1", "zero2=fast", "zero2=nan"):
        assert advise.main(base + ["--framework-seconds", bad]) == 2, bad
        assert "--framework-seconds" in capsys.readouterr().err, bad
    assert advise.main(base + ["--framework-seconds", "dp=0", "--probe-framework"]) == 2
    assert "not both" in capsys.readouterr().err
    hand = ["--params", "1000000", "--layers", "2", "--hidden", "128", "--seq", "32",
            "--batch", "4", "--cluster", "2x1", "--inter-gbps", "1", "--step-seconds", "1"]
    assert advise.main(hand + ["--probe-framework"]) == 2
    assert "--probe-framework runs a reference model" in capsys.readouterr().err


@pytest.mark.timeout(240)
def test_the_probe_times_each_strategy_on_one_rank() -> None:
    spec = advise.model_spec(MODEL, BATCH, SEQ)
    steps = advise.probe_one_rank_steps(spec, ("dp", "tp"), steps=3, warmup=1)
    assert set(steps) == {"single", "dp", "tp"}  # tp ran on one rank (--probe-one-rank)
    assert all(0 < v < 30 for v in steps.values()), steps
    with pytest.raises(advise.AdviseError, match="cannot probe pp"):
        advise.probe_one_rank_steps(spec, ("pp",))
    with pytest.raises(advise.AdviseError, match="steps > warmup"):
        advise.probe_one_rank_steps(spec, ("dp",), steps=2, warmup=2)


@pytest.mark.timeout(120)
def test_tp_on_one_rank_needs_the_probe_flag(tmp_path: Path) -> None:
    args = ["--model", MODEL, "--strategy", "tp", "--backend", "nanoccl", "--batch", "2",
            "--seq-len", str(SEQ), "--steps", "2", "--warmup-steps", "1", "--print-every", "0"]
    refused = launch(1, args, tmp_path / "refused")
    assert not refused.ok and "tensor parallelism needs at least 2 ranks" in refused.output
    probed = launch(1, args + ["--probe-one-rank"], tmp_path / "probed")
    assert probed.ok, probed.output[-2000:]
    assert probed.result is not None and probed.result["world_size"] == 1


# ---------------------------------------------------------------------------------- ranking
def test_ranking_is_by_predicted_step_and_the_same_every_time() -> None:
    spec = advise.model_spec("gpt2-small", 16)
    cluster = advise.parse_cluster("2x2")
    first = advise.advise(spec, cluster, PROFILE, 0.556, 48 * 2**30)
    again = advise.advise(spec, cluster, PROFILE, 0.556, 48 * 2**30)
    assert [c.label for c in first] == [c.label for c in again]
    runnable = [c for c in first if not c.refused]
    steps = [c.step_s for c in runnable]
    assert steps == sorted(steps)
    assert {c.strategy for c in runnable} >= {"dp", "zero1", "zero2", "zero3", "tp", "pp"}
    for c in runnable:  # S = T_1 / (n x step), every byte counted on some link
        assert c.scaling == pytest.approx(0.556 / (4 * c.step_s))
        assert c.inter_bytes > 0
    # At 1 Gbit/s the codecs shrink DP's inter-node bytes and time.
    dp = {c.codec: c for c in runnable if c.strategy == "dp" and c.bucket_mb is None}
    assert dp["int8"].inter_bytes < 0.3 * dp["none"].inter_bytes
    assert dp["int8"].step_s < dp["none"].step_s


def test_pipeline_without_communication_is_m_plus_p_minus_1_slots() -> None:
    for schedule in ("gpipe", "1f1b"):
        assert advise.pipeline_step(2, 4, schedule, 1.0, [0.0]) == pytest.approx(5.0)
        assert advise.pipeline_step(4, 8, schedule, 1.0, [0.0] * 3) == pytest.approx(11.0)
    # A slow link: the boundary carries every microbatch one way, and the grads back.
    slow = advise.pipeline_step(2, 4, "1f1b", 0.1, [1.0])
    assert slow >= 4 * 1.0


def test_tree_broadcast_edges_follow_the_binomial_tree() -> None:
    assert sorted(advise.tree_edges(4, 0)) == [(0, 1), (0, 2), (2, 3)]
    assert sorted(advise.tree_edges(4, 1)) == [(1, 2), (1, 3), (3, 0)]
    # 2 nodes x 2: root 0 crosses once, root 1 three times.
    assert advise.link_bytes("broadcast", "tree", 10.0, 2, 2, root=0) == (20.0, 10.0)
    assert advise.link_bytes("broadcast", "tree", 10.0, 2, 2, root=1) == (0.0, 30.0)


def test_the_cli_ranks_recommends_and_draws(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "advice.png"
    code = advise.main(["--model", "gpt2-small", "--batch", "16", "--cluster", "2x2",
                        "--inter-gbps", "1", "--step-seconds", "0.556", "--top", "5",
                        "--png", str(png)])
    out = capsys.readouterr().out
    assert code == 0
    assert "recommended:" in out and "overlap:" in out
    assert out.count("\n| ") == 5 + 1  # the header and the five best
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no PNG: matplotlib is not importable" in out
    else:
        assert png.stat().st_size > 1000 and f"wrote {png}" in out


# ------------------------------------------------------------------------------------ check
def _can_make_namespaces() -> bool:
    import os
    import shutil

    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def test_check_maps_each_configuration_to_the_trainers_flags() -> None:
    import advise_check as check  # bench/advise_check.py (bench/ is on sys.path)
    C = advise.Config
    assert check.trainer_args(C("dp", "none")) == ("nanoccl", [])
    assert check.trainer_args(C("dp", "int4", bucket_mb=5.0)) == (
        "nanoccl+int4", ["--bucket-cap-mb", "5"])
    assert check.trainer_args(C("zero1", "int8", bucket_mb=0.5)) == (
        "nanoccl+int8", ["--bucket-cap-mb", "0.5"])
    assert check.trainer_args(C("zero3", "int8")) == ("nanoccl+int8", [])
    assert check.trainer_args(C("zero2", "int4", gather_codec="int8")) == ("nanoccl+int4+qwz", [])
    assert check.config_key(C("zero2", "int4", gather_codec="int8")) != check.config_key(
        C("zero2", "int4"))
    assert check.trainer_args(C("zero3-hpz", "int4", gather_codec="int4")) == (
        "nanoccl+int4+qwz4", [])
    with pytest.raises(ValueError):
        check.trainer_args(C("zero2", "int4", gather_codec="bf16"))  # the trainers: int8, int4
    with pytest.raises(ValueError):
        check.trainer_args(C("zero2", "none", gather_codec="int8"))  # beside a gradient codec
    assert check.trainer_args(C("pp", microbatches=16, schedule="gpipe")) == (
        "nanoccl", ["--microbatches", "16", "--schedule", "gpipe"])
    # A tuned bucket is the same configuration for any model (its size is the model's).
    assert check.config_key(C("dp", "int4", bucket_mb=100.0)) == check.config_key(
        C("dp", "int4", bucket_mb=1.0))
    assert check.config_key(C("dp", "int4")) != check.config_key(C("dp", "int4", bucket_mb=1.0))


def test_check_picks_the_best_and_stock_dp_once() -> None:
    import advise_check as check  # bench/advise_check.py (bench/ is on sys.path)
    spec = advise.model_spec("gpt2-small", 16)
    ranked = advise.advise(spec, advise.parse_cluster("2x2"), PROFILE, 0.556, 48 * 2**30)
    runnable = [c for c in ranked if not c.refused and c.strategy != "diloco"]
    chosen = check.pick(ranked, 2)
    assert [c.label for c in chosen[:2]] == [c.label for c in runnable[:2]]
    assert chosen[-1].label == "DP (DDP buckets)" and len(chosen) == 3
    stock_rank = next(i for i, c in enumerate(runnable) if c.label == "DP (DDP buckets)")
    assert len(check.pick(ranked, stock_rank + 1)) == stock_rank + 1  # not twice


def test_check_dilation_keeps_the_advised_gradients_to_step_ratio() -> None:
    import advise_check as check  # bench/advise_check.py (bench/ is on sys.path)
    study = check.study_module()
    # Advised: 124.4 M parameters, 0.556 s a step, 1 Gbit/s (the study's A40 reference).
    dil = check.dilate(study, "gpt2-tiny", "auto", 1.0, 0.082, 867_000, 0.556, 124_400_000)
    advised_ratio = 0.556 / (124_400_000 * 32 / 1e9)
    here_ratio = 0.082 / (867_000 * 32 / dil.rate_bits)
    assert here_ratio == pytest.approx(advised_ratio, rel=1e-3)
    assert dil.factor == pytest.approx(1e9 / dil.rate_bits)
    assert check.dilate(study, "gpt2-tiny", "none", 1.0, 0.082, 867_000, 0.556, 1).rate_bits \
        == 10**9
    assert check.dilate(study, "gpt2-tiny", "4", 1.0, 0.082, 867_000, 0.556, 1).rate_bits \
        == 250_000_000
    with pytest.raises(advise.AdviseError, match="--check-dilation"):
        check.dilate(study, "gpt2-tiny", "-2", 1.0, 0.082, 867_000, 0.556, 1)


# ---------------------------------------------------------------------- stacks, precision
def test_half_precision_activations_halve_tp_and_pp_bytes_not_gradients(
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster = advise.Cluster(2, 1)
    fp32 = advise.model_spec(MODEL, BATCH, SEQ)
    half = advise.model_spec(MODEL, BATCH, SEQ)
    half.stack = advise.Stack(activation_bytes=2)

    def run(spec: advise.ModelSpec, strategy: str) -> advise.Config:
        return advise.evaluate(spec, cluster, advise.Predictor(cluster, PROFILE),
                               advise.Config(strategy, microbatches=2), 1.0, math.inf)

    for strategy in ("tp", "pp"):
        a, b = run(fp32, strategy), run(half, strategy)
        assert b.inter_bytes == pytest.approx(a.inter_bytes / 2)
        assert b.memory_bytes < a.memory_bytes
    assert run(half, "dp").inter_bytes == run(fp32, "dp").inter_bytes  # fp32 gradients
    # The study's stack: fused qkv, 4 allreduces a block instead of 6.
    study = advise.model_spec(MODEL, BATCH, SEQ)
    study.stack = advise.STUDY_STACK
    assert len(advise.tp_calls(study)) == 4 * study.layers
    assert run(study, "tp").inter_bytes == pytest.approx(run(fp32, "tp").inter_bytes / 3)
    # The CLI's --activations, named in the table; --check trains in float32 only.
    base = ["--model", "gpt2-small", "--batch", "16", "--cluster", "2x2", "--inter-gbps", "1",
            "--step-seconds", "0.556"]
    assert advise.main(base + ["--activations", "bfloat16"]) == 0
    assert "bfloat16 activations" in capsys.readouterr().out
    assert advise.main(base + ["--activations", "float16", "--check", "1"]) == 2
    assert "--activations" in capsys.readouterr().err
    assert advise.main(base + ["--activations", "float16", "--tied-embedding"]) == 0
    assert "float16 activations, tied embedding" in capsys.readouterr().out
    assert advise.main(base + ["--tied-embedding", "--check", "1"]) == 2
    assert "--tied-embedding" in capsys.readouterr().err
    assert advise.main(["--model", "resnet18", "--batch", "8", "--cluster", "2x1",
                        "--inter-gbps", "1", "--step-seconds", "1", "--tied-embedding"]) == 2
    assert "for GPT models" in capsys.readouterr().err


def _published_2x2(config: advise.Config, batch: int) -> dict[str, advise.Config]:
    """GPT-2 small on 2 nodes x 2 A40 at 1 GbE, a flat ring (NCCL), one A40 at the published
    29.4k tokens/s: `config` priced with the reference trainers' traffic and the study's."""
    cluster = advise.parse_cluster("2x2")
    got = {}
    for name, stack in (("reference", advise.REFERENCE_STACK), ("study", advise.STUDY_STACK)):
        spec = advise.model_spec("gpt2-small", batch)
        spec.stack = stack
        got[name] = advise.evaluate(spec, cluster,
                                    advise.Predictor(cluster, PROFILE, {"algo": "ring"}),
                                    dataclasses.replace(config), batch * 1024 / 29.4e3,
                                    48 * 2**30)
    return got


def test_the_study_stack_predicts_the_published_tp_row() -> None:
    """Batch 16 a GPU: the published TP throughput, 1.46k tokens/s against one A40's 29.4k,
    is S = 0.0124. The reference trainers' traffic (fp32, 6 allreduces a block) predicts a
    third of it; the study's stack, as its reported network volume shows, within 30%."""
    published = 1.46 / (4 * 29.4)
    got = _published_2x2(advise.Config("tp"), 64)
    assert got["reference"].scaling < 0.5 * published
    assert got["study"].scaling == pytest.approx(published, rel=0.3)


def test_a_tied_embedding_pipeline_allreduces_its_gradient_between_the_end_stages() -> None:
    """STUDY_STACK keeps GPT-2's embedding tied in its pipeline: one allreduce a step of the
    vocab x hidden gradient between the first and the last rank, across nodes where there are
    several (a 2-rank ring: each end sends the whole gradient once), exposed after the flush.
    The reference trainers untie it: no such call."""
    spec = advise.model_spec(MODEL, BATCH, SEQ)
    study = advise.model_spec(MODEL, BATCH, SEQ)
    study.stack = advise.STUDY_STACK
    tied_bytes = 4.0 * study.vocab * study.hidden
    assert advise.pp_tied_embedding_call(spec) is None
    for shape, inter in (("2x1", True), ("1x2", False)):
        cluster = advise.parse_cluster(shape)

        def run(model: advise.ModelSpec) -> advise.Config:
            return advise.evaluate(model, cluster, advise.Predictor(cluster, PROFILE),
                                   advise.Config("pp", microbatches=4), 1.0, math.inf)

        ref, tied = run(spec), run(study)
        last = tied.calls[-1]
        assert last.call.group == "ends" and last.call.op == "allreduce"
        assert (last.inter_bytes, last.intra_bytes) == (
            (2 * tied_bytes, 0.0) if inter else (0.0, 2 * tied_bytes))
        assert len(tied.calls) == len(ref.calls) + 1
        # The step: the pipeline (its boundaries' sends, each priced once and counted 2m
        # times), then the allreduce.
        n = cluster.world
        sends = [tied.calls[b * 2 * 4].seconds for b in range(n - 1)]
        assert tied.step_s == pytest.approx(
            advise.pipeline_step(n, 4, "1f1b", 1.0 / (4 * n), sends) + last.seconds)
    # Across nodes the codecs apply to that allreduce (the sends go as they are; gpt2-small's
    # embedding is over the group's 1 MiB compression minimum): PP is ranked with each; an
    # untied pipeline only once.
    cluster = advise.parse_cluster("2x1")
    spec = advise.model_spec("gpt2-small", BATCH, SEQ)
    study = dataclasses.replace(spec, stack=advise.STUDY_STACK)
    ranked = advise.advise(study, cluster, PROFILE, 1.0, math.inf)
    pp = {c.codec: c for c in ranked if c.strategy == "pp" and c.microbatches == 4
          and c.schedule == "1f1b"}
    assert set(pp) == set(advise.CODECS)
    assert pp["int4"].inter_bytes < pp["none"].inter_bytes
    assert pp["int4"].step_s < pp["none"].step_s
    assert {c.codec for c in advise.advise(spec, cluster, PROFILE, 1.0, math.inf)
            if c.strategy == "pp"} == {"none"}


def test_the_study_stack_predicts_the_published_pp_row() -> None:
    """1F1B with m = p = 4 on 16 x 1024 tokens a step (the batch the published network volume
    shows: 21.6 KB a token through a node's NIC, 21.9 priced). The published PP throughput,
    8.87k tokens/s against one A40's 29.4k, is S = 0.0754; the reference trainers' untied fp32
    pipeline is predicted over twice that, the study's stack within 30%."""
    published = 8.87 / (4 * 29.4)
    got = _published_2x2(advise.Config("pp", microbatches=4), 16)
    # A node's NIC carries half of what all ranks send across, both ways: all of it.
    assert got["study"].inter_bytes / (16 * 1024) == pytest.approx(21.6e3, rel=0.03)
    assert got["reference"].scaling > 2 * published
    assert got["study"].scaling == pytest.approx(published, rel=0.3)


def test_check_errors_are_messages(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model", MODEL, "--batch", "4", "--cluster", "2x1", "--step-seconds", "1"]
    assert advise.main(base + ["--profile", "/nonexistent", "--check", "1"]) == 2
    assert "--check emulates the inter-node link" in capsys.readouterr().err
    assert advise.main(base + ["--inter-gbps", "1", "--check", "1", "--check-steps", "2",
                               "--check-warmup", "2"]) == 2
    assert "--check-steps > --check-warmup" in capsys.readouterr().err
    assert advise.main(["--params", "1000000", "--layers", "2", "--hidden", "64", "--batch",
                        "4", "--cluster", "2x1", "--step-seconds", "1", "--inter-gbps", "1",
                        "--check", "1"]) == 2
    assert "--check-model" in capsys.readouterr().err


@pytest.mark.skipif(not _can_make_namespaces(), reason="needs root and iproute2 (network "
                    "namespaces for the emulated cluster)")
def test_check_runs_the_best_and_stock_dp_on_the_emulated_cluster(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    out = tmp_path / "check"
    code = advise.main(["--model", MODEL, "--batch", "8", "--cluster", "2x1", "--inter-gbps",
                        "1", "--step-seconds", "0.01", "--check", "1", "--check-dilation",
                        "none", "--check-steps", "3", "--check-warmup", "1", "--check-out",
                        str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    doc = json.loads((out / "check.json").read_text())
    labels = [r["label"] for r in doc["rows"]]
    best = text.split("recommended: ", 1)[1].split(" (S ", 1)[0]
    # A tuned DDP bucket is the check model's own size under the measured profile.
    import re

    def same(label: str) -> str:
        return re.sub(r"bucket [0-9.]+ MB", "bucket * MB", label)

    assert same(labels[0]) == same(best) and labels[-1] == "DP (DDP buckets)"
    assert doc["rate_bits"] == 10**9 and doc["t1_shared_s"] > 0
    for row in doc["rows"]:  # every one ran, predicted and measured
        assert row["error"] == "" and row["measured_step_s"] > 0 and row["predicted_step_s"] > 0
        assert row["measured_S"] == pytest.approx(
            doc["t1_shared_s"] / (2 * row["measured_step_s"]))
    assert (out / "link_profile.txt").is_file() and "step s measured" in text
    assert (out / "check.md").read_text().count("\n| ") == len(labels) + 1


# ---- DiLoCo ------------------------------------------------------------------------------------

def diloco(codec: str, h: int, f: int = 1, tau: int = 0, cluster: str = "2x2",
           run_steps: int = 0) -> advise.Config:
    spec = advise.model_spec("gpt2-small", 16)
    c = advise.parse_cluster(cluster)
    cfg = advise.Config("diloco", codec, sync_every=h, fragments=f, overlap_steps=tau)
    return advise.evaluate(spec, c, advise.Predictor(c, PROFILE), cfg, 0.556, math.inf,
                           run_steps=run_steps)


def test_diloco_rows_are_advised_across_nodes_only() -> None:
    spec = advise.model_spec("gpt2-small", 16)
    two = advise.advise(spec, advise.parse_cluster("2x2"), PROFILE, 0.556, 48 * 2**30)
    rows = [c for c in two if c.strategy == "diloco"]
    assert {(c.sync_every, c.fragments, c.overlap_steps) for c in rows} == set(
        advise.DILOCO_SETTINGS)
    assert all(not c.refused and c.note for c in rows)  # step time only: said beside each
    assert "DiLoCo H=10 streaming F=2 tau=1 +int4" in {c.label for c in rows}
    one = advise.advise(spec, advise.parse_cluster("1x4"), PROFILE, 0.556, 48 * 2**30)
    assert not [c for c in one if c.strategy == "diloco"]  # one node: it is DP
    assert "several nodes" in diloco("int4", 10, cluster="1x4").refused


def test_diloco_sends_a_fragments_encoded_bytes_once_every_h_steps() -> None:
    h10, h50 = diloco("int4", 10), diloco("int4", 50)
    assert h10.inter_bytes == pytest.approx(5 * h50.inter_bytes)
    dp = advise.evaluate(
        advise.model_spec("gpt2-small", 16), advise.parse_cluster("2x2"),
        advise.Predictor(advise.parse_cluster("2x2"), PROFILE), advise.Config("dp", "int4"),
        0.556, math.inf)
    # Every step DP's int4 buckets cross; DiLoCo's outer gradient, the same bytes, every H.
    assert h10.inter_bytes == pytest.approx(dp.inter_bytes / 10, rel=0.1)
    assert dp.step_s > h10.step_s > h50.step_s
    # Lossless: four to eight times the int4 bytes (plus the codec's block scales).
    assert 6 < diloco("none", 10).inter_bytes / h10.inter_bytes < 8.5
    # Fragments move the same bytes a cycle, in F pieces.
    assert diloco("int4", 50, f=5, tau=2).inter_bytes == pytest.approx(h50.inter_bytes, rel=0.02)


def test_diloco_step_exposes_what_the_overlap_does_not_cover() -> None:
    step = advise.diloco_step
    assert step(0.1, [2.0], 10, 0) == pytest.approx(0.1 + 0.2)  # blocking: exchange / H
    assert step(0.1, [0.05, 0.05], 10, 1) == pytest.approx(0.1)  # hidden under one step
    assert step(0.1, [0.3, 0.3], 10, 2) == pytest.approx(0.1 + 0.2 / 10)  # 0.1 of each shows
    assert step(0.1, [3.0, 3.0], 10, 9) == pytest.approx(0.6)  # the link sets the pace
    streaming = diloco("int4", 50, f=5, tau=2)
    assert streaming.step_s < diloco("int4", 50).step_s


def test_diloco_refuses_what_the_run_or_the_model_cannot_take() -> None:
    short = diloco("int4", 50, run_steps=80)
    assert "H=50" in short.refused and "80 steps" in short.refused
    assert not diloco("int4", 10, run_steps=80).refused
    assert "fragments" in diloco("int4", 10, f=10_000).refused
    spec = advise.model_spec("gpt2-small", 16)
    with pytest.raises(advise.AdviseError):
        advise.advise(spec, advise.parse_cluster("2x2"), PROFILE, 0.556, 48 * 2**30,
                      run_steps=-1)


def test_diloco_memory_holds_the_snapshot_and_the_outer_momentum() -> None:
    dp = advise.memory_bytes(advise.model_spec("gpt2-small", 16), advise.parse_cluster("2x2"),
                             advise.Config("dp"))
    params = advise.model_spec("gpt2-small", 16).params
    assert diloco("none", 10).memory_bytes == pytest.approx(dp + 8.0 * params)
    assert diloco("int4", 10).memory_bytes == pytest.approx(dp + 8.0 * params + 2.0 * params)


def test_check_maps_diloco_to_the_trainers_flags() -> None:
    import advise_check as check  # bench/advise_check.py (bench/ is on sys.path)
    C = advise.Config
    cfg = C("diloco", "int4", sync_every=10, fragments=2, overlap_steps=1)
    assert check.trainer_args(cfg) == (
        "nanoccl+int4", ["--sync-every", "10", "--fragments", "2", "--overlap-steps", "1"])
    assert check.config_key(cfg) != check.config_key(C("diloco", "int4", sync_every=50))
    # The check trains a few steps: not DiLoCo's, whose outer steps they would not reach.
    spec = advise.model_spec("gpt2-small", 16)
    ranked = advise.advise(spec, advise.parse_cluster("2x2"), PROFILE, 0.556, 48 * 2**30)
    assert ranked[0].strategy == "diloco"
    assert all(c.strategy != "diloco" for c in check.pick(ranked, 3))


def test_the_cli_recommends_among_dp_like_rows_and_names_diloco_beside(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert advise.main(["--model", "gpt2-small", "--batch", "16", "--cluster", "2x2",
                        "--inter-gbps", "1", "--step-seconds", "0.556", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "recommended: DiLoCo" not in out
    assert "low-communication: DiLoCo" in out and "results/study/long" in out
