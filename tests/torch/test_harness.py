"""The test harness itself: a broken nanoccl cannot pass as a green (all-skipped) run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from job_runner import HERE


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["CI", "test.sh"])
def test_a_broken_import_fails_the_run(tmp_path: Path, how: str) -> None:
    """With `import nanoccl` failing, the torch suite must end with an error naming the
    failure (exit != 0), not skip every test."""
    # A finder ahead of every other (the editable install's hook included) that fails the
    # import, as a broken or missing extension would.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class Broken:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'nanoccl' or name.startswith('nanoccl.'):\n"
        "            raise ImportError('deliberately broken for this test')\n"
        "        return None\n"
        "sys.meta_path.insert(0, Broken())\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env.pop("CI", None)
    env.pop("NANOCCL_TEST_REQUIRE_IMPORT", None)
    if how == "CI":
        env["CI"] = "true"
    else:
        env["NANOCCL_TEST_REQUIRE_IMPORT"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           str(HERE / "test_backend.py"), "-k", "ddp"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100,
                          cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "deliberately broken for this test" in out, out
    # Without either setting, the same run skips (a developer's machine without the build).
    env.pop("CI", None)
    env.pop("NANOCCL_TEST_REQUIRE_IMPORT", None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100,
                          cwd=tmp_path)
    assert proc.returncode == 0 and "skipped" in proc.stdout, proc.stdout + proc.stderr
