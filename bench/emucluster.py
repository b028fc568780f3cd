#!/usr/bin/env python3
"""The emulated nano-cluster: N nodes as network namespaces on one machine.

Each node is a network namespace with loopback and one veth ("eth0") that
plugs into a Linux bridge living in a switch namespace. Both ends of every
veth are shaped with tc tbf, so a node's upload (egress of its eth0) and
download (egress of the switch port towards it) are each limited to the
line rate, like a full-duplex Ethernet link. Ranks within a node talk over
that node's loopback (the kernel routes a node's own address through lo);
ranks in different nodes cross two shaped links and the bridge.

With ``--rails R`` every node has R such links, eth0..eth<R-1>, and rail k is
a network of its own, as real rails are: its own bridge (br<k>) in the switch
namespace and its own subnet, the third octet of --subnet plus k (10.77.0.x,
10.77.1.x, ...). Each rail runs at --rate, or at its entry of --rail-rates
(e.g. ``--rails 2 --rail-rates 1gbit,100mbit``). Rail 0 is the one a
single-rail cluster has: the nodes' names, torchrun's master address and
netcheck use it; GLOO_SOCKET_IFNAME and NANOCCL_SOCKET_IFNAME list every rail
("eth0,eth1"), so both backends can spread their connections over all of them,
and NANOCCL_RAIL_MBPS gives nanoccl each rail's rate, as /sys/class/net/<if>/speed
gives it on a real NIC (a veth reports 10000 whatever tbf makes of it).

Everything lives in namespaces this tool creates, named after a per-run id
(``ncl<pid>`` + ``n<i>`` / ``sw``), with addresses in 10.77.0.0/24 (one /24 per
rail) that exist only inside them. Nothing is added to the root namespace, and
deleting the namespaces removes every bridge and veth.

CLI::

    python bench/emucluster.py --nodes 2 --procs-per-node 2 --rate 1gbit -- script.py [args]
    python bench/emucluster.py --nodes 2 --rails 2 --rail-rates 1gbit,100mbit -- script.py
    python bench/emucluster.py netcheck --nodes 2 --rate 1gbit   # TCP goodput per link
    python bench/emucluster.py cleanup                            # leftovers of crashed runs

Python::

    with EmuCluster(nodes=2, procs_per_node=2, rate="1gbit") as cluster:
        rc = cluster.run(["bench/ab_ddp.py", "--steps", "40"])
        print(cluster.link_bytes())   # per node, all rails together
        print(cluster.rail_bytes())   # per (node, rail)

Without the privileges namespaces need (root or CAP_NET_ADMIN), ``up()``
raises NoPrivilegeError and the CLI says so; ``--no-shaping`` runs the same
launch (N torchrun agents, --nnodes N) on the host's loopback instead, with
NANOCCL_NODE_ID set per node (a single rail only: there are no links to
multiply).

The code: emucluster_net.py (rates, rail names, the ip/tc runner, the namespaces and
their clean-up, Node, LinkStats) and emucluster_procs.py (signals, launching, waiting
for and stopping processes, the goodput stream of netcheck). This file keeps EmuCluster
and the command line, and re-exports the moved names: ``emucluster.<name>`` works for
all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Sequence, TextIO

# Moved names, re-exported: emucluster.<name> and `from emucluster import ...` keep working.
from emucluster_net import (  # noqa: F401
    BRIDGE_NAME, IP_TIMEOUT_S, NETNS_ETC, NODE_IFNAME, PREFIX, _NS_PATTERN, _UNITS,
    EmuClusterError, LinkStats, Node, NoPrivilegeError, _kill_namespace_pids, _pid_alive,
    _run_cmd, cleanup_leftovers, delete_namespace, format_rate, list_namespaces, parse_rail_rates,
    parse_rate, rail_bridge, rail_ifname)
from emucluster_procs import (  # noqa: F401
    STOP_GRACE_S, _SignalsToExceptions, _free_port, _pump, _stream_client, _stream_server,
    _wait_all, stop_process_group)

DEFAULT_SUBNET = "10.77.0"
DEFAULT_RATE = "1gbit"
DEFAULT_MASTER_PORT = 29500
# Bytes on the wire per Ethernet frame that tbf never sees: preamble + SFD (8),
# FCS (4) and inter-frame gap (12). tbf counts from the destination MAC on.
ETH_WIRE_OVERHEAD = 24
# tbf sees whole GSO super-packets (up to 64 KiB + headers) on a veth; a
# bucket smaller than that would make tbf split every one of them in software.
MIN_BURST_BYTES = 128 * 1024
DEFAULT_LATENCY_MS = 20.0

_instances = 0
_instances_lock = threading.Lock()


@dataclass
class EmuCluster:
    """N emulated nodes; use as a context manager (up on enter, down on exit).

    Not thread-safe: one thread builds, runs and tears down a cluster.
    """

    nodes: int = 2
    procs_per_node: int = 1
    rate: str = DEFAULT_RATE
    shaping: bool = True  # False: no namespaces, everything on the host loopback
    subnet: str = DEFAULT_SUBNET  # rail 0's; rail k adds k to the third octet
    rails: int = 1  # links per node, each on its own bridge and subnet
    rail_rates: Sequence[str] | None = None  # one rate per rail; None: every rail at rate
    latency_ms: float = DEFAULT_LATENCY_MS
    burst_bytes: int | None = None
    wire_overhead: int = ETH_WIRE_OVERHEAD
    mtu: int = 1500
    verbose: bool = False
    run_id: str = ""
    node_list: list[Node] = field(default_factory=list, init=False)
    _created: list[str] = field(default_factory=list, init=False)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, init=False)
    _signals: _SignalsToExceptions = field(default_factory=_SignalsToExceptions, init=False)
    _jobs: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        global _instances
        if self.nodes < 1 or self.procs_per_node < 1:
            raise ValueError("nodes and procs_per_node must be >= 1")
        if self.nodes > 250:
            raise ValueError("at most 250 nodes fit the /24")
        if self.rails < 1:
            raise ValueError("rails must be >= 1")
        if self.rails > 1 and not self.shaping:
            raise ValueError(f"{self.rails} rails need the emulated links: without shaping "
                             "every node is the host loopback, there are no links to multiply")
        if self.rail_rates is not None:
            self.rail_rates = list(self.rail_rates)
            if len(self.rail_rates) != self.rails:
                raise ValueError(f"{len(self.rail_rates)} rail rate(s) "
                                 f"({','.join(self.rail_rates)}) for {self.rails} rail(s): "
                                 "give one rate per rail")
        # Rail k's line rate (None: unshaped); rate_bits is rail 0's.
        self.rail_rate_bits = [parse_rate(r) for r in (self.rail_rates or [self.rate] * self.rails)]
        self.rate_bits = self.rail_rate_bits[0]
        self.rail_subnets = [self._rail_subnet(k) for k in range(self.rails)]
        if not self.run_id:
            with _instances_lock:
                k = _instances
                _instances += 1
            self.run_id = f"{PREFIX}{os.getpid()}" + (f"_{k}" if k else "")

    def _rail_subnet(self, rail: int) -> str:
        """The first three octets of rail's /24: --subnet with rail added to its third octet."""
        if rail == 0:
            return self.subnet
        parts = self.subnet.split(".")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"subnet {self.subnet!r}: give the first three octets, e.g. 10.77.0")
        third = int(parts[2]) + rail
        if third > 255:
            raise ValueError(f"subnet {self.subnet} with {self.rails} rails needs the third octet "
                             f"up to {int(parts[2]) + self.rails - 1} (> 255): pick a lower one")
        return f"{parts[0]}.{parts[1]}.{third}"

    # ----------------------------------------------------------------- set-up
    @property
    def switch_ns(self) -> str:
        return f"{self.run_id}sw"

    def tbf_params(self, rail: int = 0) -> dict[str, int | float]:
        """The tbf rate, burst and limit applied to each direction of each link of rail.

        The rate is lowered by the Ethernet framing tbf does not count
        (24 bytes per full frame), so that '1gbit' gives the TCP goodput of a
        real 1 GbE port (~941 Mbit/s with MTU 1500) rather than ~956.
        """
        rate_bits = self.rail_rate_bits[rail]
        assert rate_bits is not None
        frame = self.mtu + 14
        tbf_rate = int(rate_bits * frame / (frame + self.wire_overhead))
        burst = self.burst_bytes or max(MIN_BURST_BYTES, tbf_rate // 8 // 1000)  # >= 1 ms
        limit = int(tbf_rate / 8 * self.latency_ms / 1000) + burst
        return {"rate_bit": tbf_rate, "burst": burst, "limit": limit,
                "latency_ms": self.latency_ms}

    def _ip(self, *args: str, netns: str | None = None) -> None:
        argv = ["ip"] + (["-n", netns] if netns else []) + list(args)
        if self.verbose:
            print("+", " ".join(argv), file=sys.stderr)
        _run_cmd(argv)

    def _shape(self, netns: str, dev: str, rail: int) -> None:
        params = self.tbf_params(rail)
        argv = ["tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", "tbf",
                "rate", f"{params['rate_bit']}bit", "burst", str(params["burst"]),
                "limit", str(params["limit"])]
        if self.verbose:
            print("+", " ".join(argv), file=sys.stderr)
        _run_cmd(argv)

    def _add_netns(self, name: str) -> None:
        _run_cmd(["ip", "netns", "add", name])
        self._created.append(name)

    def up(self) -> "EmuCluster":
        """Builds the namespaces, bridge and shaped links; raises (after undoing) on failure."""
        if not self.shaping:
            self.node_list = [Node(i, None, "lo", "127.0.0.1") for i in range(self.nodes)]
            return self
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise EmuClusterError(f"'{tool}' not found: install iproute2, or use --no-shaping")
        if os.geteuid() != 0:
            # CAP_NET_ADMIN alone may still work; the first 'ip netns add' tells.
            pass
        try:
            self._add_netns(self.switch_ns)
            self._ip("link", "set", "lo", "up", netns=self.switch_ns)
            for rail in range(self.rails):
                self._ip("link", "add", rail_bridge(rail), "type", "bridge", netns=self.switch_ns)
                self._ip("link", "set", rail_bridge(rail), "up", netns=self.switch_ns)
            for i in range(self.nodes):
                node_ns = f"{self.run_id}n{i}"
                self._add_netns(node_ns)
                self._ip("link", "set", "lo", "up", netns=node_ns)
                addresses = [f"{subnet}.{i + 1}" for subnet in self.rail_subnets]
                for rail, address in enumerate(addresses):
                    self._add_link(node_ns, i, rail, address)
                ifnames = tuple(rail_ifname(k) for k in range(self.rails))
                self.node_list.append(Node(i, node_ns, NODE_IFNAME, addresses[0],
                                           ifnames, tuple(addresses)))
            self._write_hosts()
            self._wait_links_up()
        except BaseException:
            self.down()
            raise
        return self

    def _add_link(self, node_ns: str, index: int, rail: int, address: str) -> None:
        """Node index's link on rail: a veth from its namespace to the rail's bridge."""
        ifname, bridge = rail_ifname(rail), rail_bridge(rail)
        port = f"n{index}" if rail == 0 else f"n{index}r{rail}"
        self._ip("link", "add", port, "mtu", str(self.mtu), "type", "veth",
                 "peer", "name", ifname, "mtu", str(self.mtu), "netns", node_ns,
                 netns=self.switch_ns)
        self._ip("link", "set", port, "master", bridge, netns=self.switch_ns)
        self._ip("link", "set", port, "up", netns=self.switch_ns)
        self._ip("addr", "add", f"{address}/24", "dev", ifname, netns=node_ns)
        self._ip("link", "set", ifname, "up", netns=node_ns)
        if self.rail_rate_bits[rail] is not None:
            self._shape(node_ns, ifname, rail)          # the node's upload
            self._shape(self.switch_ns, port, rail)     # the node's download

    def _write_hosts(self) -> None:
        try:
            base = Path("/etc/hosts").read_text()
        except OSError:
            base = "127.0.0.1 localhost\n"
        # c10d's store listens dual-stack, so peers show up as v4-mapped IPv6 too.
        names = "::1 localhost ip6-localhost\n::ffff:127.0.0.1 localhost\n" + "".join(
            f"{n.address} {n.netns} node{n.index}\n::ffff:{n.address} {n.netns} node{n.index}\n"
            for n in self.node_list)
        # The other rails' addresses get names of their own (node0-rail1), so that the
        # node names keep resolving to rail 0 alone and reverse lookups still succeed.
        names += "".join(
            f"{address} node{n.index}-rail{rail}\n::ffff:{address} node{n.index}-rail{rail}\n"
            for n in self.node_list for rail, address in enumerate(n.addresses) if rail > 0)
        for node in self.node_list:
            assert node.netns is not None
            try:
                (NETNS_ETC / node.netns).mkdir(parents=True, exist_ok=True)
                (NETNS_ETC / node.netns / "hosts").write_text(
                    base.rstrip("\n") + "\n# emucluster nodes\n" + names)
            except OSError:
                return  # cosmetic only: c10d then warns that it cannot name peers

    def _wait_links_up(self) -> None:
        """The bridges forward only after their ports leave the listening state."""
        deadline = time.monotonic() + 15.0
        pending = [rail_bridge(rail) for rail in range(self.rails)]
        while time.monotonic() < deadline:
            proc = _run_cmd(["ip", "-n", self.switch_ns, "-j", "link", "show",
                             "master", pending[0]], check=False)
            try:
                links = json.loads(proc.stdout or "[]")
            except json.JSONDecodeError:
                links = []
            if len(links) == self.nodes and all(
                    "LOWER_UP" in link.get("flags", []) for link in links):
                pending.pop(0)
                if not pending:
                    return
                continue
            time.sleep(0.05)
        raise EmuClusterError(f"ports of bridge {pending[0]} did not come up within 15 s")

    def down(self) -> None:
        """Stops every process of this cluster and deletes what up() created. Idempotent."""
        self.stop_all()
        for netns in reversed(self._created):
            delete_namespace(netns)
        self._created.clear()
        self.node_list = []

    def __enter__(self) -> "EmuCluster":
        self._signals.__enter__()
        try:
            return self.up()
        except BaseException:
            self._signals.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.down()
        finally:
            self._signals.__exit__(exc_type, exc, tb)

    # ---------------------------------------------------------------- running
    def node_env(self, node: Node, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        # torchrun's own default (it sets 1 for every worker), minus its banner.
        env.setdefault("OMP_NUM_THREADS", "1")
        if node.netns is not None:
            # Several rails: every one of them ("eth0,eth1"); both backends take such a list.
            env["GLOO_SOCKET_IFNAME"] = ",".join(node.ifnames)
            env["NANOCCL_SOCKET_IFNAME"] = ",".join(node.ifnames)
            if self.rails > 1 and all(bits is not None for bits in self.rail_rate_bits):
                # What /sys/class/net/<if>/speed says of a real NIC of that rate (a veth
                # reports 10000 whatever tbf does to it): nanoccl splits stripes by it.
                env["NANOCCL_RAIL_MBPS"] = ",".join(
                    str(max(1, round(bits / 1e6))) for bits in self.rail_rate_bits)
        else:
            # One host stands in for all nodes: say which node each rank is on.
            env["NANOCCL_NODE_ID"] = str(node.index)
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
            env.setdefault("NANOCCL_SOCKET_IFNAME", "lo")
        env.update(extra or {})
        return env

    def in_node(self, node: Node, argv: Sequence[str]) -> list[str]:
        """argv prefixed so that it runs inside node's namespace."""
        if node.netns is None:
            return list(argv)
        return ["ip", "netns", "exec", node.netns] + list(argv)

    def torchrun_argv(self, node: Node, script_argv: Sequence[str], master_port: int) -> list[str]:
        master = self.node_list[0].address
        return [sys.executable, "-m", "torch.distributed.run",
                "--nnodes", str(self.nodes), "--nproc-per-node", str(self.procs_per_node),
                "--node-rank", str(node.index), "--master-addr", master,
                "--master-port", str(master_port), "--max-restarts", "0",
                *script_argv]

    def popen(self, node: Node, argv: Sequence[str], env: dict[str, str] | None = None,
              **kwargs: object) -> subprocess.Popen[bytes]:
        """Starts argv inside node (its own session, so it can be stopped as a group)."""
        proc = subprocess.Popen(self.in_node(node, argv), env=env or self.node_env(node),
                                start_new_session=True, **kwargs)  # type: ignore[call-overload]
        self._procs.append(proc)
        return proc

    def run(self, script_argv: Sequence[str], timeout_s: float = 3600.0,
            env: dict[str, str] | None = None, out: TextIO | None = None,
            fail_grace_s: float = 30.0) -> int:
        """Runs torchrun in every node and streams its output prefixed with the node.

        Returns 0 when every node succeeded, else the first non-zero exit status
        (124 on timeout). After one node fails, the others get fail_grace_s to
        notice before they are stopped.
        """
        if not self.node_list:
            raise EmuClusterError("cluster is not up")
        out = out or sys.stdout
        master_port = DEFAULT_MASTER_PORT + self._jobs if self.shaping else _free_port()
        self._jobs += 1
        lock = threading.Lock()
        procs: list[subprocess.Popen[bytes]] = []
        readers: list[threading.Thread] = []
        try:
            for node in self.node_list:
                proc = self.popen(node, self.torchrun_argv(node, script_argv, master_port),
                                  env=self.node_env(node, env), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
                procs.append(proc)
                reader = threading.Thread(target=_pump, args=(proc, f"[n{node.index}] ", out, lock),
                                          daemon=True)
                reader.start()
                readers.append(reader)
            status = _wait_all(procs, timeout_s, fail_grace_s)
        finally:
            for proc in procs:
                stop_process_group(proc)
            for reader in readers:
                reader.join(timeout=5.0)
            for proc in procs:
                if proc in self._procs:
                    self._procs.remove(proc)
        return status

    def stop_all(self) -> None:
        for proc in list(self._procs):
            stop_process_group(proc)
        self._procs.clear()
        for node in self.node_list:
            if node.netns is not None:
                _kill_namespace_pids(node.netns)

    # ----------------------------------------------------------- measurements
    def link_bytes(self) -> dict[int, LinkStats]:
        """Byte and packet counters of each node's links (what crossed the emulated wire).

        With several rails these are the sums over all of a node's rails (eth0 + eth1 + ...),
        so that "what a job sent between the nodes" stays whole; rail_bytes() has them
        per rail. With one rail: the counters of eth0. Empty without shaping.
        """
        stats: dict[int, LinkStats] = {}
        for (index, _), rail in self.rail_bytes().items():
            total = stats.setdefault(index, LinkStats(0, 0, 0, 0))
            total.tx_bytes += rail.tx_bytes
            total.rx_bytes += rail.rx_bytes
            total.tx_packets += rail.tx_packets
            total.rx_packets += rail.rx_packets
        return stats

    def rail_bytes(self) -> dict[tuple[int, int], LinkStats]:
        """Byte and packet counters of each link, keyed (node index, rail)."""
        stats: dict[tuple[int, int], LinkStats] = {}
        for node in self.node_list:
            if node.netns is None:
                continue
            proc = _run_cmd(["ip", "-n", node.netns, "-s", "-j", "link", "show"])
            links = {link["ifname"]: link["stats64"] for link in json.loads(proc.stdout)}
            for rail, ifname in enumerate(node.ifnames):
                entry = links[ifname]
                stats[(node.index, rail)] = LinkStats(
                    entry["tx"]["bytes"], entry["rx"]["bytes"],
                    entry["tx"]["packets"], entry["rx"]["packets"])
        return stats

    def netcheck(self, seconds: float = 3.0, both_directions: bool = True,
                 port: int = 5201, rail: int = 0) -> dict[str, float]:
        """TCP goodput (Mbit/s) between node 1 and node 0 over rail, with a Python socket stream."""
        if self.nodes < 2 or not self.shaping:
            raise EmuClusterError("netcheck needs >= 2 namespaced nodes")
        if not 0 <= rail < self.rails:
            raise EmuClusterError(f"no rail {rail}: the cluster has {self.rails}")
        a, b = self.node_list[0], self.node_list[1]
        pairs = [(b, a)] + ([(a, b)] if both_directions else [])
        servers = [self.popen(dst, [sys.executable, __file__, "_stream-server", "--port", str(port),
                                    "--timeout", str(seconds + 20)],
                              stdout=subprocess.PIPE) for _, dst in pairs]
        clients = [self.popen(src, [sys.executable, __file__, "_stream-client", "--host",
                                    dst.addresses[rail], "--port", str(port),
                                    "--seconds", str(seconds)])
                   for src, dst in pairs]
        results: dict[str, float] = {}
        try:
            for proc in clients:
                proc.wait(timeout=seconds + 30)
            for (src, dst), proc in zip(pairs, servers):
                stdout, _ = proc.communicate(timeout=30)
                report = json.loads(stdout.decode().strip().splitlines()[-1])
                results[f"n{src.index}->n{dst.index}"] = report["mbit_s"]
        finally:
            for proc in servers + clients:
                stop_process_group(proc)
                if proc in self._procs:
                    self._procs.remove(proc)
        return results


# -------------------------------------------------------------------- the CLI
NO_PRIVILEGE_HELP = """\
emucluster: cannot create network namespaces here ({reason}).
The emulated cluster needs root or CAP_NET_ADMIN (ip netns add, veth, bridge, tc tbf).
Run as root (sudo -E env PATH=$PATH ...), or add --no-shaping to run the same launch
(N torchrun agents, --nnodes N, NANOCCL_NODE_ID per node) on this host's loopback,
without any rate limit."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def _rail_rates_arg(text: str) -> list[str]:
    try:
        return parse_rail_rates(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="emucluster.py",
        description="Run a torchrun job on N emulated nodes (network namespaces joined "
                    "by a bridge, each link shaped with tc tbf).",
        usage="%(prog)s [options] -- SCRIPT [ARGS...]\n"
              "       %(prog)s netcheck [options]\n"
              "       %(prog)s cleanup [--force]")
    parser.add_argument("--nodes", type=int, default=2, help="number of nodes (default 2)")
    parser.add_argument("--procs-per-node", "--nproc-per-node", type=int, default=1,
                        dest="procs_per_node", help="ranks per node (default 1)")
    parser.add_argument("--rate", default=DEFAULT_RATE,
                        help="line rate of each node link, tc syntax; 'none' for unshaped "
                             "(default 1gbit)")
    parser.add_argument("--latency-ms", type=float, default=DEFAULT_LATENCY_MS,
                        help="tbf queue length as time at the rate (default 20)")
    parser.add_argument("--burst", type=int, default=None, help="tbf bucket in bytes")
    parser.add_argument("--wire-overhead", type=int, default=ETH_WIRE_OVERHEAD,
                        help="bytes per frame tbf should add for preamble/FCS/IFG (default 24)")
    parser.add_argument("--subnet", default=DEFAULT_SUBNET,
                        help="first 3 octets of rail 0's /24; rail k adds k to the third "
                             "(default 10.77.0)")
    parser.add_argument("--rails", type=_positive_int, default=1,
                        help="links per node (eth0..eth<N-1>), each rail on its own bridge "
                             "and subnet (default 1)")
    parser.add_argument("--rail-rates", type=_rail_rates_arg, default=None,
                        metavar="RATE[,RATE...]",
                        help="line rate of each rail, tc syntax, one per rail (e.g. "
                             "1gbit,100mbit); default: every rail at --rate")
    parser.add_argument("--no-shaping", action="store_true",
                        help="no namespaces: N torchrun agents on the host loopback")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds (default 3600)")
    parser.add_argument("--verbose", "-v", action="store_true", help="print every ip/tc command")
    parser.add_argument("--seconds", type=float, default=3.0, help="netcheck: stream duration")
    parser.add_argument("--force", action="store_true",
                        help="cleanup: also namespaces of live runs")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in and args_in[0] == "_stream-server":
        hidden = argparse.ArgumentParser()
        hidden.add_argument("--port", type=int)
        hidden.add_argument("--timeout", type=float)
        h = hidden.parse_args(args_in[1:])
        return _stream_server(h.port, h.timeout)
    if args_in and args_in[0] == "_stream-client":
        hidden = argparse.ArgumentParser()
        hidden.add_argument("--host")
        hidden.add_argument("--port", type=int)
        hidden.add_argument("--seconds", type=float)
        h = hidden.parse_args(args_in[1:])
        return _stream_client(h.host, h.port, h.seconds)

    command = "run"
    if args_in and args_in[0] in ("run", "netcheck", "cleanup"):
        command = args_in.pop(0)
    script: list[str] = []
    if "--" in args_in:
        split = args_in.index("--")
        args_in, script = args_in[:split], args_in[split + 1:]
    parser = _build_parser()
    args = parser.parse_args(args_in)

    if command == "cleanup":
        removed = cleanup_leftovers(force=args.force)
        listing = (": " + " ".join(removed)) if removed else ""
        print(f"removed {len(removed)} namespace(s){listing}")
        return 0
    if command == "run" and not script:
        parser.error("give the script after '--', e.g. -- bench/ab_ddp.py --steps 20")

    if args.rails > 1 and args.no_shaping:
        parser.error(f"--rails {args.rails} needs the emulated links, and --no-shaping has "
                     "none: every node is the host loopback (drop one of the two)")
    if args.rail_rates is not None and len(args.rail_rates) != args.rails:
        parser.error(f"--rail-rates gives {len(args.rail_rates)} rate(s) for --rails "
                     f"{args.rails}: give one rate per rail")
    try:
        cluster = EmuCluster(nodes=args.nodes, procs_per_node=args.procs_per_node,
                             rate=args.rate, shaping=not args.no_shaping, subnet=args.subnet,
                             rails=args.rails, rail_rates=args.rail_rates,
                             latency_ms=args.latency_ms, burst_bytes=args.burst,
                             wire_overhead=args.wire_overhead, verbose=args.verbose)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        with cluster:
            _describe(cluster)
            if command == "netcheck":
                for rail in range(cluster.rails):
                    where = f" on {rail_ifname(rail)}" if cluster.rails > 1 else ""
                    for direction, mbit in cluster.netcheck(seconds=args.seconds,
                                                            rail=rail).items():
                        print(f"emucluster: TCP goodput {direction}{where}: {mbit:.1f} Mbit/s "
                              "(both directions at once)")
                return 0
            before = cluster.rail_bytes()
            status = cluster.run(script, timeout_s=args.timeout)
            after = cluster.rail_bytes()
            for (index, rail), stats in after.items():
                tx = stats.tx_bytes - before[(index, rail)].tx_bytes
                rx = stats.rx_bytes - before[(index, rail)].rx_bytes
                print(f"emucluster: n{index} {rail_ifname(rail)} sent {tx / 1e6:.1f} MB, "
                      f"received {rx / 1e6:.1f} MB")
            print(f"emucluster: exit status {status}")
            return status
    except NoPrivilegeError as exc:
        print(NO_PRIVILEGE_HELP.format(reason=exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("emucluster: interrupted, cluster removed", file=sys.stderr)
        return 130


def _describe(cluster: EmuCluster) -> None:
    if not cluster.shaping:
        print(f"emucluster: {cluster.nodes} node(s) x {cluster.procs_per_node} rank(s) on the host "
              "loopback, unshaped (--no-shaping)")
        return
    nodes = ", ".join(f"{n.netns}={n.address}" for n in cluster.node_list)
    if cluster.rails == 1:
        print(f"emucluster: {cluster.nodes} node(s) x {cluster.procs_per_node} rank(s): {nodes}; "
              f"bridge in {cluster.switch_ns}; {_describe_shaping(cluster, 0)}")
        return
    rails = "; ".join(
        f"rail {rail} {rail_ifname(rail)} {cluster.rail_subnets[rail]}.0/24: "
        f"{_describe_shaping(cluster, rail)}" for rail in range(cluster.rails))
    print(f"emucluster: {cluster.nodes} node(s) x {cluster.procs_per_node} rank(s): {nodes}; "
          f"{cluster.rails} rails, bridges in {cluster.switch_ns}; {rails}")


def _describe_shaping(cluster: EmuCluster, rail: int) -> str:
    rate_bits = cluster.rail_rate_bits[rail]
    if rate_bits is None:
        return "unshaped links"
    p = cluster.tbf_params(rail)
    return (f"links {format_rate(rate_bits)} each way (tbf rate "
            f"{format_rate(int(p['rate_bit']))}, burst {p['burst']} B, "
            f"limit {p['limit']} B)")


if __name__ == "__main__":
    sys.exit(main())
