"""The emulated nano-cluster: shaping parameters, a real 2-node gloo allreduce across
the shaped links, and that nothing is left behind (also after SIGTERM and crashes).

The namespace tests skip, with the reason, where namespaces cannot be made
(not root / no CAP_NET_ADMIN / no iproute2).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from bench_helpers import BENCH, REPO

ALLREDUCE_SCRIPT = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4 << 20)  # 16 MiB
dist.all_reduce(t)
assert float(t[0]) == dist.get_world_size() and float(t[-1]) == dist.get_world_size()
print(f"rank {dist.get_rank()} group_rank {os.environ['GROUP_RANK']} "
      f"ifname {os.environ.get('GLOO_SOCKET_IFNAME')} "
      f"node_id {os.environ.get('NANOCCL_NODE_ID', '-')} OK", flush=True)
dist.destroy_process_group()
"""

SLEEP_SCRIPT = """\
import time
print("started", flush=True)
time.sleep(300)
"""


def _namespaces(prefix: str) -> list[str]:
    proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in proc.stdout.splitlines()
            if line.strip() and line.startswith(prefix)]


def test_parse_rate(emucluster: ModuleType) -> None:
    assert emucluster.parse_rate("1gbit") == 10**9
    assert emucluster.parse_rate("100mbit") == 10**8
    assert emucluster.parse_rate("2.5gbit") == 25 * 10**8
    assert emucluster.parse_rate("125mbps") == 10**9
    assert emucluster.parse_rate("none") is None
    with pytest.raises(ValueError):
        emucluster.parse_rate("fast")


def test_tbf_params_leave_room_for_ethernet_framing(emucluster: ModuleType) -> None:
    cluster = emucluster.EmuCluster(nodes=2, rate="1gbit")
    p = cluster.tbf_params()
    # tbf counts from the MAC header on; the wire adds 24 B per 1514 B frame.
    assert p["rate_bit"] == pytest.approx(1e9 * 1514 / 1538, rel=1e-6)
    # A GSO super-packet (64 KiB + headers) must fit the bucket, or tbf splits each one.
    assert p["burst"] >= 64 * 1024 + 1514
    assert p["limit"] > p["burst"]
    assert cluster.run_id.startswith(f"ncl{os.getpid()}")
    assert emucluster.EmuCluster(nodes=2).run_id != cluster.run_id


def test_allreduce_crosses_the_shaped_link(emucluster: ModuleType, can_make_namespaces: None,
                                           tmp_path: Path) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE_SCRIPT)
    out = io.StringIO()
    cluster = emucluster.EmuCluster(nodes=2, procs_per_node=1, rate="1gbit")
    with cluster:
        prefix = cluster.run_id
        assert sorted(_namespaces(prefix)) == sorted(
            [f"{prefix}n0", f"{prefix}n1", f"{prefix}sw"])
        before = cluster.link_bytes()
        status = cluster.run([str(script)], timeout_s=150, out=out)
        after = cluster.link_bytes()
    text = out.getvalue()
    assert status == 0, text
    assert "[n0] rank 0 group_rank 0 ifname eth0" in text, text
    assert "[n1] rank 1 group_rank 1 ifname eth0" in text, text
    payload = 16 << 20  # a 2-rank allreduce sends the whole buffer each way (ring: 2(n-1)/n)
    for node in (0, 1):
        assert after[node].tx_bytes - before[node].tx_bytes >= 0.95 * payload
        assert after[node].rx_bytes - before[node].rx_bytes >= 0.95 * payload
    assert _namespaces(prefix) == []
    assert not (Path("/etc/netns") / f"{prefix}n0").exists()


NANOCCL_SCRIPT = """\
import json
import os
import torch
import torch.distributed as dist
import nanoccl

dist.init_process_group("nanoccl")
t = torch.ones(4 << 20)  # 16 MiB
dist.all_reduce(t)
assert float(t[0]) == dist.get_world_size() and float(t[-1]) == dist.get_world_size()
s = nanoccl.stats()
# A file per rank: ranks of one node share torchrun's output stream, where lines interleave.
with open(os.path.join(os.environ["STATS_DIR"], f"stats-{s['rank']}.json"), "w") as f:
    json.dump({"rank": s["rank"], "node": os.environ["GROUP_RANK"], "per_link": s["per_link"]}, f)
dist.destroy_process_group()
"""


