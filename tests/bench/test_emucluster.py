"""The emulated nano-cluster: shaping parameters, a real 2-node gloo allreduce across
the shaped links, several rails per node (a bridge, subnet and rate each), and that
nothing is left behind (also after SIGTERM and crashes).

The namespace tests skip, with the reason, where namespaces cannot be made
(not root / no CAP_NET_ADMIN / no iproute2).
"""

from __future__ import annotations

import io
import json
import os
import re
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


# ----------------------------------------------------------------------------------- rails
def _root_links() -> set[str]:
    proc = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, timeout=30)
    return {link["ifname"] for link in json.loads(proc.stdout or "[]")}


def _json(argv: list[str]) -> list[dict]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    return json.loads(proc.stdout or "[]")


def test_rails_subnets_rates_and_env(emucluster: ModuleType) -> None:
    cluster = emucluster.EmuCluster(nodes=2, rails=3, subnet="10.9.7",
                                    rail_rates=["1gbit", "100mbit", "none"])
    assert cluster.rail_subnets == ["10.9.7", "10.9.8", "10.9.9"]
    assert cluster.rail_rate_bits == [10**9, 10**8, None]
    assert cluster.rate_bits == 10**9  # rail 0's
    assert cluster.tbf_params(1)["rate_bit"] == pytest.approx(cluster.tbf_params()["rate_bit"] / 10)
    # Without --rail-rates every rail runs at --rate.
    assert emucluster.EmuCluster(rails=2, rate="100mbit").rail_rate_bits == [10**8, 10**8]
    assert emucluster.EmuCluster(rails=1).rail_subnets == ["10.77.0"]

    one = emucluster.Node(0, "ns", "eth0", "10.77.0.1")
    assert one.ifnames == ("eth0",) and one.addresses == ("10.77.0.1",)
    two = emucluster.Node(0, "ns", "eth0", "10.77.0.1", ("eth0", "eth1"),
                          ("10.77.0.1", "10.77.1.1"))
    assert cluster.node_env(one)["NANOCCL_SOCKET_IFNAME"] == "eth0"
    assert cluster.node_env(one)["GLOO_SOCKET_IFNAME"] == "eth0"
    assert cluster.node_env(two)["NANOCCL_SOCKET_IFNAME"] == "eth0,eth1"
    assert cluster.node_env(two)["GLOO_SOCKET_IFNAME"] == "eth0,eth1"
    # The rails' rates as a real NIC reports them, for nanoccl's stripes; not where one is
    # unshaped (a veth's own 10000 would be as wrong) or there is one rail.
    assert "NANOCCL_RAIL_MBPS" not in cluster.node_env(two)
    shaped = emucluster.EmuCluster(nodes=2, rails=2, rail_rates=["1gbit", "100mbit"])
    assert shaped.node_env(two)["NANOCCL_RAIL_MBPS"] == "1000,100"
    assert "NANOCCL_RAIL_MBPS" not in emucluster.EmuCluster(nodes=2).node_env(one)


