"""The reference trainers: every strategy at world size 2 on loopback with Gloo, the
data-parallel strategies against one rank on the same global batches, and HSDP on two
emulated nodes of two ranks through Gloo and nanoccl."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from study_helpers import Launch, launch, node_env  # noqa: E402

from trainers import backends  # noqa: E402
from trainers.data import SyntheticImages, SyntheticTokens, make_source, shard  # noqa: E402
from trainers.models import (GPT_CONFIGS, build_model, count_params,  # noqa: E402
                             gpt_flops_per_token)
from trainers.strategies import split_layers  # noqa: E402

COMMON = ["--model", "gpt2-nano", "--batch", "8", "--steps", "3", "--warmup-steps", "1",
          "--backend", "gloo", "--print-every", "0"]
# Data-parallel strategies see the same global batch split in two: their loss must be the
# single rank's up to float reordering (Adam amplifies it a little after step 1).
LOSS_RTOL = 2e-4

_cache: dict[str, Launch] = {}


def _run(name: str, world: int, args: list[str], tmp_root: Path,
         rank_env: dict[int, dict[str, str]] | None = None) -> Launch:
    if name not in _cache:
        _cache[name] = launch(world, args, tmp_root / name, rank_env=rank_env)
    return _cache[name]


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("study_trainers")


@pytest.fixture(scope="module")
def single(tmp_root: Path) -> dict[str, Any]:
    res = _run("single", 1, COMMON + ["--strategy", "single"], tmp_root)
    assert res.ok, res.output[-3000:]
    assert res.result is not None
    return res.result


STRATEGY_CASES = {
    "dp": ["--strategy", "dp"],
    "dp-bucket": ["--strategy", "dp", "--bucket-cap-mb", "0.05"],
    "zero1": ["--strategy", "zero1"],
    "zero2": ["--strategy", "zero2"],
    "zero3": ["--strategy", "zero3"],
    "hsdp": ["--strategy", "hsdp"],  # one node: a 1 x 2 mesh, FSDP2 within it
    "tp": ["--strategy", "tp"],
    "pp-1f1b": ["--strategy", "pp", "--schedule", "1f1b", "--microbatches", "4"],
    "pp-gpipe": ["--strategy", "pp", "--schedule", "gpipe"],
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(STRATEGY_CASES))
def test_strategy_world2(case: str, tmp_root: Path) -> None:
    res = _run(case, 2, COMMON + STRATEGY_CASES[case], tmp_root)
    if not res.ok:
        refusal = res.refused_on_cpu()
        if refusal and case.split("-")[0] in ("tp", "pp"):
            pytest.skip(f"torch refuses {case} on CPU: {refusal}")
    assert res.ok, res.output[-3000:]
    doc = res.result
    assert doc is not None
    assert doc["kind"] == "nanoccl_train_result"
    assert doc["world_size"] == 2 and doc["timed_steps"] == 2
    assert doc["samples_per_s"] > 0 and doc["tokens_per_s"] == pytest.approx(
        doc["samples_per_s"] * 32)
    assert all(v is not None and math.isfinite(v) for v in doc["losses"])
    assert doc["peak_rss_mb_max"] > 0
    assert "step 3/3" not in res.output  # --print-every 0


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", ["dp", "dp-bucket", "zero1", "zero2", "zero3", "hsdp", "tp"])
def test_same_loss_as_one_rank(case: str, single: dict[str, Any], tmp_root: Path) -> None:
    """DP / ZeRO split the same global batch (TP computes it whole): same losses."""
    res = _run(case, 2, COMMON + STRATEGY_CASES[case], tmp_root)
    if not res.ok and case == "tp" and res.refused_on_cpu():
        pytest.skip(f"torch refuses tp on CPU: {res.refused_on_cpu()}")
    assert res.ok, res.output[-3000:]
    assert res.result is not None
    assert res.result["losses"] == pytest.approx(single["losses"], rel=LOSS_RTOL)


@pytest.mark.timeout(120)
def test_pipeline_first_loss_matches(single: dict[str, Any], tmp_root: Path) -> None:
    """PP starts from the same weights (its untied LM head a copy of the embedding)."""
    res = _run("pp-1f1b", 2, COMMON + STRATEGY_CASES["pp-1f1b"], tmp_root)
    if not res.ok and res.refused_on_cpu():
        pytest.skip(f"torch refuses pp on CPU: {res.refused_on_cpu()}")
    assert res.ok, res.output[-3000:]
    assert res.result is not None
    assert res.result["losses"][0] == pytest.approx(single["losses"][0], rel=1e-5)
    assert res.result["microbatches"] == 4


@pytest.mark.timeout(120)
def test_resnet_dp_world2(tmp_path: Path) -> None:
    res = launch(2, ["--model", "resnet18", "--strategy", "dp", "--batch", "4", "--steps", "2",
                     "--warmup-steps", "1", "--print-every", "0"], tmp_path)
    assert res.ok, res.output[-3000:]
    assert res.result is not None
    assert res.result["unit"] == "images" and res.result["images_per_s"] > 0


@pytest.mark.timeout(60)
def test_unsupported_combinations_fail_cleanly(tmp_path: Path) -> None:
    res = launch(1, ["--model", "resnet18", "--strategy", "tp", "--steps", "2"], tmp_path)
    assert res.returncodes == [3]
    assert "GPT models only" in res.output
    res = launch(1, ["--backend", "nanoccl+zstd", "--steps", "2"], tmp_path)
    assert res.returncodes == [2]
    assert "nanoccl" in res.output
    res = launch(1, ["--backend", "nanoccl+int8+qwz", "--strategy", "dp", "--steps", "2"],
                 tmp_path)
    assert res.returncodes == [3]
    assert "zero2 and zero3 only" in res.output


def test_timed_steps_for_a_window() -> None:
    from trainers.train import MAX_TIMED_STEPS, timed_steps_for

    assert timed_steps_for(2.0, 0.04, 4) == 50  # 40 ms steps: 50 fill 2 s
    assert timed_steps_for(2.0, 1.0, 4) == 4  # long steps: --steps as given
    assert timed_steps_for(100.0, 0.001, 4) == MAX_TIMED_STEPS
    assert timed_steps_for(2.0, 0.0, 4) == MAX_TIMED_STEPS  # no estimate: the bound
    assert timed_steps_for(2.0, 0.001, MAX_TIMED_STEPS + 5) == MAX_TIMED_STEPS + 5


@pytest.mark.timeout(120)
def test_min_window_both_ranks_run_the_same_more_steps(tmp_path: Path) -> None:
    """--min-window-s: the ranks agree on the timed steps when the window opens (a rank that
    ran a different count would hang its peer or fail the gather of step times)."""
    res = launch(2, COMMON + ["--strategy", "dp", "--min-window-s", "0.3"], tmp_path)
    assert res.ok, res.output[-3000:]
    assert res.result is not None
    r = res.result
    assert r["min_window_s"] == 0.3 and r["warmup_steps"] == 1
    assert r["steps"] == r["warmup_steps"] + r["timed_steps"]
    assert 2 <= r["timed_steps"] <= 400
    # Both ranks' step times and losses, every step: the slowest rank's, the mean loss.
    assert len(r["step_time_s"]) == len(r["losses"]) == r["steps"]
    assert all(v is not None and math.isfinite(v) for v in r["losses"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("extra", [["--min-window-s", "-1"], ["--min-window-s", "nan"],
                                   ["--min-window-s", "inf"],
                                   ["--min-window-s", "1", "--warmup-steps", "0"]])
def test_a_bad_min_window_is_refused(extra: list[str], tmp_path: Path) -> None:
    res = launch(1, ["--model", "gpt2-nano", "--strategy", "single", "--steps", "3",
                     "--standalone", *extra], tmp_path)
    assert res.returncodes == [2], res.output[-2000:]
    assert "--min-window-s" in res.output


@pytest.mark.timeout(150)
def test_dp_with_the_tuned_bucket(single: dict[str, Any], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """--bucket-cap-mb tuned: nanoccl measures the links (no profile saved yet), chooses one of
    its candidate sizes on every rank alike, and trains the same losses as one rank."""
    from nanoccl.tune import BUCKET_CANDIDATES_MB

    profile = tmp_path / "profile.txt"
    monkeypatch.setenv("NANOCCL_TUNING_FILE", str(profile))
    monkeypatch.delenv("NANOCCL_TUNING", raising=False)
    args = ["--model", "gpt2-nano", "--batch", "8", "--steps", "3", "--warmup-steps", "1",
            "--print-every", "0", "--backend", "nanoccl", "--strategy", "dp",
            "--bucket-cap-mb", "tuned"]
    res = launch(2, args, tmp_path / "run")
    assert res.ok, res.output[-3000:]
    assert res.result is not None
    assert res.result["bucket_tuned"] is True
    assert res.result["bucket_cap_mb"] in BUCKET_CANDIDATES_MB
    assert "tuned" in res.output  # the strategy line names it
    assert profile.is_file()  # tuning "cached": measured once and saved for the next run
    assert res.result["losses"] == pytest.approx(single["losses"], rel=LOSS_RTOL)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, message", [
    (["--backend", "gloo", "--bucket-cap-mb", "tuned"], "needs --backend nanoccl"),
    (["--backend", "nanoccl", "--strategy", "zero2", "--bucket-cap-mb", "tuned"],
     "strategy dp or zero1"),
    (["--backend", "nanoccl", "--strategy", "dp", "--bucket-cap-mb", "tuned"],
     "at least 2 ranks"),
    (["--bucket-cap-mb", "0"], "must be > 0"),
    (["--bucket-cap-mb", "big"], "a size in MB or 'tuned'"),
])
def test_a_bucket_setting_that_cannot_apply_is_refused(args: list[str], message: str,
                                                       tmp_path: Path) -> None:
    res = launch(1, ["--steps", "2", *args], tmp_path)
    assert res.returncodes == [2], res.output[-3000:]
    assert message in res.output


# -------------------------------------------------------------- HSDP on 2 nodes x 2 ranks
HSDP = ["--model", "gpt2-nano", "--batch", "8", "--steps", "3", "--warmup-steps", "1",
        "--print-every", "0", "--strategy", "hsdp"]


def _hsdp_2x2(backend: str, tmp_root: Path, step: str = "forward", **env: str) -> Launch:
    name = (f"hsdp-2x2-{backend}-{step}" + "".join(f"-{k}={v}" for k, v in env.items()))
    res = _run(name, 4, HSDP + ["--backend", backend, "--hsdp-step", step], tmp_root,
               node_env(2, 2, **env))
    assert res.ok, res.output[-3000:]
    assert res.result is not None
    assert (res.result["nodes"], res.result["procs_per_node"]) == (2, 2)
    assert "replicate 2 x shard 2" in res.result["description"]
    return res


@pytest.mark.timeout(120)
def test_hsdp_2x2_through_nanoccl_trains_gloo_losses(single: dict[str, Any],
                                                      tmp_root: Path) -> None:
    """The mesh's sub-groups (new_group) run on nanoccl: the same losses as Gloo's, which
    are one rank's on the same global batches (four ranks, a quarter of it each)."""
    gloo = _hsdp_2x2("gloo", tmp_root).result
    ours = _hsdp_2x2("nanoccl", tmp_root).result
    assert gloo is not None and ours is not None
    assert gloo["losses"] == pytest.approx(single["losses"], rel=LOSS_RTOL)
    assert ours["losses"] == pytest.approx(gloo["losses"], rel=LOSS_RTOL)
    assert gloo["nanoccl_bytes"] is None


