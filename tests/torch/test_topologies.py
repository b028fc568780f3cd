"""nanoccl through torch.distributed on emulated topologies, against Gloo.

The rank programs are in topology_jobs.py. A topology is a node id per rank: NANOCCL_NODE_ID
for a job's default group, Options(node_id=...) for its further groups, so that one job covers
several topologies (starting a rank costs seconds here). Names: "3x2" is 3 nodes of 2 ranks,
"2+1" a node of 2 ranks and a node of 1, a trailing "i" interleaved nodes (a node's ranks are
not contiguous). Patterns give one letter per rank, equal letters one node: "aabb" is 2x2.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from job_runner import HERE, JobResult, run_job

TOPOLOGY_JOBS = HERE / "topology_jobs.py"

RunJob = Callable[..., JobResult]


def ids_of(pattern: str) -> list[str]:
    """"aabb" -> ["na", "na", "nb", "nb"]."""
    return [f"n{c}" for c in pattern]


@pytest.fixture
def run_topology_job() -> RunJob:
    """run_job on topology_jobs.py, with NANOCCL_NODE_ID per rank from a pattern."""

    def run(scenario: str, pattern: str, **kwargs: Any) -> JobResult:
        rank_env = {r: {"NANOCCL_NODE_ID": i} for r, i in enumerate(ids_of(pattern))}
        return run_job(scenario, len(pattern), rank_env=rank_env, script=TOPOLOGY_JOBS,
                       **kwargs)

    return run


def run_topologies(run: RunJob, world_pattern: str,
                   groups: list[tuple[str, list[int], str]]) -> list[dict[str, Any]]:
    """One job: the default group on `world_pattern` (default settings: the planner's own
    threshold, MiB-sized calls, forced algorithms), then each of `groups` (name, global ranks,
    pattern) with every collective, reduction and dtype, small and large, against Gloo, the
    planner's choices, the link classes and the inter-node bytes per node per allreduce."""
    args = []
    for name, ranks, pattern in groups:
        assert len(ranks) == len(pattern)
        args += ["--group", f"{name}=" + ",".join(map(str, ranks)) + ":" +
                 ",".join(ids_of(pattern))]
    job = run("topologies", world_pattern, args=args, timeout=160, pg_timeout=30)
    results = job.assert_ok()
    for rank, result in enumerate(results):
        mine = {"world"} | {name for name, ranks, _ in groups if rank in ranks}
        # Every group this rank is in ran its checks and measured its node links.
        assert set(result["inter_node_bytes"]) == mine, (rank, sorted(result["inter_node_bytes"]))
        assert set(result["group_seconds"]) == mine - {"world"}, rank
        assert result["checks"] > 500 * len(mine), (rank, result["checks"])
    return results


@pytest.mark.timeout(170)
def test_four_ranks_2x2_2x2i_1x4_4x1_2p1_1p2(run_topology_job: RunJob) -> None:
    everyone = [0, 1, 2, 3]
    run_topologies(run_topology_job, "aabb", [
        ("2x2", everyone, "aabb"),
        ("2x2i", everyone, "abab"),
        ("1x4", everyone, "aaaa"),
        ("4x1", everyone, "abcd"),
        ("2+1", [0, 1, 2], "aab"),
        ("1+2", [1, 2, 3], "abb"),
    ])


@pytest.mark.timeout(90)
def test_2x2_hierarchical_allreduces_run_at_most_4_threads_none_per_call(
        run_topology_job: RunJob) -> None:
    results = run_topology_job("threads", "aabb", timeout=80, pg_timeout=30).assert_ok()
    for rank, result in enumerate(results):
        assert result["peak"] <= 4, (rank, result["threads"])


@pytest.mark.timeout(170)
def test_six_ranks_3x2_2x3_3p2p1i(run_topology_job: RunJob) -> None:
    everyone = list(range(6))
    run_topologies(run_topology_job, "aabbcc", [
        ("3x2", everyone, "aabbcc"),
        ("2x3", everyone, "aaabbb"),
        ("3+2+1i", everyone, "abacab"),
    ])


VICTIM_LINE = re.compile(r"VICTIM pid=(\d+) segment=(/nanoccl-[0-9a-f]+-\d+-\d+) exists=(\w+)")


@pytest.mark.timeout(120)
def test_segment_of_a_killed_rank_is_cleaned_by_the_next_run(run_topology_job: RunJob) -> None:
    """Rank 1 of a 2+1 job is SIGKILLed in the intra-node setup of its second group, after
    publishing its shared-memory segment and before its node peer had finished with it: the
    segment stays in /dev/shm. The survivors fail with an error in time, in the new group and
    in the one set up before the kill; the next run on the same node ids removes the segment
    in its setup and works."""
    pattern = "aab"
    ids = ",".join(ids_of(pattern))
    first = run_topology_job("killed_in_shm", pattern, timeout=60, pg_timeout=6,
                             args=["--ids", ids, "--victim", "1"])
    victim = first.ranks[1]
    assert victim.returncode == -signal.SIGKILL, first.describe()
    found = VICTIM_LINE.search(victim.output)
    assert found, first.describe()
    pid, segment, existed = int(found.group(1)), found.group(2), found.group(3)
    assert existed == "True" and segment.endswith(f"-{pid}"), first.describe()
    for r in (first.ranks[0], first.ranks[2]):
        assert not r.timed_out and r.returncode == 0, first.describe()
        assert r.result is not None and r.result.get("raised"), first.describe()
        assert not r.result["failures"], first.describe()
    stale = Path("/dev/shm" + segment)
    if not stale.exists():
        # Any nanoccl process of this user that sets up shared memory removes dead ranks'
        # segments: a job running beside this test got there first.
        seen = first.ranks[0].result["victim_segments"] if first.ranks[0].result else None
        pytest.skip(f"{stale} was removed before the second run by another nanoccl process "
                    f"(rank 0 saw {seen} after its setup failed)")

    second = run_topology_job("after_kill", pattern, timeout=60, pg_timeout=20,
                              args=["--ids", ids, "--stale", segment])
    second.assert_ok()
    assert not stale.exists(), f"{stale} is still there after the next run"
    assert not list(Path("/dev/shm").glob(f"nanoccl-*-{pid}")), "segments of the dead rank left"
