"""Processes of the emulated cluster (bench/emucluster.py builds on it).

Turning termination signals into exceptions while a cluster is up, a free local port,
pumping a launch's output with a per-node prefix, waiting for a set of launches, stopping a
process group (SIGTERM, then SIGKILL), and the two ends of the TCP goodput stream that
``emucluster.py netcheck`` runs inside the nodes. emucluster.py re-exports every name, so
``emucluster.<name>`` keeps working.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import TextIO

STOP_GRACE_S = 10.0


class _SignalsToExceptions:
    """Turns SIGTERM/SIGHUP into SystemExit and SIGINT into KeyboardInterrupt, so
    that finally blocks tear the cluster down."""

    def __init__(self) -> None:
        self._saved: dict[int, object] = {}

    def __enter__(self) -> "_SignalsToExceptions":
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._saved[sig] = signal.signal(sig, self._raise)
        # Also when started in the background, where the shell ignores SIGINT.
        self._saved[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
        return self

    @staticmethod
    def _raise(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._saved.clear()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pump(proc: subprocess.Popen[bytes], prefix: str, out: TextIO, lock: threading.Lock) -> None:
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            out.write(prefix + line + "\n")
            out.flush()


def _wait_all(procs: list[subprocess.Popen[bytes]], timeout_s: float, fail_grace_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    first_failure: int | None = None
    failed_at = 0.0
    while True:
        codes = [p.poll() for p in procs]
        for code in codes:
            if code not in (None, 0) and first_failure is None:
                first_failure = code
                failed_at = time.monotonic()
        if all(c is not None for c in codes):
            return first_failure or 0
        now = time.monotonic()
        if first_failure is not None and now - failed_at > fail_grace_s:
            return first_failure
        if now > deadline:
            print(f"emucluster: timed out after {timeout_s:.0f}s, stopping", file=sys.stderr)
            return 124
        time.sleep(0.05)


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to the process group of `proc` (started with start_new_session), SIGKILL after
    `grace_s`."""
    if proc.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


# ------------------------------------------------------ goodput stream helper
def _stream_server(port: int, timeout: float) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", port))
        listener.listen(1)
        listener.settimeout(timeout)
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(timeout)
            buf = bytearray(1 << 20)
            total = 0
            first = last = start = 0.0
            while True:
                n = conn.recv_into(buf)
                if n == 0:
                    break
                now = time.perf_counter()
                # The first 0.5 s hold the connection's ramp-up; measure the steady state.
                if first == 0.0:
                    first = now
                if now - first < 0.5:
                    start = now
                    continue
                total += n
                last = now
    seconds = max(last - start, 1e-9) if total else 0.0
    print(json.dumps({"bytes": total, "seconds": seconds,
                      "mbit_s": total * 8 / seconds / 1e6 if seconds else 0.0}), flush=True)
    return 0


def _stream_client(host: str, port: int, seconds: float) -> int:
    deadline = time.monotonic() + 10.0
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=5.0)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with sock:
        payload = b"\x5a" * (1 << 20)
        end = time.monotonic() + seconds + 0.5
        while time.monotonic() < end:
            sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
    return 0