@pytest.mark.timeout(120)
def test_hsdp_2x2_records_its_ops(tmp_root: Path) -> None:
    """nanoccl_bytes counts the mesh's groups: reduce-scatters and all-gathers within a node
    (the shard group), gradient shards allreduced across nodes (the replicate group), and
    nothing else crosses a node."""
    res = _hsdp_2x2("nanoccl", tmp_root).result
    assert res is not None
    moved = res["nanoccl_bytes"]
    ops = {k for k, v in moved.items() if k.startswith("sent_") and v > 0}
    assert ops == {"sent_reduce_scatter", "sent_allgather", "sent_allreduce"}, moved
    assert moved["inter_sent"] == moved["sent_allreduce"]
    assert moved["intra_sent"] == moved["sent_reduce_scatter"] + moved["sent_allgather"]
    assert moved["sent"] == moved["inter_sent"] + moved["intra_sent"]


@pytest.mark.timeout(150)
def test_hsdp_2x2_with_int8_on_the_replicate_group(tmp_root: Path) -> None:
    """nanoccl+int8 reaches the groups the mesh creates: the cross-node allreduces carry int8
    (about a quarter of the bytes) and the loss stays within 2% of lossless. gpt2-nano's
    shards are far below the 1 MiB compression_min_bytes: the replicate group compresses
    whatever the size."""
    lossless = _hsdp_2x2("nanoccl", tmp_root).result
    int8 = _hsdp_2x2("nanoccl+int8", tmp_root).result
    assert lossless is not None and int8 is not None
    assert int8["final_loss"] == pytest.approx(lossless["final_loss"], rel=0.02)
    assert all(v is not None and math.isfinite(v) for v in int8["losses"])
    plain, packed = lossless["nanoccl_bytes"], int8["nanoccl_bytes"]
    assert packed["inter_sent"] < 0.3 * plain["inter_sent"]
    assert packed["intra_sent"] == plain["intra_sent"]  # the codec is for the inter-node leg


