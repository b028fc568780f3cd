"""Several NICs a node: nanoccl's TCP transport on two rails of the emulated cluster
(bench/emucluster.py --rails 2): messages striped over both and reassembled intact, unequal
rails loaded by their rates, and a rail brought down mid-collective failing every rank within
the timeout. The tests skip, with the reason, where namespaces cannot be made."""

from __future__ import annotations

import io
import json
import re
import subprocess
import time
from pathlib import Path
from types import ModuleType

import pytest

JOB = """\
import datetime, json, os, subprocess, sys, threading, time
import torch
import torch.distributed as dist
import nanoccl  # noqa: F401  (registers the backend)

mode, timeout_s = sys.argv[1], int(sys.argv[2])
out = {"rank": int(os.environ["RANK"])}


def report(out):
    # One write of the whole line: a node's ranks share the output, and print() under
    # PYTHONUNBUFFERED writes the text and its newline separately (lines interleaved).
    os.write(1, ("RESULT " + json.dumps(out) + "\\n").encode())


if mode == "setup":  # a rail that cannot carry anything from the start
    start = time.monotonic()
    try:
        dist.init_process_group("nanoccl", timeout=datetime.timedelta(seconds=timeout_s))
        dist.all_reduce(torch.ones(1))
        out["error"] = None
    except Exception as exc:
        out["error"] = str(exc)
    out["elapsed"] = time.monotonic() - start
    report(out)
    os._exit(0)
dist.init_process_group("nanoccl", timeout=datetime.timedelta(seconds=timeout_s))
rank, world = dist.get_rank(), dist.get_world_size()
if mode == "stripe":
    # Small (whole on one connection), striped, and an odd size; values that tell every
    # element and every rank apart, so a misplaced stripe cannot go unseen.
    for n in (1000, 1 << 20, (8 << 20) + 3):
        t = torch.arange(n, dtype=torch.float64) * (rank + 1)
        dist.all_reduce(t)
        want = torch.arange(n, dtype=torch.float64) * (world * (world + 1) // 2)
        assert torch.equal(t, want), f"rank {rank}: wrong result at {n} elements"
    out["error"] = None
    out["per_rail"] = {k: v["bytes_sent"] for k, v in nanoccl.stats()["per_rail"].items()}
elif mode == "per-local-rank":
    n = (4 << 20) + 5
    t = torch.arange(n, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(t)
    assert torch.equal(t, torch.arange(n, dtype=torch.float64) * (world * (world + 1) // 2))
    out["error"] = None
    out["local_rank"] = int(os.environ["LOCAL_RANK"])
    out["per_rail"] = {k: v["bytes_sent"] for k, v in nanoccl.stats()["per_rail"].items()}
else:  # rail-down: rank 0 takes its eth1 down while allreduces run
    t = torch.ones((64 << 20) // 4)
    dist.all_reduce(t)
    if rank == 0:
        down = lambda: subprocess.run(["ip", "link", "set", "eth1", "down"], check=True)
        threading.Timer(0.3, down).start()
    start = time.monotonic()
    try:
        for _ in range(30):
            dist.all_reduce(t)
        out["error"] = None
    except Exception as exc:  # the collective's error, whatever its type
        out["error"] = str(exc)
    out["elapsed"] = time.monotonic() - start
report(out)
os._exit(0)  # after a failed collective, do not wait on teardown
"""


def _run(emucluster: ModuleType, tmp_path: Path, mode: str, timeout_s: int,
         rail_rates: list[str], procs_per_node: int = 1, env: dict[str, str] | None = None,
         cut_rail1_of_node0: bool = False) -> tuple[int, list[dict], dict, str]:
    script = tmp_path / "rails_job.py"
    script.write_text(JOB)
    buf = io.StringIO()
    with emucluster.EmuCluster(nodes=2, procs_per_node=procs_per_node, rails=2,
                               rail_rates=rail_rates) as c:
        if cut_rail1_of_node0:
            # Off its bridge: both ends stay up with a carrier, nothing gets through.
            subprocess.run(["ip", "-n", c.switch_ns, "link", "set", "n0r1", "nomaster"],
                           check=True, timeout=30)
        before = c.rail_bytes()
        rc = c.run([str(script), mode, str(timeout_s)], out=buf, timeout_s=timeout_s + 120,
                   env=env)
        after = c.rail_bytes()
    sent = {key: after[key].tx_bytes - before[key].tx_bytes for key in after}
    text = buf.getvalue()
    # Every "RESULT {...}" in the output, wherever it starts (even mid-line).
    decoder = json.JSONDecoder()
    results = [decoder.raw_decode(part)[0] for part in text.split("RESULT ")[1:]
               if part.startswith("{")]
    return rc, results, sent, text


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rates, fast_share, nsocks", [(["1gbit", "1gbit"], 0.5, None),
                                                       (["1gbit", "100mbit"], 10 / 11, 3)])
