"""Every code block of README.md and docs/*.md, run or checked as its tag says.

Each fenced block must sit right under a tag, so that a new block cannot go untested:

- ``<!-- snippet: torchrun N -->``: a Python program, run as written under
  ``torchrun --standalone --nproc-per-node N`` on loopback (CPU, nanoccl as built);
- ``<!-- snippet: bash -->``: run as written with bash from the repository root, ``.venv/bin``
  first on PATH and a fresh HOME;
- ``<!-- snippet: check (why) -->``: what cannot run here (root for the emulated cluster's
  namespaces, a second host, a build, hours): bash parses it, every script it names exists, and
  every ``--flag`` given to a tool of this repository is one that tool's ``--help`` lists;
- ``<!-- snippet: output -->``: what a command prints, or a listing: not run;
- the README's real-cluster block: run on the emulated cluster by test_real_cluster_readme.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

from bench_helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TAG = re.compile(r"<!-- snippet: (torchrun \d+|bash|check \([^)]*\)|output) -->")
REAL_CLUSTER = "<!-- real-cluster:begin"


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int
    kind: str  # "torchrun N", "bash", "check", "output", "real-cluster"
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def snippets() -> list[Snippet]:
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("```") or lines[i] == "```" and _closing(lines, i):
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j] == "```")
            above = "\n".join(lines[max(0, i - 3):i])
            tag = TAG.search(lines[i - 1]) if i else None
            if REAL_CLUSTER in above:
                kind = "real-cluster"
            elif tag:
                kind = tag.group(1).split(" (")[0]
            else:
                kind = "untagged"
            found.append(Snippet(page, i + 1, kind, "\n".join(lines[i + 1:end]) + "\n"))
            i = end + 1
    return found


def _closing(lines: list[str], i: int) -> bool:
    """Whether the bare ``` at line i closes a block (an odd count of fences above it)."""
    return sum(1 for line in lines[:i] if line.startswith("```")) % 2 == 1


ALL = snippets()


def _ids(kind: str) -> list[Snippet]:
    return [s for s in ALL if s.kind.startswith(kind)]


def test_every_block_is_tagged() -> None:
    untagged = [s.name for s in ALL if s.kind == "untagged"]
    assert not untagged, ("blocks without a <!-- snippet: ... --> tag on the line above: "
                          f"{untagged}")
    assert _ids("torchrun") and _ids("bash") and _ids("check")


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NANOCCL_", "GLOO_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    venv_bin = str(Path(sys.executable).parent)
    env.update(HOME=str(home), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PATH=venv_bin + os.pathsep + env.get("PATH", ""))
    return env


@pytest.mark.timeout(300)
@pytest.mark.parametrize("snippet", _ids("torchrun"), ids=lambda s: s.name)
def test_python_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    nproc = snippet.kind.split()[1]
    program = tmp_path / "example.py"
    program.write_text(snippet.code)
    env = _env(tmp_path)
    env.update(NANOCCL_SOCKET_IFNAME="lo", GLOO_SOCKET_IFNAME="lo")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", nproc, "--max-restarts", "0", str(program)],
                          capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"{snippet.name}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("snippet", _ids("bash"), ids=lambda s: s.name)
def test_bash_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", snippet.code], capture_output=True,
                          text=True, timeout=240, env=_env(tmp_path), cwd=REPO)
    assert proc.returncode == 0, f"{snippet.name}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


# Commands of other programs that a checked block may use as they are.
FOREIGN = {"source", "export", "cd", "pip", "git", "openssl", "scp", "chmod", "ip", "head",
           "echo", "ls"}


@lru_cache(maxsize=None)
def _help(tool: tuple[str, ...]) -> str:
    proc = subprocess.run([*tool, "--help"], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env=_env(Path("/tmp")))
    assert proc.returncode == 0, f"{' '.join(tool)} --help failed:\n{proc.stderr[-2000:]}"
    return proc.stdout


def _check_flags(tool: tuple[str, ...], args: list[str], where: str) -> None:
    text = _help(tool)
    for arg in args:
        if arg.startswith("--") and len(arg) > 2:
            flag = arg.split("=")[0]
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), (
                f"{where}: {' '.join(tool)} has no {flag} (not in its --help)")


def _check_command(words: list[str], where: str) -> None:
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words = words[1:]  # VAR=value before the command
    if not words or words[0] in FOREIGN or "..." in words:
        return
    cmd, args = words[0], words[1:]
    if cmd.startswith("nanoccl-"):
        _check_flags((sys.executable, "-m", f"nanoccl.{cmd[len('nanoccl-'):]}"), args, where)
    elif cmd == "torchrun":
        # torchrun's own options, then the program: -m module or a script, and its options
        for i, arg in enumerate(args):
            if arg == "-m":
                _check_flags((sys.executable, "-m", args[i + 1]), args[i + 2:], where)
                return
            if arg.endswith(".py"):
                _check_script([arg, *args[i + 1:]], where)
                return
        raise AssertionError(f"{where}: torchrun without a program")
    elif cmd in ("python", "python3"):
        if args[:1] == ["-c"]:
            return
        if args[:1] == ["-m"]:
            _check_flags((sys.executable, "-m", args[1]), args[2:], where)
        else:
            _check_script(args, where)
    elif cmd.endswith(".sh"):
        assert (REPO / cmd).is_file(), f"{where}: no {cmd} in the repository"
    else:
        raise AssertionError(f"{where}: the test does not know how to check {cmd!r}; "
                             "add it to FOREIGN if it is another program")


# Programs the pages name as the reader's own, not the repository's.
USERS_SCRIPTS = {"example.py", "train.py"}


def _check_script(args: list[str], where: str) -> None:
    script, rest = args[0], args[1:]
    if script in USERS_SCRIPTS:
        return
    assert (REPO / script).is_file(), f"{where}: no {script} in the repository"
    if "--" in rest:  # bench/emucluster.py [options] -- SCRIPT [ARGS]
        cut = rest.index("--")
        _check_flags((sys.executable, script), rest[:cut], where)
        _check_script(rest[cut + 1:], where)
    else:
        _check_flags((sys.executable, script), rest, where)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("snippet", _ids("check"), ids=lambda s: s.name)
def test_checked_snippet_parses_and_names_real_flags(snippet: Snippet) -> None:
    parsed = subprocess.run(["bash", "-n"], input=snippet.code, capture_output=True, text=True)
    assert parsed.returncode == 0, f"{snippet.name}: {parsed.stderr}"
    joined = re.sub(r"\\\n\s*", " ", snippet.code)
    for n, line in enumerate(joined.splitlines()):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token in (";", "&&", "||", "|", "&"):
                _check_command(words, f"{snippet.name} (command {n + 1})")
                words = []
            else:
                words.append(token)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_every_link_between_the_pages_leads_somewhere() -> None:
    broken = []
    for page in [*PAGES, *sorted(REPO.glob("results/*/*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, broken


INLINE_COMMAND = re.compile(r"(nanoccl-(perf|tune|advise)|python3? (-m )?\S+|torchrun|"
                            r"scripts/\S+\.sh|bench/\S+\.sh)\b")


def test_commands_inline_in_the_prose_name_real_scripts_and_flags() -> None:
    """`nanoccl-tune --show`, `scripts/ab.sh --quick` and the like in the text: checked as the
    ``check`` blocks are (a bare program name is not a command)."""
    for page in PAGES:
        prose = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for span in re.findall(r"`([^`\n]+)`", prose):
            words = shlex.split(span)
            if INLINE_COMMAND.match(span) and len(words) > 1:
                _check_command(words, f"{page.relative_to(REPO)}: `{span}`")