@pytest.mark.timeout(150)
def test_hsdp_2x2_steps_units_in_the_next_forward(tmp_root: Path) -> None:
    """hsdp with a codec (--hsdp-step forward, the default): each unit's shard reduce-scattered
    across nodes in the backward, all-gathered and stepped in its next forward; the same
    losses as the whole compressed allreduce in the backward (--hsdp-step backward), and the
    same bytes across nodes, now split between reduce-scatters and all-gathers."""
    forward = _hsdp_2x2("nanoccl+int8", tmp_root).result
    backward = _hsdp_2x2("nanoccl+int8", tmp_root, "backward").result
    assert forward is not None and backward is not None
    assert "stepped in the next forward" in forward["description"]
    assert "stepped in the next forward" not in backward["description"]
    assert forward["losses"] == pytest.approx(backward["losses"], rel=1e-6)
    split, whole = forward["nanoccl_bytes"], backward["nanoccl_bytes"]
    assert whole["inter_sent"] == whole["sent_allreduce"] > 0
    assert split.get("sent_allreduce", 0) == 0
    assert split["inter_sent"] == pytest.approx(whole["inter_sent"], rel=0.05)


# ----------------------------------------------- FSDP2 (zero2) on 2 nodes x 2 ranks, codecs
ZERO2 = ["--model", "gpt2-nano", "--batch", "8", "--steps", "3", "--warmup-steps", "1",
         "--print-every", "0", "--strategy", "zero2"]


