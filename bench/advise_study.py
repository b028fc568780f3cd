"""nanoccl-advise against the committed study: every row of results/study/full predicted.

    python bench/advise_study.py results/study/full --out results/advise

For each row of the study's summary.csv (model, strategy, backend, setup, global batch), the
advisor (torch_ext/nanoccl/advise.py) predicts the step time and the scaling factor from:
- the emulated cluster's links given by hand: inter-node at the row's emulated rate
  (rate_bits, tbf, each way), the latencies, the intra-node rate and this machine's reduce and
  codec rates from the link profile nanoccl measured on the same emulated cluster
  (results/tuning/grid_2x2_1gbit.json), cpu_share = 2 cores / ranks;
- one device's step on the whole global batch: what the study divides by, T_1 measured while
  n single-rank runs share the machine (summary.csv's t1_shared);
- each strategy's framework time a step (DDP, FSDP2's hooks, DTensor's dispatch), as a
  fraction of the plain step, from results/advise/framework_probe.json: the trainers on one
  rank of this machine (advise.probe_one_rank_steps; `--probe-framework` measures it again),
  times the row's one-device step (so it shares the cores as T_1 did); and in the same way
  the optimizer step's part of that step (advise.probe_step_seconds), which a rank runs as
  the strategy shards the parameters, not as it splits the batch (advise.optimizer_share),
  and the part of forward and backward that does not shrink with the batch (the step at the
  global batch and at a quarter of it), which every rank runs whole;
- the backend: nanoccl as configured; nanoccl+<codec> with that codec (DDP's hook and the
  group's compression); Gloo as nanoccl forced to the flat ring (algo=ring), the closest of
  nanoccl's rows to Gloo's ring allreduce (a stand-in: Gloo is not modelled), but on one
  node of two ranks as Gloo measured over TCP loopback on this machine
  (results/advise/gloo_probe.json, `--probe-gloo`), its calls exposed: the kernel's copies
  run on the cores the ranks compute on, they do not hide under backward.
It writes results/advise/README.md (the table, the relative error of the scaling factor per
row, Spearman's rank correlation per setup), study_predictions.csv and a PNG.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from nanoccl import advise  # noqa: E402
from trainers.backends import parse_backend  # noqa: E402

TUNED_PROFILE = REPO / "results" / "tuning" / "grid_2x2_1gbit.json"
FRAMEWORK_PROBE = REPO / "results" / "advise" / "framework_probe.json"
GLOO_PROBE = REPO / "results" / "advise" / "gloo_probe.json"
PROBE_REPEATS, PROBE_STEPS, PROBE_WARMUP = 3, 16, 4
SMALLEST_SHARE = 4  # the study's largest world: its rank's batch is the probe's small one
MACHINE_CORES = 2


def measured_profile() -> dict[str, Any]:
    """The link profile nanoccl measured on the emulated 2x2 cluster (latencies, intra-node
    rate, reduce and codec rates of this machine), as records."""
    text = json.loads(TUNED_PROFILE.read_text())["meta"]["profile"]
    out: dict[str, Any] = {"text": text}
    for line in text.splitlines():
        tok = line.split()
        if tok[:1] in (["inter"], ["intra"]) and len(tok) >= 7:
            out[tok[0]] = {"alpha_us": float(tok[2]), "pair_MBps": float(tok[4])}
    return out


class GlooStandIn(advise.Predictor):
    """Gloo's calls as nanoccl's flat ring rows (settings algo=ring): the closest rows, not a
    model of Gloo. One difference is taken from the study's link counters: Gloo has no
    reduce-scatter, torch runs FSDP2's as an allreduce (the link bytes of zero2/zero3 with Gloo
    are DP's plus the allgathers'), so reduce-scatters are priced as allreduces. On one node
    of GLOO_RANKS ranks, with `loopback` (probe_gloo's fit per op), a call's time is Gloo's
    measured over TCP loopback instead of nanoccl's over shared memory, and exposed: it is
    the kernel's copying on the cores the ranks compute on, it cannot hide under backward."""

    def __init__(self, cluster: advise.Cluster, profile: str,
                 loopback: dict[str, dict[str, float]] | None = None) -> None:
        super().__init__(cluster, profile, {"algo": "ring"})
        one_node = cluster.nodes == 1 and cluster.per_node == GLOO_RANKS
        self.loopback = loopback if one_node else None

    def price(self, call: advise.Call, codec: str) -> advise.Priced:
        if call.op == "reduce_scatter":
            call = advise.Call("allreduce", call.count, call.phase)
        priced = super().price(call, codec)
        fit = (self.loopback or {}).get(call.op)
        if fit is None or call.group != "world":
            return priced
        seconds = fit["alpha_us"] * 1e-6 + 4.0 * call.count / (fit["MBps"] * 1e6)
        return dataclasses.replace(priced, seconds=seconds, exposed=True)


GLOO_RANKS = 2  # probe_gloo's ranks: the study's one-node setup, 1x2
GLOO_OPS = ("allreduce", "allgather", "broadcast")
GLOO_COUNTS = (4096, 1 << 20)  # fp32 elements: 16 KiB and 4 MiB a buffer


def _gloo_rank(rank: int, port: int, repeats: int, out: str) -> None:
    """One of probe_gloo's ranks: each op at each size, the median of `repeats` calls."""
    import time

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=GLOO_RANKS)
    # all_gather_single where torch has it (2.12+: the *_into_tensor name warns there).
    all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    times: dict[str, list[float]] = {}
    for op in GLOO_OPS:
        for count in GLOO_COUNTS:  # the call's buffer: allgather's is its output
            x = torch.ones(count // GLOO_RANKS if op == "allgather" else count)
            out_buf = torch.empty(count)
            samples = []
            for i in range(repeats + 3):  # 3 warm-up calls
                dist.barrier()
                t = time.perf_counter()
                if op == "allreduce":
                    dist.all_reduce(x)
                elif op == "allgather":
                    all_gather(out_buf, x)
                else:
                    dist.broadcast(x, src=0)
                if i >= 3:
                    samples.append(time.perf_counter() - t)
            times.setdefault(op, []).append(statistics.median(samples))
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def probe_gloo(out: Path, repeats: int = 30, launches: int = 3) -> dict[str, Any]:
    """Gloo's allreduce, allgather and broadcast between GLOO_RANKS processes over TCP
    loopback, each at two buffer sizes, in `launches` fresh pairs of processes (Gloo's
    latency moves from one launch to the next: 0.4 to 1.5 ms for 16 KiB here); per op the
    line through the median times (latency alpha_us, then MBps of the call's buffer),
    written to `out`."""
    import datetime
    import socket
    import tempfile

    import torch.multiprocessing as mp

    runs = []
    for _ in range(launches):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "gloo.json"
            mp.start_processes(_gloo_rank, args=(port, repeats, str(result)),
                               nprocs=GLOO_RANKS, start_method="spawn")
            runs.append(json.loads(result.read_text()))
    fits = {}
    small, large = (4.0 * c for c in GLOO_COUNTS)
    for op in GLOO_OPS:
        t_small, t_large = (statistics.median(r[op][i] for r in runs) for i in range(2))
        mbps = (large - small) / max(t_large - t_small, 1e-9) / 1e6
        fits[op] = {"alpha_us": max(0.0, t_small - small / (mbps * 1e6)) * 1e6, "MBps": mbps,
                    "seconds": [t_small, t_large], "launches": [r[op] for r in runs]}
    doc = {"what": f"Gloo between {GLOO_RANKS} processes over TCP loopback on this machine, one "
                   "thread each: per op and launch the median of the calls at buffers of "
                   f"{small / 1024:g} KiB and {large / 2**20:g} MiB (allgather: its output), "
                   f"and the line through the medians of {launches} launches",
           "command": "python bench/advise_study.py results/study/full --probe-gloo",
           "measured": datetime.datetime.now().isoformat(timespec="seconds"),
           "repeats": repeats, "launches": launches, "ops": fits}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for op, fit in fits.items():
        print(f"gloo {op}: {fit['alpha_us']:.0f} us + buffer / {fit['MBps']:.0f} MB/s")
    return doc


def gloo_text(path: Path = GLOO_PROBE) -> str:
    """probe_gloo's fits in words, for the README."""
    ops = gloo_loopback(path)
    if ops is None:
        return "nanoccl's too (no gloo_probe.json)"
    doc = json.loads(path.read_text())
    return (f"Gloo over TCP loopback measured here (gloo_probe.json, {doc['measured'][:10]}: "
            + ", ".join(f"{op} {f['alpha_us']:.0f} us + buffer / {f['MBps']:.0f} MB/s"
                        for op, f in ops.items()) + ")")


def gloo_loopback(path: Path) -> dict[str, dict[str, float]] | None:
    """probe_gloo's fits by op; None where there is no file."""
    if not path.is_file():
        return None
    return json.loads(path.read_text())["ops"]


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rho (average ranks for ties); nan for fewer than 3 rows."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    if len(a) < 3:
        return math.nan
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else math.nan


def probe_framework(study: Path, out: Path) -> dict[str, Any]:
    """Every (model, batch) of the study on one rank, with each of its strategies the probe
    knows and with none, PROBE_REPEATS times; the median fraction (strategy - plain) / plain
    per strategy, and the optimizer step's and the fixed part's fractions of the plain step
    (advise.probe_step_seconds, in this process on the study's one thread a rank), written
    to `out`."""
    import datetime

    import torch

    torch.set_num_threads(1)  # as the study's ranks (OMP_NUM_THREADS=1)

    wanted: dict[tuple[str, int], set[str]] = defaultdict(set)
    with (study / "summary.csv").open() as f:
        for r in csv.DictReader(f):
            if r["strategy"] in advise.FRAMEWORK_PROBED:
                wanted[(r["model"], int(r["batch"]))].add(r["strategy"])
    entries = []
    for (model, batch), names in sorted(wanted.items()):
        spec = advise.model_spec(model, batch)
        strategies = [s for s in advise.FRAMEWORK_PROBED if s in names]
        runs = [advise.probe_one_rank_steps(spec, strategies, PROBE_STEPS, PROBE_WARMUP)
                for _ in range(PROBE_REPEATS)]
        fractions = {s: statistics.median((r[s] - r["single"]) / r["single"] for r in runs)
                     for s in strategies}
        steps = [advise.probe_step_seconds(spec, PROBE_STEPS, max(1, batch // SMALLEST_SHARE))
                 for _ in range(PROBE_REPEATS)]
        optimizer = statistics.median(p.optimizer_s / p.step_s for p in steps)
        fixed = statistics.median(p.fixed_s / p.step_s for p in steps)
        entries.append({"model": model, "batch": batch, "runs": runs, "fraction": fractions,
                        "step_runs": [dataclasses.asdict(p) for p in steps],
                        "optimizer_fraction": optimizer, "fixed_fraction": fixed})
        print(f"{model} b{batch}: " + ", ".join(f"{s} {v:+.3f}" for s, v in fractions.items())
              + f"; optimizer {optimizer:.3f}, fixed {fixed:.3f} of the step", flush=True)
    doc = {"what": "each strategy's step on one rank (trainers/train.py, backend nanoccl) "
                   "less the plain step, as a fraction of the plain step (median of the "
                   "repeats); runs: the medians of each repeat's timed steps, seconds; "
                   "optimizer_fraction, fixed_fraction: the optimizer step's part of the plain "
                   "step and the part of its forward and backward that does not shrink with the "
                   "batch (through the steps at the batch and at a quarter of it), medians of "
                   "the repeats; step_runs: each repeat's advise.StepProbe, seconds",
           "command": f"python bench/advise_study.py {study} --probe-framework",
           "measured": datetime.datetime.now().isoformat(timespec="seconds"),
           "repeats": PROBE_REPEATS, "steps": PROBE_STEPS, "warmup": PROBE_WARMUP,
           "entries": entries}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def framework_fractions(path: Path) -> dict[tuple[str, int], dict[str, float]]:
    """framework_probe.json's fractions by (model, batch), the optimizer's as "optimizer" and
    the fixed part's as "fixed"; empty where there is no file."""
    if not path.is_file():
        return {}
    doc = json.loads(path.read_text())
    return {(e["model"], int(e["batch"])): {**e["fraction"],
                                             "optimizer": e.get("optimizer_fraction", 0.0),
                                             "fixed": e.get("fixed_fraction", 0.0)}
            for e in doc["entries"]}


def probe_text(path: Path = FRAMEWORK_PROBE) -> str:
    """The probe's fractions in words, for the README; or that there is no probe file."""
    if not path.is_file():
        return "no probe file, so none counted"
    doc = json.loads(path.read_text())
    parts = [f"{e['model']} b{e['batch']} " + ", ".join(f"{s} {v:+.0%}"
                                                     for s, v in e["fraction"].items())
             + f", optimizer {e.get('optimizer_fraction', 0.0):.0%} and fixed "
             f"{e.get('fixed_fraction', 0.0):.0%} of the step"
             for e in doc["entries"]]
    return f"measured {doc['measured'][:10]}; " + "; ".join(parts)


def predict_row(row: dict[str, str], measured: dict[str, Any],
                specs: dict[tuple[str, int], advise.ModelSpec],
                fractions: dict[tuple[str, int], dict[str, float]],
                loopback: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    model, strategy, backend = row["model"], row["strategy"], row["backend"]
    batch, world = int(row["batch"]), int(row["world"])
    cluster = advise.parse_cluster(row["setup"])
    key = (model, batch)
    if key not in specs:
        specs[key] = advise.model_spec(model, batch)
    spec = specs[key]
    one_device_s = batch * spec.per_sample / float(row["t1_shared"])
    rate = float(row["rate_bits"]) if row["rate_bits"] else 1e9
    profile = advise.profile_by_hand(
        rate / 1e9, measured["inter"]["alpha_us"], measured["intra"]["pair_MBps"] * 8 / 1e3,
        measured["intra"]["alpha_us"], cpu_share=min(1.0, MACHINE_CORES / world),
        cpu_rates=measured["text"])
    parsed = parse_backend(backend)  # nanoccl+int4+qwz: int4, parameters gathered as int8
    codec, gather = parsed.codec or "none", parsed.gather_codec or "none"
    predictor = (GlooStandIn(cluster, profile, loopback) if backend == "gloo"
                 else advise.Predictor(cluster, profile))
    cfg = advise.Config(strategy, codec, gather_codec=gather, microbatches=world,
                        schedule="1f1b")
    # A negative fraction (noise) counts as none: advise.framework_seconds() clamps it.
    framework = {s: v * one_device_s for s, v in fractions.get(key, {}).items()}
    optimizer_s = framework.pop("optimizer", 0.0)
    fixed_s = framework.pop("fixed", 0.0)
    cfg = advise.evaluate(spec, cluster, predictor, cfg, one_device_s, math.inf, framework,
                          optimizer_s, fixed_s)
    got = float(row["scaling"])
    return {"model": model, "batch": batch, "setup": row["setup"], "strategy": strategy,
            "backend": backend, "measured_step_s": float(row["step_s"]),
            "predicted_step_s": cfg.step_s, "framework_s": cfg.framework_s,
            "optimizer_s": cfg.optimizer_s, "fixed_s": fixed_s,
            "measured_S": got, "predicted_S": cfg.scaling,
            "rel_error": (cfg.scaling - got) / got if got else math.nan,
            "predicted_inter_mb": cfg.inter_bytes / 1e6,
            "measured_inter_mb": float(row["nanoccl_inter_mb_step"] or "nan"),
            "measured_link_mb": float(row["volume_mb_step"] or "nan"),
            "predicted_sent_mb": (cfg.inter_bytes + cfg.intra_bytes) / 1e6,
            "measured_sent_mb": float(row["nanoccl_mb_step"] or "nan"),
            "refused": cfg.refused or ""}


def write_readme(out: Path, rows: list[dict[str, Any]], command: str) -> dict[str, Any]:
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["model"], r["batch"], r["setup"])].append(r)
    within = [r for r in rows if abs(r["rel_error"]) <= 0.25]
    rho = {k: spearman([r["predicted_S"] for r in v], [r["measured_S"] for r in v])
           for k, v in groups.items()}
    ranked = {k: v for k, v in rho.items() if not math.isnan(v)}
    good = [k for k, v in ranked.items() if v >= 0.8]
    errors = sorted(abs(r["rel_error"]) for r in rows)
    across = [r for r in rows if not r["setup"].startswith("1x")]
    across_ok = [r for r in across if abs(r["rel_error"]) <= 0.25]
    cross_rho = {k: v for k, v in ranked.items() if not k[2].startswith("1x")}
    # Issue 17's criterion, per setup: every row within 25%, or the rank order right.
    unmet = sorted(k for k, v in groups.items()
                   if not all(abs(r["rel_error"]) <= 0.25 for r in v)
                   and not rho[k] >= 0.8)
    lines = [
        "# nanoccl-advise against the full study (results/study/full)", "",
        "Generated by `bench/advise_study.py`; the advisor is `torch_ext/nanoccl/advise.py`.",
        "", "    " + command, "",
        f"- Rows predicted: {len(rows)} (every row of summary.csv but the 1x1 baselines).",
        f"- Scaling factor within 25% (relative) of the measured one: {len(within)} of "
        f"{len(rows)}; median |error| {statistics.median(errors):.0%}, 90th percentile "
        f"{errors[int(0.9 * (len(errors) - 1))]:.0%}.",
        f"- Spearman's rho of predicted against measured S per setup (model, batch, nodes x "
        f"ranks; strategies x backends): >= 0.8 in {len(good)} of {len(ranked)} setups "
        "(setups whose predictions are all equal have none).",
        f"- Across nodes (2x1, 2x2, 4x1): {len(across_ok)} of {len(across)} rows within 25%; "
        f"Spearman >= 0.8 in {sum(1 for v in cross_rho.values() if v >= 0.8)} of "
        f"{len(cross_rho)} setups. Within one node (1x2): "
        f"{len(within) - len(across_ok)} of {len(rows) - len(across)} rows within 25%.",
        f"- Setups with every row within 25% or Spearman >= 0.8: {len(groups) - len(unmet)} "
        f"of {len(groups)}" + (" (not: " + ", ".join(f"{m} b{b} {s}" for m, b, s in unmet)
                               + ")." if unmet else "."), "",
        "| model | batch | setup | rows | Spearman rho |", "|---|---|---|---|---|"]
    for k in sorted(groups):
        v = rho[k]
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {len(groups[k])} | "
                     f"{'-' if math.isnan(v) else f'{v:.2f}'} |")
    lines += ["", "A rank's compute is its share of the row's T_1 (TP: its share of the blocks and "
              "the whole output head), with the optimizer's part of T_1 shared as the strategy "
              "shards the parameters (all of it under DP) rather than as the batch and the "
              "part that does not shrink with the batch whole on every rank, plus its "
              "strategy's framework time; the framework, optimizer and fixed parts measured on one "
              "rank of this machine as fractions of the plain step (framework_probe.json: "
              + probe_text() + ").",
              "", "What the model leaves out, and where that shows: compute is taken as not slowed "
              "by communication, and a stage or rank that waits as leaving the CPU to no one. "
              "On this 2-core machine (2 or 4 ranks, their progress threads and the kernel's "
              "TCP copies) both are false: inside one node the links are fast and the CPU sets "
              "the pace, so a rank's compute (its share of T_1, the parts that do not split, "
              "its framework time) is the predicted step, while the ranks wait on each other "
              "and on their calls; the "
              "codecs on 4 ranks and "
              "nanoccl's hierarchical stages on 2x2 are slower than their profile rates say "
              "(the cost model's own caveat, results/tuning/README.md); the pipeline's idle "
              "stages give their cores to the busy ones, so it runs faster than predicted. "
              "Gloo rows are priced as nanoccl's flat ring (a stand-in, not a model of Gloo), "
              "on one node of two ranks as " + gloo_text() + ", each call added to the step "
              "(the kernel's TCP copies take the cores the ranks compute on)."]
    misses: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        if abs(r["rel_error"]) > 0.25:
            misses[f"{r['setup']} {r['strategy']}"].append(
                f"{r['model']} b{r['batch']} {r['backend']} {r['rel_error']:+.0%}")
    lines += ["", "Rows off by more than 25%, by setup and strategy (+: predicted faster than "
              "measured):", ""]
    lines += [f"- {k}: {', '.join(v)}" for k, v in sorted(misses.items())]
    lines += ["", "Per row: step time and scaling factor measured (summary.csv) and predicted; "
              "inter-node MB a step as nanoccl counted its payload (nanoccl rows), as the "
              "emulated links counted it (eth0 tx, all nodes, with TCP/IP headers; every "
              "backend) and as predicted; every byte nanoccl sent, counted and predicted.", "",
              "| model | batch | setup | strategy | backend | step s meas. | pred. | "
              "S meas. | S pred. | rel. error | inter MB nanoccl | link MB | pred. | "
              "sent MB nanoccl | pred. |", "|---|---|---|---|---|---|---|---|---|---|---|---|"
              "---|---|---|"]

    def mb(v: float) -> str:
        return "-" if math.isnan(v) else f"{v:.2f}"

    for r in rows:
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['setup']} | {r['strategy']} | {r['backend']} | "
            f"{r['measured_step_s']:.3f} | {r['predicted_step_s']:.3f} | {r['measured_S']:.3f} | "
            f"{r['predicted_S']:.3f} | {r['rel_error']:+.0%} | {mb(r['measured_inter_mb'])} | "
            f"{mb(r['measured_link_mb'])} | {r['predicted_inter_mb']:.2f} | "
            f"{mb(r['measured_sent_mb'])} | {r['predicted_sent_mb']:.2f} |")
    (out / "README.md").write_text("\n".join(lines) + "\n")
    return {"within_25": len(within), "rows": len(rows), "spearman": rho, "good": len(good),
            "setups": len(ranked), "met": len(groups) - len(unmet), "groups": len(groups)}


