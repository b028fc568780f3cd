#!/usr/bin/env python3
"""What an eavesdropper on a node's link sees during a nanoccl job.

Builds the emulated cluster (bench/emucluster.py), captures every packet on node 0's link
with tcpdump while a nanoccl job broadcasts, gathers and reduces a known byte pattern, then
searches the capture for the job secret and for any 256-byte run of the pattern.

    python bench/capture.py --encrypt      # NANOCCL_SECRET_FILE + NANOCCL_ENCRYPT=1:
                                           # expects neither secret nor payload in the capture
    python bench/capture.py --no-encrypt   # the same job in plaintext: expects the payload
                                           # (shows that the capture sees the traffic)

Both modes check the job's results. Exit 0 when everything is as expected. Needs root (network
namespaces) and tcpdump. Options: --nodes, --procs-per-node, --rate, --bytes, --json PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN_LENGTH = 256  # a payload run this long in the capture counts as plaintext seen
PERIOD = 251      # the pattern: byte i is (i * STEP + OFFSET) % PERIOD
STEP = 37
OFFSET = 11


def pattern(n: int) -> bytes:
    return bytes((i * STEP + OFFSET) % PERIOD for i in range(n))


def longest_pattern_run(data: bytes) -> int:
    """The longest run of consecutive pattern bytes anywhere in `data` (any phase)."""
    import numpy as np

    c = np.frombuffer(data, dtype=np.uint8).astype(np.int16)
    if c.size < 2:
        return int(c.size)
    ok = ((c[1:] - c[:-1]) % PERIOD == STEP) & (c[1:] < PERIOD) & (c[:-1] < PERIOD)
    if not ok.any():
        return 1
    # Lengths of runs of True: positions where the run breaks.
    padded = np.concatenate(([False], ok, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    runs = edges[1::2] - edges[::2]
    return int(runs.max()) + 1


# ----------------------------------------------------------------------------- rank program
def rank_program(nbytes: int) -> int:
    """Broadcasts, gathers and all-reduces the pattern through nanoccl; checks every result."""
    import torch
    import torch.distributed as dist

    import nanoccl  # noqa: F401 - registers the backend

    dist.init_process_group("nanoccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    want = torch.frombuffer(bytearray(pattern(nbytes)), dtype=torch.uint8)
    ok = True
    t = want.clone() if rank == 0 else torch.zeros(nbytes, dtype=torch.uint8)
    dist.broadcast(t, src=0)
    ok &= torch.equal(t, want)
    gathered = [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(gathered, want)
    ok &= all(torch.equal(g, want) for g in gathered)
    x = torch.full((nbytes // 4,), float(rank + 1))
    dist.all_reduce(x)
    ok &= bool((x == world * (world + 1) / 2).all())
    dist.barrier()
    print(f"rank {rank}: results {'correct' if ok else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


# ------------------------------------------------------------------------------------ driver
def capture(args: argparse.Namespace) -> dict[str, object]:
    sys.path.insert(0, str(HERE))
    import emucluster

    if shutil.which("tcpdump") is None:
        raise SystemExit("capture: tcpdump not found (apt-get install tcpdump)")
    work = Path(tempfile.mkdtemp(prefix="nanoccl-capture-"))
    secret = os.urandom(32).hex()
    secret_path = work / "secret"
    secret_path.write_text(secret + "\n")
    secret_path.chmod(0o600)
    pcap = work / "node0.pcap"
    env = {"NANOCCL_SECRET_FILE": str(secret_path),
           "NANOCCL_ENCRYPT": "1" if args.encrypt else "0"}
    cluster = emucluster.EmuCluster(nodes=args.nodes, procs_per_node=args.procs_per_node,
                                     rate=args.rate)
    with cluster:
        node = cluster.node_list[0]
        dump = cluster.popen(node, ["tcpdump", "-i", node.ifname, "-s", "0", "-U", "-B",
                                    "65536", "-w", str(pcap)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while not pcap.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # tcpdump has opened its socket once the file exists
        status = cluster.run([str(Path(__file__).resolve()), "--rank-program", "--bytes",
                              str(args.bytes)], timeout_s=args.timeout, env=env)
        time.sleep(0.5)
        dump.send_signal(signal.SIGINT)
        try:
            _, err = dump.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            dump.kill()
            _, err = dump.communicate()
    data = pcap.read_bytes() if pcap.exists() else b""
    stats = (err or b"").decode(errors="replace").strip().splitlines()
    report = {
        "encrypt": args.encrypt,
        "job_status": status,
        "capture_bytes": len(data),
        "tcpdump": [s for s in stats if "packets" in s],
        "secret_found": secret.encode() in data or bytes.fromhex(secret) in data,
        "longest_payload_run": longest_pattern_run(data),
        "pattern_bytes_per_rank": args.bytes,
    }
    shutil.rmtree(work, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--encrypt", dest="encrypt", action="store_true", default=True)
    mode.add_argument("--no-encrypt", dest="encrypt", action="store_false")
    p.add_argument("--rank-program", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--procs-per-node", type=int, default=2)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--bytes", type=int, default=4 << 20, help="pattern bytes per rank")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", default=None, help="write the report here")
    args = p.parse_args(argv)
    if args.rank_program:
        return rank_program(args.bytes)
    report = capture(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    mode_text = "encrypted" if args.encrypt else "plaintext"
    print(f"capture ({mode_text}): {report['capture_bytes']} bytes of node 0's traffic; "
          f"job exit {report['job_status']}; secret in capture: {report['secret_found']}; "
          f"longest run of the payload pattern: {report['longest_payload_run']} bytes; "
          + "; ".join(report["tcpdump"]))  # type: ignore[arg-type]
    payload_seen = int(report["longest_payload_run"]) >= RUN_LENGTH  # type: ignore[arg-type]
    good = report["job_status"] == 0 and not report["secret_found"] and (
        payload_seen != args.encrypt)
    print(f"capture: {'as expected' if good else 'NOT as expected'} "
          f"({'no' if args.encrypt else 'a'} {RUN_LENGTH}-byte run of the payload expected)")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