def _zero2_2x2(backend: str, tmp_root: Path) -> dict[str, Any]:
    res = _run(f"zero2-2x2-{backend}", 4, ZERO2 + ["--backend", backend], tmp_root,
               node_env(2, 2))
    assert res.ok, res.output[-3000:]
    assert res.result is not None
    return res.result


@pytest.mark.timeout(200)
def test_zero2_2x2_compressed_gradients_and_parameters(single: dict[str, Any],
                                                      tmp_root: Path) -> None:
    """FSDP2 across 2 emulated nodes: lossless nanoccl trains Gloo's losses; nanoccl+int8
    reduce-scatters gradients as int8 whatever their size (compress_fsdp), and +qwz also
    all-gathers parameters as int8: fewer bytes across nodes, loss within 2% of lossless."""
    gloo = _zero2_2x2("gloo", tmp_root)
    lossless = _zero2_2x2("nanoccl", tmp_root)
    assert gloo["losses"] == pytest.approx(single["losses"], rel=LOSS_RTOL)
    assert lossless["losses"] == pytest.approx(gloo["losses"], rel=LOSS_RTOL)
    int8 = _zero2_2x2("nanoccl+int8", tmp_root)
    qwz = _zero2_2x2("nanoccl+int8+qwz", tmp_root)
    assert "gradients int8" in int8["description"], int8["description"]
    assert "parameters int8" in qwz["description"], qwz["description"]
    for res in (int8, qwz):
        assert res["final_loss"] == pytest.approx(lossless["final_loss"], rel=0.02)
    plain, grads, params = (r["nanoccl_bytes"] for r in (lossless, int8, qwz))
    # +int8: the reduce-scatters' cross-node half (about half of what crosses) shrinks to a
    # quarter; inside a node and the all-gathers, the same bytes.
    assert grads["inter_sent"] < 0.7 * plain["inter_sent"], (grads, plain)
    assert grads["intra_sent"] == plain["intra_sent"]
    assert grads["sent_allgather"] == plain["sent_allgather"]
    # +qwz: the all-gathers move int8 (encoded once by each owner, also inside the node).
    assert params["sent_allgather"] < 0.3 * plain["sent_allgather"], (params, plain)
    assert params["inter_sent"] < 0.4 * plain["inter_sent"], (params, plain)