def volume_text(profile: str) -> str:
    """The published runs' bytes a token through a node's NIC (both ways), against the study's
    stack priced at the batch that matches them: DP 16 a GPU, PP 16 a pipeline."""
    import study_seeds as seeds

    parts = []
    for setup, name, batch in (("2x1", "dp", 32), ("2x1", "pp", 16), ("2x2", "pp", 16)):
        row = seeds.nano_row(setup, name)
        if row is None or row.net_gbps is None:
            continue
        published = row.net_gbps * 1e9 / 8 / (row.ktokens_per_s * 1e3)
        cluster = advise.parse_cluster(setup)
        spec = dataclasses.replace(advise.model_spec("gpt2-small", batch),
                                   stack=advise.STUDY_STACK)
        cfg = advise.evaluate(spec, cluster, advise.Predictor(cluster, profile, {"algo": "ring"}),
                              advise.Config(name, microbatches=4), 1.0, math.inf)
        # Sent over all ranks; a node's NIC carries what its ranks send and receive across,
        # 2 / nodes of it.
        predicted = cfg.inter_bytes * 2 / cluster.nodes / (batch * 1024)
        parts.append(f"{name.upper()} {setup} {published / 1e3:.1f} KB a token published, "
                     f"{predicted / 1e3:.1f} KB priced at a global batch of {batch} x 1024")
    return "; ".join(parts)


