"""Compressed collectives through torch.distributed (rank programs in compression_jobs.py)."""

from __future__ import annotations

import pytest

from job_runner import HERE, run_job

JOBS = HERE / "compression_jobs.py"
FSDP_JOBS = HERE / "fsdp_jobs.py"  # overlap with compute, HSDP stepped in the next forward


def node_env(layout: str) -> dict[int, dict[str, str]]:
    """One letter per rank naming its node: "aabb" is 2 nodes x 2 ranks."""
    return {r: {"NANOCCL_NODE_ID": f"node-{c}"} for r, c in enumerate(layout)}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("layout", ["aabb", "abc", "aab"], ids=["2x2", "3x1", "2+1"])
def test_compressed_collectives(layout: str) -> None:
    """Same bits on every rank, error within the codec's, fewer inter-node bytes, lossless where
    it must be, allreduce_compressed with a residual, and a codec mismatch on every rank."""
    job = run_job("compressed", len(layout), rank_env=node_env(layout), timeout=190,
                  pg_timeout=20, script=JOBS)
    results = job.assert_ok()
    assert all(r["checks"] > 40 for r in results), [r["checks"] for r in results]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("layout", ["aabb", "abc", "aab"], ids=["2x2", "3x1", "2+1"])
def test_compressed_sharded_calls_and_fsdp2(layout: str) -> None:
    """reduce_scatter_compressed / all_gather_compressed at any size (bound, same bits, bytes),
    FSDP2 with compress_fsdp within 2% of lossless, bad calls rejected on every rank."""
    job = run_job("sharded", len(layout), rank_env=node_env(layout), timeout=190,
                  pg_timeout=20, script=JOBS)
    results = job.assert_ok()
    assert all(r["checks"] > 25 for r in results), [r["checks"] for r in results]
    print("fsdp final losses:", results[0]["losses"])


@pytest.mark.timeout(200)
@pytest.mark.parametrize("layout", ["aabb", "abc"], ids=["2x2", "3x1"])
def test_fsdp_overlap_gives_the_same_bits(layout: str) -> None:
    """FSDP2's collectives overlapped with compute (overlap_fsdp, compress_fsdp(overlap=True)) end
    in the same parameters, bit for bit, as FSDP2's own in-place calls: nanoccl and Gloo,
    ZeRO-2 and ZeRO-3, an accumulating step, int8 gradients and parameters; on 2x2, HSDP
    with compress_fsdp's cross-node all-reduce hook as FSDP2's own HSDP, and int8 with error
    feedback there close to it."""
    job = run_job("fsdp_overlap", len(layout), rank_env=node_env(layout), timeout=190,
                  pg_timeout=20, script=FSDP_JOBS)
    results = job.assert_ok()
    want = 24 if layout == "aabb" else 15  # 2 nodes of 2: HSDP too
    assert all(r["checks"] == want for r in results), [r["checks"] for r in results]


@pytest.mark.timeout(200)
def test_hsdp_steps_each_unit_in_its_next_forward() -> None:
    """compress_fsdp(step_in_forward=...) on 2x2: lossless the same bits as FSDP2's own HSDP,
    int8 the same bits on every rank and within 2% of it, its state through a checkpoint,
    misuse refused on every rank."""
    job = run_job("hsdp_step_in_forward", 4, rank_env=node_env("aabb"), timeout=190,
                  pg_timeout=20, script=FSDP_JOBS)
    results = job.assert_ok()
    assert all(r["checks"] == 22 for r in results), [r["checks"] for r in results]
    print("hsdp final losses:", results[0]["losses"])


@pytest.mark.timeout(200)
def test_ddp_error_feedback_converges() -> None:
    """DDP on 2x2: int8 + error feedback within 2% of the lossless final loss, int4 within 5%;
    int8 with every bucket of a step fused into one call within 2% too."""
    job = run_job("convergence", 4, rank_env=node_env("aabb"), timeout=190, script=JOBS)
    results = job.assert_ok()
    losses = results[0]["losses"]
    print("final evaluation losses:", losses)
    base = losses["none"]
    assert abs(losses["int8"] - base) <= 0.02 * base, losses
    assert abs(losses["int4"] - base) <= 0.05 * base, losses
    # Buckets fused into one compressed allreduce a step: as close, with fewer calls.
    assert abs(losses["int8-fused"] - base) <= 0.02 * base, losses
    calls = results[0]["calls"]
    assert calls["int8-fused"] == 120 and calls["int8"] > 1.5 * 120, calls  # ~2 buckets a step
