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