def seed_check(measured: dict[str, Any]) -> list[str]:
    """The published GPT-2 small runs (2 nodes x 2 A40, 1 GbE; bench/study_seeds.py) against
    the advisor: one A40's step from the published 1x1 throughput (batch 16 x 1024), the
    inter-node link at 1 Gbit/s, PCIe between the GPUs of a node. The slides do not say
    whether batch 16 is global or per GPU: both readings are shown, and the network volumes a
    token (volume_text) tell which one each row ran (DP 16 a GPU, PP 16 a pipeline). The last
    column prices the study's own stack (advise.STUDY_STACK: fp16 activations, fused qkv, a
    tied embedding) on a flat ring."""
    import study_seeds as seeds

    cluster = advise.parse_cluster("2x2")
    t1_16 = 16 * 1024 / (seeds.NANO_GPT2_SMALL_1X1_KTOK * 1000)
    profile = advise.profile_by_hand(1.0, 50.0, 100.0, 10.0, cpu_rates=measured["text"])

    def published_s(name: str) -> float:  # unrounded: the row's throughput over 4 x T_1
        row = seeds.nano_row("2x2", name)
        return row.ktokens_per_s / (4 * seeds.NANO_GPT2_SMALL_1X1_KTOK) if row else math.nan

    lines = ["", "## GPT-2 small on 2 nodes x 2 A40 at 1 GbE (the published study)", "",
             f"One A40's step on batch 16 x 1024: {t1_16:.3f} s (the published 1x1 "
             f"throughput, {seeds.NANO_GPT2_SMALL_1X1_KTOK:.1f} ktokens/s); links: 1 Gbit/s "
             "between nodes (50 us), 100 Gbit/s within (10 us); 48 GiB a device. Stock: DDP's "
             "buckets, no codec; PP 1F1B with m = p = 4. The first two columns price the "
             "reference trainers' traffic (fp32; TP with q, k, v apart: 6 allreduces a block), "
             "the last the study's stack as its reported network volume shows it (fp16 "
             "activations, Megatron-style TP: 4 allreduces a block; torch_ext/nanoccl/"
             "advise_traffic.py STUDY_STACK), and its pipeline keeps GPT-2's embedding tied "
             "(the gradient allreduced between the first and the last stage a step). The "
             "published S from its throughputs: "
             + ", ".join(f"{n} {published_s(n):.4f}" for n in ("dp", "tp", "pp")) + ".",
             "", "The network volumes fix the batch: " + volume_text(profile) + ".",
             "", "| global batch | configuration | published S | predicted S, nanoccl (auto) | "
             "predicted S, flat ring (NCCL-like) | predicted S, the study's stack, flat ring |",
             "|---|---|---|---|---|---|"]
    for batch in (16, 64):  # 64: batch 16 per GPU
        spec = advise.model_spec("gpt2-small", batch)
        study = dataclasses.replace(spec, stack=advise.STUDY_STACK)
        one_device_s = t1_16 * batch / 16
        for name, kw in (("dp", {}), ("tp", {}), ("pp", {"microbatches": 4})):
            got = []
            for model, settings in ((spec, {}), (spec, {"algo": "ring"}),
                                    (study, {"algo": "ring"})):
                c = advise.evaluate(model, cluster, advise.Predictor(cluster, profile, settings),
                                    advise.Config(name, **kw), one_device_s, 48 * 2**30)
                got.append(f"{c.scaling:.3f}" if not c.refused else c.refused)
            pub = seeds.nano_row("2x2", name)
            lines.append(f"| {batch} | {name} | {pub.scaling if pub else '-'} | "
                         + " | ".join(got) + " |")
    spec = advise.model_spec("gpt2-small", 16)
    ranked = advise.advise(spec, cluster, profile, t1_16, 48 * 2**30)
    lines += ["", "The advisor's ranking at global batch 16 (nanoccl, auto), the 8 best:", "",
              advise.table(ranked[:8], spec, cluster, advise.stock_dp(ranked))]
    return lines


