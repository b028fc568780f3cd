"""nanoccl.diloco: DiLoCo across nodes, DDP inside (rank programs in diloco_jobs.py), and its
fragment split in one process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from job_runner import HERE, run_job
from nanoccl.diloco import split_fragments

JOBS = HERE / "diloco_jobs.py"
sys.path.insert(0, str(HERE.parent / "study"))
import study_helpers  # noqa: E402  (trainers/train.py launched as ranks on loopback)


def node_env(layout: str) -> dict[int, dict[str, str]]:
    """One letter per rank naming its node: "aabb" is 2 nodes x 2 ranks."""
    return {r: {"NANOCCL_NODE_ID": f"node-{c}"} for r, c in enumerate(layout)}


@pytest.mark.timeout(150)
def test_h1_lossless_diloco_is_ddp_and_streaming_learns() -> None:
    """2x2: H = 1, SGD inside, outer SGD lr 1 without momentum, lossless, equals DDP with
    that SGD (one fragment and two); streaming (F = 3, tau = 2, int4) lowers the loss, the
    snapshot is the same bits on every rank, fewer inter-node bytes than lossless."""
    job = run_job("equivalence", 4, rank_env=node_env("aabb"), timeout=140, pg_timeout=30,
                  script=JOBS)
    results = job.assert_ok()
    assert all(r["checks"] == 16 for r in results), [r["checks"] for r in results]
    print("max |diloco - ddp|:", results[0]["max_diff_vs_ddp"],
          "streaming eval loss:", results[0]["streaming_loss"],
          "inter-node bytes (int4, lossless):", results[0]["streaming_inter_bytes"])


@pytest.mark.timeout(150)
def test_bad_arguments_fail_on_every_rank_and_resume_is_bit_identical() -> None:
    """2x2: H < 1, F > tensors, tau >= H, unknown codec, ranks disagreeing about H, F, tau or
    the codec: ValueError on every rank, naming the rank, within the timeout; a checkpoint
    with an exchange in flight resumes bit for bit (lossless and int8)."""
    job = run_job("errors_and_checkpoint", 4, rank_env=node_env("aabb"), timeout=140,
                  pg_timeout=20, script=JOBS)
    results = job.assert_ok()
    counts = [r["checks"] for r in results]
    assert all(c == counts[0] and c >= 30 for c in counts), counts
    assert len(results[0]["messages"]) == 9, results[0]["messages"]


@pytest.mark.timeout(90)
def test_one_node_is_plain_data_parallelism() -> None:
    job = run_job("one_node", 2, timeout=80, pg_timeout=20, script=JOBS)
    results = job.assert_ok()
    assert all(r["checks"] == 4 for r in results), [r["checks"] for r in results]


def test_fragments_split_by_parameter_order() -> None:
    assert split_fragments([10, 10, 10, 10], 2) == [range(0, 2), range(2, 4)]
    assert split_fragments([100, 1, 1, 1], 3) == [range(0, 1), range(1, 2), range(2, 4)]
    assert split_fragments([1, 1, 100], 3) == [range(0, 1), range(1, 2), range(2, 3)]
    assert split_fragments([5, 5, 5], 1) == [range(0, 3)]
    for sizes, f in (([3, 7, 2, 9, 1, 4], 4), ([1] * 6, 6), ([50, 1, 1, 1, 50], 2)):
        parts = split_fragments(sizes, f)
        assert len(parts) == f and all(len(p) > 0 for p in parts)
        assert [i for p in parts for i in p] == list(range(len(sizes)))
    with pytest.raises(ValueError):
        split_fragments([1, 2], 3)


TRAIN_ARGS = ["--model", "gpt2-tiny", "--strategy", "diloco", "--batch", "8", "--seq-len", "32",
              "--print-every", "0"]


@pytest.mark.timeout(120)
def test_trainer_runs_streaming_diloco_on_2x2(tmp_path: Path) -> None:
    """trainers/train.py --strategy diloco on 2 emulated nodes x 2 ranks, int4 outer gradients
    from the backend spec: the loss falls, and the cross-node bytes are the outer exchanges'
    only (no per-step gradient allreduce across nodes)."""
    res = study_helpers.launch(4, TRAIN_ARGS + ["--backend", "nanoccl+int4", "--steps", "16",
                                                "--sync-every", "4", "--fragments", "2",
                                                "--overlap-steps", "1"],
                               tmp_path, timeout_s=100, rank_env=study_helpers.node_env(2, 2))
    assert res.ok, res.output[-4000:]
    r = res.result
    assert r is not None and r["strategy"] == "diloco", r
    assert "H=4, 2 fragment(s), tau=1, outer int4" in r["description"], r["description"]
    assert r["losses"][-1] < r["losses"][0], r["losses"]
    moved = r["nanoccl_bytes"]
    # The 14 timed steps (3..16) begin 7 exchanges of a fragment (about half the model): each
    # rank averages its half of it with one rank of the other node, which losslessly sends
    # about 4 bytes an element of its slice: 7 x 4 ranks x 4 B x params / 4 = 28 B a
    # parameter over the 4 ranks. int4 sends about a seventh of that (a DDP step across
    # nodes alone would send 8 B a parameter: 112 in the window).
    assert 0 < moved["inter_sent"] < 0.25 * 28 * r["params"], moved


@pytest.mark.timeout(120)
def test_trainer_refuses_bad_diloco_arguments_on_every_rank(tmp_path: Path) -> None:
    res = study_helpers.launch(4, TRAIN_ARGS + ["--backend", "nanoccl", "--steps", "2",
                                                "--sync-every", "0"],
                               tmp_path, timeout_s=100, rank_env=study_helpers.node_env(2, 2))
    assert res.returncodes == [3, 3, 3, 3], res.output[-4000:]
    assert res.output.count("sync_every (H) must be an integer >= 1") == 4, res.output[-4000:]