def test_messages_stripe_over_both_rails_by_their_rates(
        emucluster: ModuleType, can_make_namespaces: None, tmp_path: Path,
        rates: list[str], fast_share: float, nsocks: int | None) -> None:
    env = {"NANOCCL_DEBUG": "INFO"}
    if nsocks is not None:
        env["NANOCCL_NSOCKS"] = str(nsocks)
    rc, results, sent, text = _run(emucluster, tmp_path, "stripe", 60, rates, env=env)
    assert rc == 0, text
    # NANOCCL_NSOCKS connections a peer on each rail (two by default).
    ready = [line for line in text.splitlines() if "ready over tcp/" in line]
    assert len(ready) == 2, text
    assert all(f" x{nsocks or 2} on each of 2 rails" in line for line in ready), ready
    assert sorted(r["rank"] for r in results) == [0, 1] and all(r["error"] is None
                                                                 for r in results), text
    for r in results:  # nanoccl's own count, per interface: payload only
        rails = r["per_rail"]
        assert list(rails) == ["eth0", "eth1"], rails
        assert sum(rails.values()) == (1000 + (1 << 20) + (8 << 20) + 3) * 8, rails
        assert rails["eth0"] / sum(rails.values()) == pytest.approx(fast_share, abs=0.03), rails
    for node in (0, 1):
        rail0, rail1 = sent[(node, 0)], sent[(node, 1)]
        # A 2-rank allreduce sends each rank's whole 75 MB of float64 once; rail 0 also
        # carries the small messages.
        assert rail0 + rail1 > 70e6, (node, sent)
        assert rail0 / (rail0 + rail1) == pytest.approx(fast_share, abs=0.05), (node, sent)


@pytest.mark.timeout(240)
def test_a_rail_brought_down_mid_collective_fails_every_rank_within_the_timeout(
        emucluster: ModuleType, can_make_namespaces: None, tmp_path: Path) -> None:
    timeout_s = 15
    start = time.monotonic()
    rc, results, _, text = _run(emucluster, tmp_path, "rail-down", timeout_s,
                                ["1gbit", "1gbit"])
    assert sorted(r["rank"] for r in results) == [0, 1], text  # nobody hung or crashed
    for r in results:
        assert r["error"], f"rank {r['rank']} finished its allreduces with a rail down:\n{text}"
        # The timeout (its own, or the peer's relayed) names the call, the peer and what is
        # stuck: a connection on eth1.
        assert "allreduce" in r["error"] and "timed out after 15000 ms" in r["error"], r["error"]
        # Stuck bytes where this rank was sending; where it only waited to receive, the rail
        # brought down here or the stripe that did not arrive on it.
        assert re.search(r"connection \d+ to rank [01] on eth1: ([0-9.]+ MB (not (acknowledged|"
                         r"sent)|still to arrive)|eth1 is down here)",
                         r["error"]), r["error"]
        assert r["elapsed"] < timeout_s + 30, (r, text)
    assert time.monotonic() - start < timeout_s + 100


@pytest.mark.timeout(240)
def test_one_rail_per_local_rank(emucluster: ModuleType, can_make_namespaces: None,
                                 tmp_path: Path) -> None:
    """NANOCCL_RAIL_PER_LOCAL_RANK=1 on 2x2: local rank i's share crosses nodes on eth<i>."""
    rc, results, sent, text = _run(emucluster, tmp_path, "per-local-rank", 60,
                                   ["1gbit", "1gbit"], procs_per_node=2,
                                   env={"NANOCCL_RAIL_PER_LOCAL_RANK": "1",
                                        "NANOCCL_ALGO": "hierarchical"})
    assert rc == 0, text
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3], text
    for r in results:
        mine, other = f"eth{r['local_rank']}", f"eth{1 - r['local_rank']}"
        rails = r["per_rail"]
        # Its shard of the 32 MB allreduce on its own rail; setup's few bytes may use both.
        assert rails.get(mine, 0) > 8e6, r
        assert rails.get(other, 0) < 0.02 * rails[mine], r
    for node in (0, 1):  # both NICs of every node busy, each with one local rank's share
        assert sent[(node, 0)] > 8e6 and sent[(node, 1)] > 8e6, sent


@pytest.mark.timeout(240)
def test_a_rail_that_carries_nothing_fails_setup_naming_it(
        emucluster: ModuleType, can_make_namespaces: None, tmp_path: Path) -> None:
    timeout_s = 10
    rc, results, _, text = _run(emucluster, tmp_path, "setup", timeout_s, ["1gbit", "1gbit"],
                                cut_rail1_of_node0=True,
                                env={"NANOCCL_CONNECT_TIMEOUT_MS": str(timeout_s * 1000)})
    assert sorted(r["rank"] for r in results) == [0, 1], text  # nobody hung or crashed
    for r in results:
        assert r["error"], f"rank {r['rank']} set up over a rail that carries nothing:\n{text}"
        assert "on rail(s) eth1" in r["error"], r["error"]
        assert r["elapsed"] < 3 * timeout_s + 30, (r, text)