def test_nanoccl_counts_what_crosses_the_nodes(emucluster: ModuleType, can_make_namespaces: None,
                                               tmp_path: Path) -> None:
    """2 nodes x 2 ranks: what nanoccl counts as inter-node is what the node links carried."""
    import json

    script = tmp_path / "nanoccl_allreduce.py"
    script.write_text(NANOCCL_SCRIPT)
    out = io.StringIO()
    cluster = emucluster.EmuCluster(nodes=2, procs_per_node=2, rate="1gbit")
    os.environ["STATS_DIR"] = str(tmp_path)
    try:
        with cluster:
            prefix = cluster.run_id
            before = cluster.link_bytes()
            status = cluster.run([str(script)], timeout_s=180, out=out)
            after = cluster.link_bytes()
    finally:
        del os.environ["STATS_DIR"]
    text = out.getvalue()
    assert status == 0, text
    stats = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("stats-*.json"))]
    assert len(stats) == 4, text
    for node in (0, 1):
        counted = sum(s["per_link"]["inter-node"]["bytes_sent"] for s in stats
                      if s["node"] == str(node))
        wire = after[node].tx_bytes - before[node].tx_bytes
        # The wire also carries TCP/IP headers, the handshake and the rendezvous store.
        assert counted > 0, text
        assert 0.9 * wire <= counted <= wire, (node, counted, wire)
    # Ranks of one node also talked to each other, and that never touched the link.
    assert all(s["per_link"]["intra-node"]["bytes_sent"] > 0 for s in stats), text
    assert _namespaces(prefix) == []


def test_intra_node_traffic_stays_on_loopback(emucluster: ModuleType, can_make_namespaces: None,
                                              tmp_path: Path) -> None:
    """2 ranks in one node: the allreduce must not touch the node's link."""
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE_SCRIPT)
    out = io.StringIO()
    with emucluster.EmuCluster(nodes=1, procs_per_node=2, rate="1gbit") as cluster:
        before = cluster.link_bytes()
        status = cluster.run([str(script)], timeout_s=150, out=out)
        after = cluster.link_bytes()
    assert status == 0, out.getvalue()
    assert after[0].tx_bytes - before[0].tx_bytes < 1 << 20


def test_cli_sigterm_removes_everything(can_make_namespaces: None, tmp_path: Path) -> None:
    script = tmp_path / "sleep.py"
    script.write_text(SLEEP_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(BENCH / "emucluster.py"), "--nodes", "2",
                             "--", str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO)
    prefix = f"ncl{proc.pid}"
    try:
        deadline = time.monotonic() + 60
        seen = 0
        assert proc.stdout is not None
        while seen < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen += "started" in line
        assert seen == 2, "the nodes' scripts never started"
        assert len(_namespaces(prefix)) == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert _namespaces(prefix) == []
    leftovers = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""


def test_cleanup_removes_namespaces_of_dead_runs_only(emucluster: ModuleType,
                                                      can_make_namespaces: None) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    crashed = emucluster.EmuCluster(nodes=1, rate="none", run_id=f"ncl{dead.pid}")
    live = emucluster.EmuCluster(nodes=1, rate="none")
    crashed.up()
    live.up()
    try:
        removed = emucluster.cleanup_leftovers(out=io.StringIO())
        assert {f"ncl{dead.pid}n0", f"ncl{dead.pid}sw"} <= set(removed)
        assert len(_namespaces(live.run_id)) == 2
    finally:
        crashed.down()
        live.down()
    assert _namespaces(live.run_id) == []


def test_no_shaping_runs_on_loopback(emucluster: ModuleType, tmp_path: Path) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE_SCRIPT)
    out = io.StringIO()
    with emucluster.EmuCluster(nodes=2, procs_per_node=1, shaping=False) as cluster:
        status = cluster.run([str(script)], timeout_s=150, out=out)
    assert status == 0, out.getvalue()
    assert "group_rank 1 ifname lo node_id 1 OK" in out.getvalue()


def test_without_privileges_it_says_so(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to an unprivileged user")
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE_SCRIPT)
    os.chmod(tmp_path, 0o755)
    proc = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                           sys.executable, str(BENCH / "emucluster.py"), "--nodes", "2", "--",
                           str(script)], capture_output=True, text=True, timeout=60)
    if "setpriv" in proc.stderr and proc.returncode != 2:
        pytest.skip(f"setpriv unavailable: {proc.stderr.strip()}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--no-shaping" in proc.stderr and "CAP_NET_ADMIN" in proc.stderr