@pytest.mark.timeout(200)
def test_zero3_hpz_2x2_gathers_inside_the_node_in_backward(single: dict[str, Any],
                                                          tmp_root: Path) -> None:
    """zero3-hpz (FSDP2 resharded after forward to the node's ranks) trains zero3's losses
    (the batches split, the loss the mean of the ranks'); its backward all-gathers stay inside
    the node, so only forward's cross the link: fewer inter-node bytes than zero3's. With
    +qwz the forward's are int8, with +qwz4 int4."""
    def run(strategy: str, backend: str) -> dict[str, Any]:
        args = [a if a != "zero2" else strategy for a in ZERO2] + ["--backend", backend]
        res = _run(f"{strategy}-2x2-{backend}", 4, args, tmp_root, node_env(2, 2))
        assert res.ok, res.output[-3000:]
        assert res.result is not None
        return res.result

    zero3, hpz = run("zero3", "nanoccl"), run("zero3-hpz", "nanoccl")
    assert "reshard_after_forward=2" in hpz["description"], hpz["description"]
    assert hpz["losses"] == pytest.approx(single["losses"], rel=LOSS_RTOL)
    assert hpz["losses"] == pytest.approx(zero3["losses"], rel=LOSS_RTOL)
    full, node = zero3["nanoccl_bytes"], hpz["nanoccl_bytes"]
    # The same calls (the post-forward groups counted too); a third of zero3's cross-node
    # bytes, the backward's all-gathers, moved inside the node.
    assert node["calls"] == full["calls"], (node, full)
    assert node["inter_sent"] < 0.75 * full["inter_sent"], (node, full)
    assert node["intra_sent"] >= full["intra_sent"], (node, full)
    qwz = run("zero3-hpz", "nanoccl+int8+qwz")
    assert qwz["final_loss"] == pytest.approx(hpz["final_loss"], rel=0.02)
    assert qwz["nanoccl_bytes"]["inter_sent"] < 0.4 * node["inter_sent"]
    qwz4 = run("zero3-hpz", "nanoccl+int8+qwz4")
    assert "parameters int4" in qwz4["description"], qwz4["description"]
    assert qwz4["final_loss"] == pytest.approx(hpz["final_loss"], rel=0.02)
    # The forward's all-gathers, most of what crosses, at half of int8's bytes.
    assert qwz4["nanoccl_bytes"]["inter_sent"] < 0.8 * qwz["nanoccl_bytes"]["inter_sent"]


@pytest.mark.timeout(200)
def test_hsdp_2x2_overlapped_trains_the_same_losses(tmp_root: Path) -> None:
    """--fsdp-overlap on: the cross-node allreduces (and the all-gathers) overlap the compute
    and end in the same bits: Gloo and nanoccl+int8 (its error feedback) give exactly the
    losses they give in place."""
    for backend in ("gloo", "nanoccl+int8"):
        in_place = _hsdp_2x2(backend, tmp_root, "backward").result
        res = _run(f"hsdp-2x2-{backend}-overlap", 4,
                   HSDP + ["--backend", backend, "--fsdp-overlap", "on"], tmp_root,
                   node_env(2, 2))
        assert res.ok, res.output[-3000:]
        overlapped = res.result
        assert overlapped is not None and in_place is not None
        assert "collectives overlapped" in overlapped["description"]
        assert overlapped["losses"] == in_place["losses"], backend


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world, per_node, local_rank, message", [
    (3, 2, lambda r: r % 2, "3 ranks do not split into nodes of 2"),
    (2, 1, lambda r: r, "numbered node by node"),
])
def test_hsdp_refuses_a_layout_it_cannot_mesh(world: int, per_node: int, local_rank: Any,
                                              message: str, tmp_path: Path) -> None:
    env = {r: {"LOCAL_WORLD_SIZE": str(per_node), "LOCAL_RANK": str(local_rank(r))}
           for r in range(world)}
    res = launch(world, ["--model", "gpt2-nano", "--batch", "6", "--steps", "2",
                         "--strategy", "hsdp"], tmp_path, timeout_s=50, rank_env=env)
    assert res.returncodes == [3] * world, res.output[-3000:]
    assert message in res.output


# ----------------------------------------------------------------------- in-process units
def test_synthetic_batches_are_deterministic_and_split() -> None:
    a = SyntheticTokens(512, 64, 8, seed=3)
    b = SyntheticTokens(512, 64, 8, seed=3)
    x0, y0 = a.global_batch(5)
    x1, y1 = b.global_batch(5)
    assert torch.equal(x0, x1) and torch.equal(y0, y1)
    assert not torch.equal(a.global_batch(6)[0], x0)
    assert torch.equal(x0[:, 1:], y0[:, :-1])  # next-token targets
    parts = [shard((x0, y0), r, 4) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x0)
    with pytest.raises(ValueError):
        shard((x0, y0), 0, 3)
    img = SyntheticImages(6, seed=1)
    xi, yi = img.global_batch(0)
    assert xi.shape == (6, 3, 32, 32) and yi.shape == (6,)
    assert torch.equal(SyntheticImages(6, seed=1).global_batch(0)[1], yi)


