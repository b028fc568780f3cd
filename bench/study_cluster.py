"""The study on real nodes (cluster mode, used by bench/study.py).

cluster_commands() prints the torchrun command lines of a plan, node by node;
run_inside() runs this launch's part of the plan under an existing torchrun; collect()
builds runs.csv and the report (bench/study_report.py) from the JSON results in DIR/runs
(``python bench/study.py --collect DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Sequence, TextIO

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for _path in (str(BENCH), str(REPO)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import study_report  # noqa: E402
from study_plan import Baseline, DiLoCoSpec, Plan, Profile, Setup  # noqa: E402
from study_runs import (_LAUNCH_VARS, _load_json, environment,  # noqa: E402
                        record_from_result, train_argv)


def cluster_commands(plan: Plan, args: argparse.Namespace, out: TextIO = sys.stdout) -> None:
    """The commands of a real multi-node study, one block per run, node by node."""
    prof = plan.profile
    out_dir = args.out or "results/study/cluster"
    extra = ["--netif", args.netif] if args.netif else []
    out.write("# nanoccl study on a real cluster: run each block's lines on the node named,\n"
              f"# with this repository at the same path and {out_dir} shared (or copied back).\n"
              "# Then: python bench/study.py --collect " + out_dir + "\n")
    for note in plan.notes:
        out.write(f"# note: {note}\n")
    for base in plan.all_baselines:
        out.write(f"\n# {base.label}: on node 0, {base.concurrency} copies at once "
                  "(one per GPU)\n")
        for copy in range(base.concurrency):
            path = f"{out_dir}/runs/{base.key}_c{copy}.json"
            argv = ["python", "trainers/train.py"] + train_argv(
                base.model, "single", "gloo", base.batch, prof, path, ["--device", "cuda"])
            out.write(f"CUDA_VISIBLE_DEVICES={copy} {shlex.join(argv)} &\n")
        out.write("wait\n")
    for k, run in enumerate(plan.runs):
        path = f"{out_dir}/runs/{run.key}.json"
        out.write(f"\n# {run.label}\n")
        for node in range(run.setup.nodes):
            argv = ["torchrun", "--nnodes", str(run.setup.nodes), "--nproc-per-node",
                    str(run.setup.ppn), "--node-rank", str(node), "--master-addr",
                    args.master_addr, "--master-port", str(args.master_port + k % 100),
                    "trainers/train.py"] + train_argv(run.model, run.strategy, run.backend,
                                                      run.batch, prof, path, extra)
            out.write(f"[node {node}] {shlex.join(argv)}\n")


def run_inside(plan: Plan, args: argparse.Namespace, out_dir: Path) -> int:
    """Under an existing torchrun: every rank runs its single-rank baseline at once (T_1
    under the same sharing), then each run of the plan whose setup matches this launch,
    each with a fresh rendezvous port (rank 0 hosts the store: static rendezvous,
    --master-addr = node 0)."""
    from trainers import train

    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    rank = int(os.environ["RANK"])
    setup = Setup(world // local, local)
    prof = plan.profile
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    device = ["--device", args.device] if args.device else []
    extra = device + (["--netif", args.netif] if args.netif else [])
    port = int(os.environ.get("MASTER_PORT", "29500"))
    saved = {k: os.environ.get(k) for k in _LAUNCH_VARS}
    for rep in range(prof.reps):
        for model in prof.models:
            for batch in sorted({r.batch for r in plan.runs if r.model == model} |
                                {prof.ref_batch[model]}):
                base = Baseline(model, batch, world, rep, setup.name)
                path = out_dir / "runs" / f"{base.key}_c{rank}.json"
                train.main(train_argv(model, "single", "gloo", batch, prof, path,
                                      device + ["--standalone"]))
    mine = [r for r in plan.runs if r.setup == setup]
    for k, run in enumerate(mine):
        os.environ["MASTER_PORT"] = str(port + 1 + k)
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        path = out_dir / "runs" / f"{run.key}.json"
        if rank == 0:
            print(f"study: [{k + 1}/{len(mine)}] {run.label}", flush=True)
        train.main(train_argv(run.model, run.strategy, run.backend, run.batch, prof, path,
                              extra))
    for key, value in saved.items():
        if value is not None:
            os.environ[key] = value
    if rank == 0:
        return collect(out_dir, prof, setups=[setup])
    return 0


def collect(out_dir: Path, prof: Profile | None = None,
            setups: Sequence[Setup] | None = None) -> int:
    """Builds runs.csv and the report from the JSON files in out_dir/runs."""
    records: list[dict[str, Any]] = []
    for path in sorted((out_dir / "runs").glob("*.json")):
        doc = _load_json(path)
        if doc is None or doc.get("kind") != "nanoccl_train_result":
            continue
        name = path.stem
        world = int(doc["world_size"])
        base = {"profile": prof.name if prof else "cluster", "model": doc["model"],
                "strategy": DiLoCoSpec.of_result(doc), "backend": doc["backend"],
                "batch": doc["global_batch"], "world": world, "nodes": doc["nodes"],
                "procs_per_node": doc["procs_per_node"],
                "setup": f"{doc['nodes']}x{doc['procs_per_node']}",
                "rep": int(name.split("_r")[-1].split("_")[0]) if "_r" in name else 0}
        if "_baseline_x" in name:
            tail = name.split("_baseline_x")[1]
            conc = int(tail.split("_")[0])
            for_setup = tail.split("_for")[1].split("_")[0] if "_for" in tail else "1x1"
            base.update(kind="baseline", setup="1x1", backend="-", concurrency=conc,
                        for_setup=for_setup, copy=int(name.rsplit("_c", 1)[1]))
        else:
            base.update(kind="train", concurrency=1, copy=0)
        records.append(record_from_result(doc, base))
    if not records:
        print(f"study: no results in {out_dir / 'runs'}", file=sys.stderr)
        return 1
    study_report.write_runs_csv(out_dir / "runs.csv", records)
    meta_path = out_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    if prof is not None:
        meta.update(profile=prof.name, steps=prof.steps, warmup=prof.warmup, reps=prof.reps,
                    ref_batch=prof.ref_batch)
    meta.setdefault("profile", "cluster")
    meta.setdefault("environment", environment())
    meta.setdefault("cluster", "real nodes" + (
        f" ({', '.join(s.name for s in setups)})" if setups else ""))
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    meta_path.write_text(json.dumps(meta, indent=1))
    report = study_report.build(out_dir)
    print(f"study: wrote {report}")
    return 0
