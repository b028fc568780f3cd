"""The emulated cluster's network plumbing (bench/emucluster.py builds on it).

Rates in tc syntax and the rail names (eth<k>, br<k>), the ``ip``/``tc`` runner and its
errors (EmuClusterError, NoPrivilegeError), the per-run network namespaces (listing them,
deleting one with what runs inside, cleaning up those of crashed runs), and the Node and
LinkStats records. emucluster.py re-exports every name, so ``emucluster.<name>`` keeps
working.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, TextIO

PREFIX = "ncl"
NODE_IFNAME = "eth0"  # rail 0; rail k is eth<k> (rail_ifname)
BRIDGE_NAME = "br0"   # rail 0; rail k is br<k> (rail_bridge)
IP_TIMEOUT_S = 30.0
# `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc/*: the nodes get a
# hosts file naming each other, so c10d's reverse lookups of peers succeed.
NETNS_ETC = Path("/etc/netns")

_NS_PATTERN = re.compile(rf"^{PREFIX}(\d+)(?:_\d+)?(?:n\d+|sw)$")


class EmuClusterError(RuntimeError):
    """A step of building, running or tearing down the cluster failed."""


class NoPrivilegeError(EmuClusterError):
    """Namespaces, veths or qdiscs cannot be made here (not root / no CAP_NET_ADMIN)."""


_UNITS = {
    "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
    "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9,
}


def parse_rate(text: str) -> int | None:
    """Returns bits per second for tc-style rates ('1gbit', '100mbit', '2.5gbit').

    'none', 'off' and '0' mean unshaped and give None.
    """
    value = text.strip().lower()
    if value in ("none", "off", "0", ""):
        return None
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", value)
    if not match or match.group(2) not in _UNITS | {"": 1}:
        raise ValueError(f"bad rate {text!r}: use e.g. 1gbit, 100mbit, 10gbit")
    unit = _UNITS.get(match.group(2), 1)
    bits = int(float(match.group(1)) * unit)
    if bits < 8000:
        raise ValueError(f"rate {text!r} is too low")
    return bits


def parse_rail_rates(text: str) -> list[str]:
    """Splits a comma-separated --rail-rates value, checking every rate (ValueError if bad)."""
    rates = [part.strip() for part in text.split(",")]
    for rate in rates:
        if not rate:
            raise ValueError(f"empty rate in {text!r}: give one rate per rail, e.g. 1gbit,100mbit")
        parse_rate(rate)
    return rates


def rail_ifname(rail: int) -> str:
    """A node's interface on rail: eth0 (NODE_IFNAME), eth1, ..."""
    return NODE_IFNAME if rail == 0 else f"eth{rail}"


def rail_bridge(rail: int) -> str:
    """Rail's bridge in the switch namespace: br0 (BRIDGE_NAME), br1, ..."""
    return BRIDGE_NAME if rail == 0 else f"br{rail}"


def format_rate(bits: int) -> str:
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits >= scale:
            return f"{bits / scale:g}{unit}"
    return f"{bits}bit"


def _run_cmd(argv: Sequence[str], check: bool = True,
             timeout: float = IP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise EmuClusterError(f"{argv[0]} not found (install iproute2)") from exc
    except subprocess.TimeoutExpired as exc:
        raise EmuClusterError(f"timed out after {timeout:.0f}s: {' '.join(argv)}") from exc
    if check and proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip()
        if "Operation not permitted" in message or "Permission denied" in message:
            raise NoPrivilegeError(f"{' '.join(argv)}: {message}")
        raise EmuClusterError(f"{' '.join(argv)} failed ({proc.returncode}): {message}")
    return proc


def list_namespaces() -> list[str]:
    """Names of all named network namespaces (ip netns list)."""
    if shutil.which("ip") is None:
        return []
    proc = _run_cmd(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        # A killed run whose parent has not reaped it yet is a zombie: gone.
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _kill_namespace_pids(netns: str) -> None:
    """SIGTERM, then SIGKILL, whatever still runs inside netns."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc = _run_cmd(["ip", "netns", "pids", netns], check=False)
        pids = [int(p) for p in proc.stdout.split() if p.isdigit() and int(p) != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
            time.sleep(0.05)


def delete_namespace(netns: str) -> None:
    """Kills what runs inside netns, then deletes it (its veth ends go with it)."""
    _kill_namespace_pids(netns)
    _run_cmd(["ip", "netns", "del", netns], check=False)
    etc = NETNS_ETC / netns
    if etc.is_dir():
        shutil.rmtree(etc, ignore_errors=True)
        with contextlib.suppress(OSError):
            NETNS_ETC.rmdir()  # only when no other namespace keeps files there


def cleanup_leftovers(force: bool = False, out: TextIO = sys.stdout) -> list[str]:
    """Deletes ncl* namespaces whose creating process is gone (all of them with force)."""
    removed = []
    # Switch namespaces last: node namespaces hold the other veth ends.
    for netns in sorted(list_namespaces(), key=lambda n: n.endswith("sw")):
        match = _NS_PATTERN.match(netns)
        if not match:
            continue
        owner = int(match.group(1))
        if not force and _pid_alive(owner):
            print(f"keeping {netns}: its run (pid {owner}) is still alive (--force removes it)",
                  file=out)
            continue
        delete_namespace(netns)
        removed.append(netns)
    return removed


@dataclass(frozen=True)
class Node:
    index: int
    netns: str | None  # None: the host namespace (--no-shaping)
    ifname: str   # rail 0's interface
    address: str  # rail 0's address: the node's name, torchrun's master address
    ifnames: tuple[str, ...] = ()    # every rail's interface, rail 0 first
    addresses: tuple[str, ...] = ()  # every rail's address, in the same order

    def __post_init__(self) -> None:
        if not self.ifnames:
            object.__setattr__(self, "ifnames", (self.ifname,))
        if not self.addresses:
            object.__setattr__(self, "addresses", (self.address,))


@dataclass
class LinkStats:
    tx_bytes: int
    rx_bytes: int
    tx_packets: int
    rx_packets: int
