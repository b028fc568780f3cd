"""nanoccl.diloco: DiLoCo across nodes, DDP inside (rank programs in diloco_jobs.py), and its
fragment split in one process."""

from __future__ import annotations

import subprocess
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
@pytest.mark.parametrize("layout", ["aabb", "ab"], ids=["2x2", "2x1"])
def test_h1_lossless_diloco_is_ddp_and_streaming_learns(layout: str) -> None:
    """2x2 and 2x1: H = 1, SGD inside, outer SGD lr 1 without momentum, lossless, equals DDP
    with that SGD (one fragment and two); streaming (F = 3, tau = 2, int4) lowers the loss,
    the snapshot is the same bits on every rank, fewer inter-node bytes than lossless;
    global_parameters() holds the snapshot and puts the local parameters back bit for bit."""
    job = run_job("equivalence", len(layout), rank_env=node_env(layout), timeout=140,
                  pg_timeout=30, script=JOBS)
    results = job.assert_ok()
    assert all(r["checks"] == 20 for r in results), [r["checks"] for r in results]
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


@pytest.mark.timeout(90)
def test_nodes_of_different_sizes_are_refused_on_every_rank() -> None:
    job = run_job("uneven_nodes", 3, rank_env=node_env("aab"), timeout=80, pg_timeout=20,
                  script=JOBS)
    results = job.assert_ok()
    assert all(r["checks"] == 2 for r in results), [r["checks"] for r in results]


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
                                                "--overlap-steps", "1", "--min-window-s",
                                                "0.001"],
                               tmp_path, timeout_s=100, rank_env=study_helpers.node_env(2, 2))
    assert res.ok, res.output[-4000:]
    r = res.result
    assert r is not None and r["strategy"] == "diloco", r
    assert "H=4, 2 fragment(s), tau=1, outer int4" in r["description"], r["description"]
    assert r["diloco"] == {"sync_every": 4, "fragments": 2, "overlap_steps": 1,
                           "outer_lr": 0.7, "outer_momentum": 0.9}, r["diloco"]
    # --min-window-s: the 14 timed steps asked for, rounded up to whole cycles of 4.
    assert (r["timed_steps"], r["steps"]) == (16, 18), (r["timed_steps"], r["steps"])
    assert r["losses"][-1] < r["losses"][0], r["losses"]
    moved = r["nanoccl_bytes"]
    # The 16 timed steps (3..18) begin 8 exchanges of a fragment (about half the model): each
    # rank averages its half of it with one rank of the other node, which losslessly sends
    # about 4 bytes an element of its slice: 8 x 4 ranks x 4 B x params / 4 = 32 B a
    # parameter over the 4 ranks. int4 sends about a seventh of that (a DDP step across
    # nodes alone would send 8 B a parameter: 128 in the window).
    assert 0 < moved["inter_sent"] < 0.25 * 32 * r["params"], moved


@pytest.mark.timeout(120)
def test_trainer_refuses_bad_diloco_arguments_on_every_rank(tmp_path: Path) -> None:
    res = study_helpers.launch(4, TRAIN_ARGS + ["--backend", "nanoccl", "--steps", "2",
                                                "--sync-every", "0"],
                               tmp_path, timeout_s=100, rank_env=study_helpers.node_env(2, 2))
    assert res.returncodes == [3, 3, 3, 3], res.output[-4000:]
    assert res.output.count("sync_every (H) must be an integer >= 1") == 4, res.output[-4000:]