def plot(out: Path, rows: list[dict[str, Any]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        print("no PNG: matplotlib is not importable")
        return
    fig, ax = plt.subplots(figsize=(6, 6))
    for strategy in sorted({r["strategy"] for r in rows}):
        pts = [r for r in rows if r["strategy"] == strategy]
        ax.scatter([r["measured_S"] for r in pts], [r["predicted_S"] for r in pts], label=strategy)
    ax.set_xscale("log")
    ax.set_yscale("log")
    lo, hi = 0.005, 1.2
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25], alpha=0.15)
    ax.set_xlabel("measured scaling factor")
    ax.set_ylabel("predicted scaling factor")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "predicted_vs_measured.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("study", type=Path, help="a study folder (summary.csv)")
    p.add_argument("--out", type=Path, default=REPO / "results" / "advise")
    p.add_argument("--probe-framework", action="store_true",
                   help=f"measure the strategies' framework time on one rank here first "
                   f"(a few minutes; writes {FRAMEWORK_PROBE.relative_to(REPO)})")
    p.add_argument("--probe-gloo", action="store_true",
                   help=f"measure Gloo over TCP loopback here first (seconds; writes "
                   f"{GLOO_PROBE.relative_to(REPO)})")
    args = p.parse_args(argv)
    if args.probe_framework:
        probe_framework(args.study, FRAMEWORK_PROBE)
    if args.probe_gloo:
        probe_gloo(GLOO_PROBE)
    fractions = framework_fractions(FRAMEWORK_PROBE)
    loopback = gloo_loopback(GLOO_PROBE)
    measured = measured_profile()
    specs: dict[tuple[str, int], advise.ModelSpec] = {}
    with (args.study / "summary.csv").open() as f:
        rows = [predict_row(r, measured, specs, fractions, loopback) for r in csv.DictReader(f)
                if r["strategy"] != "single" and r["scaling"]]
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "study_predictions.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    command = f"python bench/advise_study.py {args.study} --out {args.out}"
    summary = write_readme(args.out, rows, command)
    with (args.out / "README.md").open("a") as f:
        f.write("\n".join(seed_check(measured)) + "\n")
    plot(args.out, rows)
    print(f"{summary['within_25']}/{summary['rows']} rows within 25%; Spearman >= 0.8 in "
          f"{summary['good']}/{summary['setups']} setups; every row within 25% or Spearman "
          f">= 0.8 in {summary['met']}/{summary['groups']} setups; wrote {args.out}/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