def test_real_sources(tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("hello nano-cluster " * 50)
    src = make_source("gpt2-tiny", 4, 16, 512, 0, str(text))
    x, y = src.global_batch(0)
    assert x.shape == (4, 16) and int(x.max()) < 256
    with pytest.raises(ValueError):
        make_source("gpt2-nano", 4, 16, 256 - 1, 0, str(text))
    folder = tmp_path / "imgs"
    for k in range(2):
        (folder / f"class{k}").mkdir(parents=True)
        for i in range(3):
            import numpy as np

            np.save(folder / f"class{k}" / f"{i}.npy",
                    np.full((32, 32, 3), 10 * i + k, dtype=np.uint8))
    images = make_source("resnet18", 5, 0, 0, 0, str(folder))
    xi, yi = images.global_batch(1)
    assert xi.shape == (5, 3, 32, 32) and set(yi.tolist()) <= {0, 1}


def test_model_sizes() -> None:
    assert count_params(build_model("resnet18", 0)) == pytest.approx(11.17e6, rel=0.01)
    small = GPT_CONFIGS["gpt2-small"]
    # 124M (tied) = 12 x 12 C^2 + biases/LN + (V + ctx) x C.
    approx = (12 * small.n_layer * small.n_embd ** 2
              + (small.vocab_size + small.block_size) * small.n_embd)
    assert approx == pytest.approx(124e6, rel=0.01)
    assert gpt_flops_per_token(small, 1024) > 6 * 85e6
    tiny = build_model("gpt2-tiny", 0)
    assert count_params(tiny) < 2e6
    logits = tiny(torch.zeros(2, 8, dtype=torch.long))
    assert logits.shape == (2, 8, 512)


def test_split_layers() -> None:
    assert [len(r) for r in split_layers(4, 2)] == [2, 2]
    assert [len(r) for r in split_layers(2, 4)] == [0, 1, 1, 0]
    assert [len(r) for r in split_layers(5, 2)] == [3, 2]
    ranges = split_layers(7, 3)
    assert [i for r in ranges for i in r] == list(range(7))


def test_parse_backend() -> None:
    assert backends.parse_backend("gloo").name == "gloo"
    spec = backends.parse_backend("nanoccl+int8")
    assert (spec.name, spec.codec, spec.is_nanoccl) == ("nanoccl", "int8", True)
    spec = backends.parse_backend("nanoccl+int4+qwz")
    assert (spec.codec, spec.gather_codec) == ("int4", "int8")
    assert backends.parse_backend("nanoccl+int4+qwz4").gather_codec == "int4"
    assert backends.parse_backend("nanoccl+int4").gather_codec is None
    for bad in ("mpi", "gloo+int8", "nanoccl+", "nanoccl+int8+zip", "nanoccl++qwz",
                "nanoccl+int4+qwz8", "nanoccl++qwz4"):
        with pytest.raises(ValueError):
            backends.parse_backend(bad)


def test_hsdp_mesh_groups_get_the_trainers_timeout_and_codec() -> None:
    """new_group would give the mesh's nanoccl groups its own 30-minute default and nanoccl's
    default settings: the trainer passes --timeout and the codec to every mesh dimension."""
    import datetime

    from trainers.strategies import TrainConfig, _mesh_backend_override

    base = dict(model="gpt2-nano", strategy="hsdp", global_batch=8, seq_len=32)
    assert _mesh_backend_override(TrainConfig(**base), ("replicate", "shard")) is None  # gloo
    plain = _mesh_backend_override(TrainConfig(**base, nanoccl=True, timeout_s=42),
                                   ("replicate", "shard"))
    assert plain is not None and set(plain) == {"replicate", "shard"}
    backend, options = plain["replicate"]
    assert backend == "nanoccl" and options._timeout == datetime.timedelta(seconds=42)
    int8 = _mesh_backend_override(TrainConfig(**base, nanoccl=True, timeout_s=7, codec="int8"),
                                  ("replicate", "shard"))
    assert int8 is not None
    options = int8["shard"][1]
    assert options._timeout == datetime.timedelta(seconds=7)
    assert "int8" in options.settings.values()
    # The replicate group carries FSDP2's gradient allreduces only: compressed at any size.
    replicate = int8["replicate"][1]
    assert replicate._timeout == datetime.timedelta(seconds=7)
    assert replicate.settings["compression"] == "int8"
    assert replicate.settings["compression_min_bytes"] == "0"