def test_study_rows_of_diloco() -> None:
    """bench/study.py --strategies diloco,diloco-h10-f4-t2,diloco-h10-lr0.35: the spec's trainer
    flags (the outer lr among them), whole
    H-step cycles, left out (with a note) on one node and on Gloo; a cluster result's row
    named back from its result line."""
    import study_plan
    import study_runs

    parse = study_plan.DiLoCoSpec.parse
    assert parse("dp") is None
    assert parse("diloco") == study_plan.DiLoCoSpec(50, 1, 0)
    assert parse("diloco-h10-f4-t2") == study_plan.DiLoCoSpec(10, 4, 2)
    assert parse("diloco-h10").name == "diloco-h10-f1-t0" and parse("diloco-h50").name == "diloco"
    assert parse("diloco-h10-lr0.35") == study_plan.DiLoCoSpec(10, 1, 0, 0.35)
    assert parse("diloco-h10-lr0.35").name == "diloco-h10-f1-t0-lr0.35"
    assert parse("diloco-lr0.7").name == "diloco"  # the default lr is not named
    for bad in ("diloco-x3", "diloco-h", "diloco-h0", "diloco-h4-t4", "diloco-f0", "diloco-lr",
                "diloco-lr0", "diloco-lrx", "diloco-lrnan", "diloco-lr11", "diloco-h10-lr-1"):
        with pytest.raises(ValueError, match="bad diloco strategy"):
            parse(bad)
    prof = study_plan.Profile("t", ("gpt2-tiny",), {"gpt2-tiny": ("dp", "diloco-h10-f2-t1")},
                              ("1x2", "2x1"), ("gloo", "nanoccl+int4"), {"gpt2-tiny": (16,)},
                              {"gpt2-tiny": 16}, steps=6, warmup=2)
    plan = study_plan.build_plan(prof, check_backends=False)
    rows = {(r.setup.name, r.strategy, r.backend) for r in plan.runs}
    assert rows == {("1x2", "dp", "gloo"), ("1x2", "dp", "nanoccl+int4"),
                    ("2x1", "dp", "gloo"), ("2x1", "dp", "nanoccl+int4"),
                    ("2x1", "diloco-h10-f2-t1", "nanoccl+int4")}, rows
    assert any("on 1x2 left out: diloco on one node is dp" in n for n in plan.notes), plan.notes
    assert any("on gloo left out: diloco runs on nanoccl only" in n for n in plan.notes)
    argv = study_runs.train_argv("gpt2-tiny", "diloco-h10-f2-t1", "nanoccl+int4", 16, prof,
                                 "out.json")
    assert argv[argv.index("--strategy") + 1] == "diloco"
    assert argv[argv.index("--steps") + 1] == "22"  # 2 warm-up + two cycles of 10
    assert argv[argv.index("--sync-every") + 1] == "10"
    assert argv[argv.index("--fragments") + 1] == "2"
    assert argv[argv.index("--overlap-steps") + 1] == "1"
    assert argv[argv.index("--outer-lr") + 1] == "0.7"
    argv = study_runs.train_argv("gpt2-tiny", "diloco-h10-lr0.35", "nanoccl+int4", 16, prof,
                                 "out.json")
    assert argv[argv.index("--outer-lr") + 1] == "0.35"
    doc = {"strategy": "diloco", "diloco": {"sync_every": 10, "fragments": 2,
                                            "overlap_steps": 1}}
    assert study_plan.DiLoCoSpec.of_result(doc) == "diloco-h10-f2-t1"
    doc["diloco"]["outer_lr"] = 0.35
    assert study_plan.DiLoCoSpec.of_result(doc) == "diloco-h10-f2-t1-lr0.35"
    assert study_plan.DiLoCoSpec.of_result({"strategy": "dp", "diloco": None}) == "dp"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fragments", [1, 2], ids=["plain", "streaming"])
def test_torchft_diloco_runs_over_nanoccl(fragments: int) -> None:
    """torchft's DiLoCo (its lighthouse, two replica groups as processes) with its process
    groups built by nanoccl.new_process_group: nanoccl carries every outer allreduce (2 a
    fragment's sync: weight, bias), the loss falls, and plain DiLoCo leaves both replicas with
    the same parameters after the last sync (examples/torchft_diloco.py checks and says so)."""
    example = HERE.parent.parent / "examples" / "torchft_diloco.py"
    done = subprocess.run([sys.executable, str(example), "--steps", "40", "--sync-every", "10",
                           "--fragments", str(fragments)],
                          capture_output=True, text=True, timeout=110)
    out = done.stdout
    assert done.returncode == 0 and "torchft_diloco: OK" in out, out + done.stderr[-3000:]
    syncs = 4 * fragments  # 40 steps, one fragment synced every 10 / fragments
    for r in (0, 1):
        assert (f"replica {r}: {syncs} outer steps over torchft-nanoccl" in out
                and f"{2 * syncs} nanoccl allreduces" in out), out
