"""README "On a real cluster": its command block, run as written on the emulated cluster.

Each node of a 2 x 2 EmuCluster (one network namespace per node, unshaped links to keep the
test short) runs the block between the `real-cluster:begin` and `real-cluster:end` markers as
one bash script, with only its placeholders filled in (NODE0, IFNAME, NODE_RANK), from the
repository root, with none of the NANOCCL_/GLOO_ settings the emulator itself would set.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from types import ModuleType

import pytest

from bench_helpers import REPO

BEGIN, END = "<!-- real-cluster:begin", "<!-- real-cluster:end -->"


def readme_block() -> str:
    text = (REPO / "README.md").read_text()
    assert BEGIN in text and END in text, "README lost its real-cluster block markers"
    block = text[text.index(BEGIN):text.index(END)]
    match = re.search(r"```bash\n(.*?)```", block, re.S)
    assert match, "no ```bash block between the real-cluster markers"
    return match.group(1)


def fill(block: str, node0: str, ifname: str, node_rank: int) -> str:
    for name, value in (("NODE0", node0), ("IFNAME", ifname), ("NODE_RANK", str(node_rank))):
        block = re.sub(rf"\b{name}\b", value, block)
    return block


def test_the_block_has_placeholders_only_where_meant() -> None:
    filled = fill(readme_block(), "10.0.0.1", "eth7", 1)
    assert "NANOCCL_SOCKET_IFNAME=eth7" in filled and "GLOO_SOCKET_IFNAME=eth7" in filled
    assert "--node-rank 1 --master-addr 10.0.0.1" in filled
    assert not re.search(r"\b(NODE0|IFNAME|NODE_RANK)\b", filled)


@pytest.mark.timeout(900)
def test_the_readme_commands_run_on_the_emulated_cluster(emucluster: ModuleType,
                                                         can_make_namespaces: None,
                                                         tmp_path: Path) -> None:
    if not (REPO / ".venv" / "bin" / "activate").is_file():
        pytest.fail("the block sources .venv/bin/activate: run scripts/setup.sh first")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NANOCCL_", "GLOO_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                         "VIRTUAL_ENV")}
    env.update(HOME=str(tmp_path), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cluster = emucluster.EmuCluster(nodes=2, procs_per_node=2, rate="none")
    logs = []
    with cluster:
        node0 = cluster.node_list[0].address
        procs = []
        for node in cluster.node_list:
            script = tmp_path / f"node{node.index}.sh"
            script.write_text("set -euo pipefail\n" + fill(readme_block(), node0, node.ifname,
                                                           node.index))
            log = (tmp_path / f"node{node.index}.log").open("w+")
            logs.append(log)
            procs.append(cluster.popen(node, ["bash", str(script)], env=env, cwd=REPO,
                                       stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 840
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.2)
        cluster.stop_all()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    for node, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"node {node}:\n{out[-4000:]}"
    first = outputs[0]
    # nanoccl.tune: the profile table, saved where the next job's auto finds it.
    assert "# link profile: 2x2" in first and "inter-node" in first
    assert (tmp_path / ".cache" / "nanoccl" / "link_profile.txt").is_file()
    # nanoccl.perf twice, against Gloo: every size up to 256 MB, results checked.
    assert first.count("nanoccl-perf") >= 2 or first.count("avg busbw") >= 2, first[-4000:]
    assert re.search(r"^\s*268435456\s", first, re.M), first[-4000:]
    assert "#   model: nanoccl+auto" in first
