"""bench/tune_grid.py: the grid of static settings it measures the tuner against."""

from __future__ import annotations

from types import ModuleType

import pytest

from bench_helpers import BENCH, load_module


@pytest.fixture(scope="module")
def grid() -> ModuleType:
    return load_module("tune_grid", BENCH / "tune_grid.py")


def test_a_hierarchical_cluster_gets_the_hierarchy_with_every_codec(grid: ModuleType) -> None:
    settings = grid.static_grid(2, 2, ["none", "bf16", "int8"], [1 << 18, 1 << 20], [1, 2])
    labels = [s.label for s in settings]
    assert len(labels) == len(set(labels))
    assert "hierarchical/int8/c256K/s2" in labels
    assert "hierarchical/none/c1024K/s1" in labels
    assert "ring/none/c256K/s1" in labels
    # Unchunked rows appear once per socket count; no lossy flat rows on a hierarchical cluster.
    assert [lb for lb in labels if lb.startswith("tree/")] == ["tree/none/c1024K/s1",
                                                               "tree/none/c1024K/s2"]
    assert not [lb for lb in labels if lb.startswith("compressed/")]
    assert not [lb for lb in labels if lb.startswith("ring/int8")]
    for s in settings:
        assert s.options["compression_min_bytes"] == 0
        assert s.options["algo"] == s.label.split("/")[0]


def test_one_rank_nodes_get_the_flat_compressed_row(grid: ModuleType) -> None:
    labels = [s.label for s in grid.static_grid(3, 1, ["none", "int8"], [1 << 20], [2])]
    assert "compressed/int8/c1024K/s2" in labels
    assert "compressed/none/c1024K/s2" not in labels
    assert not [lb for lb in labels if lb.startswith("hierarchical/")]


@pytest.mark.parametrize("text,expected", [("1M", 1 << 20), ("256K", 1 << 18), ("4096", 4096)])
def test_sizes(grid: ModuleType, text: str, expected: int) -> None:
    assert grid.parse_size(text) == expected


def test_modelled_since_is_per_call_between_two_views(perf: ModuleType) -> None:
    """nanoccl-perf's helper, which tune_grid uses for the tuner's choices."""
    before = {"allreduce/ring": {"calls": 2, "predicted_s": 2.0, "measured_s": 3.0}}
    after = {"allreduce/ring": {"calls": 4, "predicted_s": 4.0, "measured_s": 7.0},
             "allreduce/hierarchical/int8": {"calls": 1, "predicted_s": 0.5, "measured_s": 0.25}}
    chose = perf.modelled_since(before, after)
    assert chose == [
        {"what": "allreduce/ring", "calls": 2, "predicted_s": 1.0, "measured_s": 2.0},
        {"what": "allreduce/hierarchical/int8", "calls": 1, "predicted_s": 0.5,
         "measured_s": 0.25}]
    assert perf.modelled_since(after, after) == []


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank Gloo default group for the test, destroyed after it."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _one_rank_groups(grid: ModuleType, monkeypatch) -> tuple[list, list[str]]:
    """Two settings on the one-rank group, with dist's barrier and allreduce recorded."""
    import torch.distributed as dist

    calls: list[str] = []
    real_barrier, real_allreduce = dist.barrier, dist.all_reduce
    monkeypatch.setattr(dist, "barrier",
                        lambda group=None: (calls.append("barrier"), real_barrier(group=group)))
    monkeypatch.setattr(dist, "all_reduce",
                        lambda t, group=None: (calls.append("allreduce"),
                                               real_allreduce(t, group=group)))
    settings = [grid.Setting("a", "gloo", group=dist.group.WORLD),
                grid.Setting("b", "gloo", group=dist.group.WORLD)]
    return settings, calls


@pytest.mark.parametrize("mode,per_call", [("barrier", ["barrier", "allreduce"]),
                                           ("back-to-back", ["allreduce"])])
def test_time_groups_times_each_call_after_a_barrier_in_barrier_mode(
        grid: ModuleType, one_rank, monkeypatch, mode: str, per_call: list[str]) -> None:
    import torch

    settings, calls = _one_rank_groups(grid, monkeypatch)
    buf = torch.zeros(8)
    medians = grid.time_groups(settings, buf, 32, 3, 1, seed=1, mode=mode)
    assert calls == per_call * 6
    assert len(medians) == 2 and all(m > 0 for m in medians)
    assert [len(s.times[32]) for s in settings] == [3, 3]
    assert torch.equal(buf, torch.ones(8))  # refilled with ones before every call


def test_time_groups_refuses_an_unknown_mode(grid: ModuleType) -> None:
    with pytest.raises(ValueError, match="barrier, back-to-back"):
        grid.time_groups([], None, 4, 1, 1, seed=0, mode="alternate")


def test_paired_timing_returns_every_call_and_the_ratio(grid: ModuleType, one_rank) -> None:
    import torch
    import torch.distributed as dist

    settings = [grid.Setting("a", "gloo", group=dist.new_group(backend="gloo")),
                grid.Setting("b", "gloo", group=dist.new_group(backend="gloo"))]
    calls = grid.time_groups(settings, torch.zeros(4), 16, 4, 1, seed=3, paired=True)
    assert [len(c) for c in calls] == [4, 4]
    # A slow pair slows both its calls alike: the ratio stays.
    assert grid.paired_ratio([1.0, 10.0, 1.0, 0.9], [2.0, 20.0, 2.0, 1.8]) == 0.5
    assert grid.paired_ratio([3.0], [2.0]) == 1.5
    # The second call of a pair 20% slower whichever group it is: the two orders cancel.
    first = [1.0, 1.2, 1.0, 1.2]  # first in the even pairs, second in the odd ones
    second = [1.2, 1.0, 1.2, 1.0]
    assert grid.paired_ratio(first, second) == pytest.approx(1.0)


def test_paired_timing_takes_each_group_first_in_every_other_round(grid: ModuleType, one_rank,
                                                                   monkeypatch) -> None:
    import torch
    import torch.distributed as dist

    settings = [grid.Setting("a", "gloo", group=dist.new_group(backend="gloo")),
                grid.Setting("b", "gloo", group=dist.new_group(backend="gloo"))]
    ran: list[str] = []
    real = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda t, group=None: (
        ran.append("a" if group is settings[0].group else "b"), real(t, group=group)))
    grid.time_groups(settings, torch.zeros(2), 8, 4, 1, seed=0, paired=True)
    assert ran == ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_fresh_twins_are_new_groups_with_the_finalists_and_the_tuners_settings(
        grid: ModuleType, one_rank) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    best = grid.Setting("x", "gloo", {"algo": "ring"}, group=dist.group.WORLD)
    tuned = grid.Setting("auto", "gloo", {"tuning": "measure", "tuning_file": "/tmp/p0.txt"},
                         group=dist.group.WORLD)
    pair = grid.fresh_twins(best, tuned, datetime.timedelta(seconds=30))
    assert [s.label for s in pair] == ["x", "auto"]
    assert pair[0].options == {"algo": "ring"} and pair[0].options is not best.options
    # The tuner's twin reads the profile the tuner measured instead of measuring again.
    assert pair[1].options == {"tuning": "cached", "tuning_file": "/tmp/p0.txt"}
    assert tuned.options["tuning"] == "measure"
    groups = [s.group for s in pair]
    assert groups[0] is not groups[1] and dist.group.WORLD not in groups
    buf = torch.ones(4)
    for g in groups:
        dist.all_reduce(buf, group=g)
        dist.destroy_process_group(g)
    assert torch.equal(buf, torch.ones(4))
