"""Rank programs of the security tests (test_security.py), on job_harness.py's harness.

    python security_jobs.py setup_fails --rank R --world-size N ... --expect TEXT [--expect ..]

The settings under test (NANOCCL_SECRET_FILE, NANOCCL_ENCRYPT, ...) come from each rank's
environment; the test sets them per rank.
"""

from __future__ import annotations

import argparse
import time

import torch.distributed as dist

import job_harness
from job_harness import Checks, init


def scenario_setup_fails(a: argparse.Namespace, ck: Checks) -> None:
    """Creating a nanoccl group fails on this rank, in time, naming every --expect text."""
    init(a, "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from nanoccl import _C

    store = dist.PrefixStore("security/", dist.distributed_c10d._get_default_store())
    start = time.monotonic()
    try:
        _C.create_backend(store, rank, world, int(a.pg_timeout * 1000), "security", [], {})
    except Exception as exc:  # noqa: BLE001 - the error is what is checked
        message = str(exc)
        ck.data["error"] = message[:2000]
        for text in a.expect:
            ck.expect(f"names {text!r}", text in message, message[:1500])
    else:
        ck.fail("setup", "the nanoccl group was created")
    elapsed = time.monotonic() - start
    ck.data["elapsed"] = elapsed
    ck.expect("within the timeout", elapsed < a.pg_timeout + 5, f"{elapsed:.1f} s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expect", action="append", default=[])


if __name__ == "__main__":
    raise SystemExit(job_harness.main({"setup_fails": scenario_setup_fails}, add_arguments))
