"""The job secret out of band and encryption in transit, through torch.distributed.

Correctness with both on (every collective and dtype against Gloo, DDP), and every setup
mistake failing on every rank within the timeout, naming what is wrong.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from job_runner import HERE, run_job

JOBS = HERE / "security_jobs.py"


def secret_file(directory: Path, name: str = "secret", content: str = "", mode: int = 0o600) -> Path:
    path = directory / name
    path.write_text((content or os.urandom(32).hex()) + "\n")
    path.chmod(mode)
    return path


@pytest.mark.timeout(150)
def test_collectives_match_gloo_encrypted_with_a_secret_file(tmp_path: Path) -> None:
    """2 nodes x 2 ranks: every collective, dtype and reduction, hierarchical too."""
    # Encryption is the tcp transport's (the fabric one refuses it): pinned, whatever the
    # environment running the suite chose.
    env = {"NANOCCL_SECRET_FILE": str(secret_file(tmp_path)), "NANOCCL_ENCRYPT": "1",
           "NANOCCL_TRANSPORT": "tcp"}
    rank_env = {r: {"NANOCCL_NODE_ID": f"node{r // 2}"} for r in range(4)}
    job = run_job("collectives", 4, timeout=140, env=env, rank_env=rank_env)
    results = job.assert_ok()
    assert all(r["checks"] > 100 for r in results), [r["checks"] for r in results]
    for r in results:
        assert r["stats"]["per_link"]["inter-node"]["bytes_sent"] > 0, r["stats"]


@pytest.mark.timeout(100)
def test_ddp_matches_gloo_encrypted(tmp_path: Path) -> None:
    env = {"NANOCCL_SECRET_FILE": str(secret_file(tmp_path)), "NANOCCL_ENCRYPT": "1",
           "NANOCCL_TRANSPORT": "tcp"}
    job = run_job("ddp", 2, timeout=90, env=env)
    results = job.assert_ok()
    assert results[0]["max_param_diff"] <= 1e-4


def _setup_case(tmp_path: Path, case: str) -> tuple[dict[int, dict[str, str]], list[str]]:
    """Per-rank environments of a 2-rank job that must fail at setup, and what the errors
    must name."""
    if case == "loose-permissions":
        loose = str(secret_file(tmp_path, mode=0o644))
        return {0: {"NANOCCL_SECRET_FILE": loose}, 1: {"NANOCCL_SECRET_FILE": loose}}, [
            "mode 0644", "chmod 600"]
    if case == "encryption-differs":
        return ({0: {"NANOCCL_TRANSPORT": "tcp"},
                 1: {"NANOCCL_ENCRYPT": "1", "NANOCCL_TRANSPORT": "tcp"}},
                ["encrypt=1", "encrypt=0"])
    if case == "only-one-rank-has-the-file":
        return {0: {}, 1: {"NANOCCL_SECRET_FILE": str(secret_file(tmp_path))}}, [
            "NANOCCL_SECRET_FILE"]
    if case == "different-secrets":
        a = str(secret_file(tmp_path, "a"))
        b = str(secret_file(tmp_path, "b"))
        return {0: {"NANOCCL_SECRET_FILE": a}, 1: {"NANOCCL_SECRET_FILE": b}}, ["secret"]
    raise ValueError(case)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["loose-permissions", "encryption-differs",
                                  "only-one-rank-has-the-file", "different-secrets"])
def test_setup_mistakes_fail_on_every_rank(tmp_path: Path, case: str) -> None:
    rank_env, expected = _setup_case(tmp_path, case)
    args = [x for text in expected for x in ("--expect", text)]
    job = run_job("setup_fails", 2, timeout=50, pg_timeout=8, rank_env=rank_env, args=args,
                  script=JOBS)
    results = job.assert_ok()
    for r in results:
        assert "error" in r, r