def test_rails_describe_each_rail(emucluster: ModuleType,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    cluster = emucluster.EmuCluster(nodes=2, rails=2, rail_rates=["1gbit", "100mbit"])
    emucluster._describe(cluster)
    line = capsys.readouterr().out
    assert "rail 0 eth0 10.77.0.0/24: links 1gbit each way" in line, line
    assert "rail 1 eth1 10.77.1.0/24: links 100mbit each way" in line, line


def test_link_bytes_sums_the_rails(emucluster: ModuleType,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    stats = emucluster.LinkStats
    cluster = emucluster.EmuCluster(nodes=2, rails=2)
    monkeypatch.setattr(cluster, "rail_bytes", lambda: {
        (0, 0): stats(10, 20, 1, 2), (0, 1): stats(100, 200, 10, 20),
        (1, 0): stats(1, 2, 3, 4), (1, 1): stats(0, 0, 0, 0)})
    assert cluster.link_bytes() == {0: stats(110, 220, 11, 22), 1: stats(1, 2, 3, 4)}


@pytest.mark.parametrize("argv, message", [
    (["--rails", "2", "--rail-rates", "1gbit"], "give one rate per rail"),
    (["--rails", "2", "--rail-rates", "1gbit,100mbit,10mbit"], "give one rate per rail"),
    (["--rail-rates", "1gbit,100mbit"], "for --rails 1"),
    (["--rails", "2", "--rail-rates", "1gbit,fast"], "bad rate 'fast'"),
    (["--rails", "2", "--rail-rates", "1gbit,"], "empty rate"),
    (["--rails", "0"], "argument --rails"),
    (["--rails", "two"], "argument --rails"),
    (["--rails", "3", "--subnet", "10.77.254"], "> 255"),
    (["--rails", "2", "--no-shaping"], "--no-shaping has none"),
])
def test_rails_cli_rejects_bad_combinations(emucluster: ModuleType,
                                            capsys: pytest.CaptureFixture[str],
                                            argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        emucluster.main(argv + ["--", "script.py"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_rails_constructor_rejects_bad_combinations(emucluster: ModuleType) -> None:
    with pytest.raises(ValueError, match="no links to multiply"):
        emucluster.EmuCluster(rails=2, shaping=False)
    with pytest.raises(ValueError, match="one rate per rail"):
        emucluster.EmuCluster(rails=2, rail_rates=["1gbit"])
    with pytest.raises(ValueError, match="bad rate"):
        emucluster.EmuCluster(rails=2, rail_rates=["1gbit", "fast"])
    with pytest.raises(ValueError, match="255"):
        emucluster.EmuCluster(rails=2, subnet="10.77.255")
    with pytest.raises(ValueError):
        emucluster.EmuCluster(rails=0)


def test_rails_build_a_shaped_network_per_rail(emucluster: ModuleType,
                                               can_make_namespaces: None) -> None:
    """2 nodes x 2 rails: eth0 and eth1 on their own bridge and subnet, each tbf-shaped both
    ways; a stream to node 0's rail-1 address crosses eth1 at rail 1's rate, not eth0."""
    root_links = _root_links()
    cluster = emucluster.EmuCluster(nodes=2, rails=2, rail_rates=["1gbit", "100mbit"])
    with cluster:
        prefix = cluster.run_id
        assert sorted(_namespaces(prefix)) == sorted(
            [f"{prefix}n0", f"{prefix}n1", f"{prefix}sw"])
        sw = cluster.switch_ns
        for node in cluster.node_list:
            i = node.index
            assert (node.ifname, node.address) == ("eth0", f"10.77.0.{i + 1}")
            assert node.ifnames == ("eth0", "eth1")
            assert node.addresses == (f"10.77.0.{i + 1}", f"10.77.1.{i + 1}")
            addrs = {link["ifname"]: [f"{a['local']}/{a['prefixlen']}"
                                      for a in link["addr_info"] if a["family"] == "inet"]
                     for link in _json(["ip", "-n", node.netns, "-j", "addr", "show"])}
            assert addrs["eth0"] == [f"10.77.0.{i + 1}/24"]
            assert addrs["eth1"] == [f"10.77.1.{i + 1}/24"]
            env = cluster.node_env(node)
            assert env["NANOCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0,eth1"
            # Each link shaped both ways: the node's end and the switch port towards it.
            for netns, devs in ((node.netns, ("eth0", "eth1")), (sw, (f"n{i}", f"n{i}r1"))):
                qdiscs = {q["dev"]: q for q in _json(["tc", "-n", netns, "-j", "qdisc", "show"])}
                for rail, dev in enumerate(devs):
                    assert qdiscs[dev]["kind"] == "tbf", (netns, dev, qdiscs)
                    rate = qdiscs[dev]["options"]["rate"]
                    assert rate == pytest.approx(cluster.tbf_params(rail)["rate_bit"] / 8,
                                                 rel=0.01), (netns, dev, rate)
        masters = {link["ifname"]: link.get("master")
                   for link in _json(["ip", "-n", sw, "-j", "link", "show"])}
        assert masters["n0"] == masters["n1"] == "br0"
        assert masters["n0r1"] == masters["n1r1"] == "br1"

        before = cluster.rail_bytes()
        goodput = cluster.netcheck(seconds=1.5, both_directions=False, rail=1)
        after = cluster.rail_bytes()
        sent = {rail: after[(1, rail)].tx_bytes - before[(1, rail)].tx_bytes for rail in (0, 1)}
        received = {rail: after[(0, rail)].rx_bytes - before[(0, rail)].rx_bytes
                    for rail in (0, 1)}
        assert sent[1] >= 1 << 20 and received[1] >= 1 << 20, (sent, received)
        assert sent[0] < sent[1] / 100 and received[0] < received[1] / 100, (sent, received)
        # The stream went through rail 1's 100 Mbit/s shaper (rail 0 would allow ~940 Mbit/s);
        # a busy machine may make it slower, never faster.
        assert goodput["n1->n0"] <= 100, goodput
        link = cluster.link_bytes()
        assert link[1].tx_bytes >= after[(1, 0)].tx_bytes + after[(1, 1)].tx_bytes
    assert _namespaces(prefix) == []
    assert not (Path("/etc/netns") / f"{prefix}n0").exists()
    assert _root_links() <= root_links  # no veth or bridge left in the root namespace


def test_rails_cli_runs_gloo_over_both_rails(emucluster: ModuleType, can_make_namespaces: None,
                                             tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE_SCRIPT)
    status = emucluster.main(["--nodes", "2", "--rails", "2", "--rail-rates", "1gbit,500mbit",
                              "--timeout", "150", "--", str(script)])
    text = capsys.readouterr().out
    assert status == 0, text
    assert "rail 1 eth1 10.77.1.0/24: links 500mbit each way" in text, text
    assert "[n1] rank 1 group_rank 1 ifname eth0,eth1" in text, text
    lines = re.findall(r"emucluster: n(\d) (eth\d) sent ([\d.]+) MB, received ([\d.]+) MB", text)
    assert sorted((n, ifname) for n, ifname, _, _ in lines) == [
        ("0", "eth0"), ("0", "eth1"), ("1", "eth0"), ("1", "eth1")], text
    for node in "01":
        sent = sum(float(mb) for n, _, mb, _ in lines if n == node)
        assert sent * 1e6 >= 0.95 * (16 << 20), text
    run_id = re.search(r"(ncl\d+(?:_\d+)?)n0=", text)
    assert run_id, text
    assert _namespaces(run_id.group(1)) == []


def test_cleanup_removes_every_rail(emucluster: ModuleType, can_make_namespaces: None) -> None:
    root_links = _root_links()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    crashed = emucluster.EmuCluster(nodes=2, rails=2, rate="none", run_id=f"ncl{dead.pid}")
    crashed.up()
    try:
        removed = emucluster.cleanup_leftovers(out=io.StringIO())
        assert {f"ncl{dead.pid}n0", f"ncl{dead.pid}n1", f"ncl{dead.pid}sw"} <= set(removed)
    finally:
        crashed.down()
    assert _namespaces(f"ncl{dead.pid}") == []
    assert _root_links() <= root_links
