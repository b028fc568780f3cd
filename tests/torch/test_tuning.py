"""nanoccl-tune and nanoccl.link_profile() (README "Tuning"): ranks as processes on loopback,
two emulated nodes (NANOCCL_NODE_ID per rank)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from job_runner import free_port

TUNE = [sys.executable, "-m", "nanoccl.tune"]


def run_ranks(argv: list[str], node_ids: list[str], timeout: float = 120.0,
              env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess[str]]:
    """argv on len(node_ids) rank processes (env:// rendezvous); rank r on node node_ids[r]."""
    port = free_port()
    procs = []
    for rank, node in enumerate(node_ids):
        rank_env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                        RANK=str(rank), WORLD_SIZE=str(len(node_ids)), NANOCCL_NODE_ID=node,
                        NANOCCL_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                        **(env or {}))
        procs.append(subprocess.Popen(argv, env=rank_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out.append(subprocess.CompletedProcess(argv, p.returncode, stdout, stderr))
    return out


@pytest.mark.timeout(180)
def test_nanoccl_tune_measures_saves_and_shows(tmp_path: Path) -> None:
    path = tmp_path / "profile.txt"
    results = run_ranks([*TUNE, "--file", str(path)], ["a", "a", "b", "b"])
    for r in results:
        assert r.returncode == 0, r.stdout + r.stderr
    table = results[0].stdout
    assert "# link profile: 2x2 (nodes x ranks per node) over tcp" in table, table
    assert f"# saved to {path} by rank 0" in table
    for row in ("inter-node", "intra-node", "float32 reduce", "int8", "bf16"):
        assert row in table, table
    assert results[1].stdout == ""  # only rank 0 prints
    text = path.read_text()
    assert "shape 2x2" in text and "inter alpha_us" in text and "intra alpha_us" in text

    shown = subprocess.run([*TUNE, "--show", "--file", str(path)], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    # The same table, read back from the file.
    assert shown.stdout.splitlines()[:-1] == table.splitlines()[:-1]
    assert shown.stdout.splitlines()[-1] == f"# from {path}"

    # A group with NANOCCL_TUNING=cached takes that file as it is: no new measurement.
    probe = ("import datetime, torch.distributed as dist, nanoccl\n"
             "dist.init_process_group('nanoccl', timeout=datetime.timedelta(seconds=60))\n"
             "p = nanoccl.link_profile()\n"
             "print('PROFILE', p['measured'], p['shape'], p['inter']['alpha_us'] > 0)\n"
             "dist.destroy_process_group()\n")
    measured = [ln for ln in text.splitlines() if ln.startswith("measured ")][0].split()[1]
    cached = run_ranks([sys.executable, "-c", probe], ["a", "a", "b", "b"],
                       env={"NANOCCL_TUNING": "cached", "NANOCCL_TUNING_FILE": str(path)})
    for r in cached:
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"PROFILE {measured} 2x2 True" in r.stdout, r.stdout


@pytest.mark.timeout(60)
def test_show_says_what_is_wrong_with_the_file(tmp_path: Path) -> None:
    missing = subprocess.run([*TUNE, "--show", "--file", str(tmp_path / "none.txt")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1
    assert "no link profile at" in missing.stderr and "torchrun" in missing.stderr

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"version 1\nshape 2x2\n\x00\xffgarbage 3\n")
    broken = subprocess.run([*TUNE, "--show", "--file", str(bad)], capture_output=True,
                            text=True, timeout=60)
    assert broken.returncode == 1
    assert f"{bad}:3: unknown record" in broken.stderr, broken.stderr


@pytest.mark.timeout(60)
def test_tune_needs_several_ranks(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run([*TUNE, "--file", str(tmp_path / "p.txt")], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 2
    assert "run it with at least 2 ranks" in r.stderr
    assert not (tmp_path / "p.txt").exists()
