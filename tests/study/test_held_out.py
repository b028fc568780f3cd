"""trainers/train.py --eval-every: the held-out loss curve in the result line (ranks on
loopback, gpt2-nano, a few steps)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from study_helpers import launch, node_env  # noqa: E402

NANO = ["--model", "gpt2-nano", "--batch", "8", "--seq-len", "16", "--print-every", "0"]


def _check_curve(result: dict, steps: list[int]) -> list[dict]:
    held = result["held_out"]
    curve = held["curve"]
    assert [p["step"] for p in curve] == steps, curve
    for p in curve:
        assert p["tokens"] == p["step"] * 8 * 16
        assert p["time_s"] == math.fsum(result["step_time_s"][:p["step"]])
        assert len(p["params_sha256"]) == 16 and math.isfinite(p["loss"])
    assert held["final_loss"] == curve[-1]["loss"]
    return curve


@pytest.mark.timeout(180)
def test_diloco_evaluates_its_global_parameters_and_trains_as_without(tmp_path: Path) -> None:
    """2 nodes x 1 rank, H = 4, lossless: at step 2 the global parameters are still the
    initial ones (no outer step yet), so the held-out loss and the parameters' digest are
    step 0's, though the local parameters moved; from step 4 on they differ. Evaluating
    changes nothing of the training: the losses are those of a run without it, bit for bit."""
    args = NANO + ["--strategy", "diloco", "--backend", "nanoccl", "--steps", "10",
                   "--sync-every", "4"]
    with_eval = launch(2, args + ["--eval-every", "2", "--eval-sequences", "6"], tmp_path,
                       timeout_s=120, rank_env=node_env(2, 1))
    assert with_eval.ok, with_eval.output[-4000:]
    plain = launch(2, args, tmp_path, timeout_s=120, rank_env=node_env(2, 1))
    assert plain.ok, plain.output[-4000:]
    assert with_eval.result is not None and plain.result is not None
    curve = _check_curve(with_eval.result, [0, 2, 4, 6, 8, 10])
    assert (curve[1]["loss"], curve[1]["params_sha256"]) == \
        (curve[0]["loss"], curve[0]["params_sha256"])
    assert curve[2]["params_sha256"] != curve[0]["params_sha256"]
    assert curve[3]["params_sha256"] == curve[2]["params_sha256"]  # step 6: still step 4's
    assert with_eval.result["losses"] == plain.result["losses"]
    assert plain.result["held_out"] is None
    assert "synthetic" in with_eval.result["held_out"]["data"]


@pytest.mark.timeout(180)
def test_the_held_out_loss_does_not_depend_on_the_ranks(tmp_path: Path) -> None:
    """Before the first step one rank and DDP on two evaluate the same parameters, the
    sequences split over the ranks and summed: the same loss (within float64 summation)."""
    args = NANO + ["--steps", "3", "--eval-every", "2", "--eval-sequences", "7"]
    one = launch(1, args + ["--strategy", "single", "--standalone"], tmp_path, timeout_s=90)
    two = launch(2, args + ["--strategy", "dp", "--backend", "gloo"], tmp_path, timeout_s=90)
    assert one.ok, one.output[-3000:]
    assert two.ok, two.output[-3000:]
    assert one.result is not None and two.result is not None
    a, b = _check_curve(one.result, [0, 2, 3]), _check_curve(two.result, [0, 2, 3])
    assert a[0]["params_sha256"] == b[0]["params_sha256"]
    assert a[0]["loss"] == pytest.approx(b[0]["loss"], rel=1e-6)
    assert one.result["held_out"]["sequences"] == 7
    assert one.result["held_out"]["tokens"] == 7 * 16


@pytest.mark.timeout(180)
def test_evaluation_is_refused_where_it_cannot_run(tmp_path: Path) -> None:
    tp = launch(2, NANO + ["--strategy", "tp", "--steps", "2", "--eval-every", "1"], tmp_path,
                timeout_s=90)
    assert tp.returncodes == [3, 3], tp.output[-3000:]
    assert tp.output.count("tp has no held-out evaluation") == 2, tp.output[-3000:]
    text = tmp_path / "plain.txt"
    text.write_bytes(b"plain text, nothing held out of it. " * 40)
    plain = launch(1, NANO + ["--strategy", "single", "--standalone", "--steps", "2",
                              "--eval-every", "1", "--data", str(text)], tmp_path, timeout_s=60)
    assert plain.returncodes == [3] and "holds nothing out" in plain.output, plain.output
    resnet = launch(1, ["--model", "resnet18", "--strategy", "single", "--standalone",
                        "--steps", "2", "--eval-every", "1"], tmp_path, timeout_s=60)
    assert resnet.returncodes == [2] and "for the GPT models" in resnet.output, resnet.output
