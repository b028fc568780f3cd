"""Metrics, tables and plots of the study (used by bench/study.py; also standalone).

    python bench/study_report.py results/study        # rebuild report.md, summary.csv, PNGs

Input: ``runs.csv`` (one row per training run or baseline copy, written by study.py) and
``meta.json``. Output in the same folder: ``summary.csv`` (mean and spread over the
repetitions), ``report.md`` (the studies' table format beside their published numbers)
and PNG plots.

Definitions:
- throughput T: global samples (tokens for GPT, images for ResNet) x timed steps / the
  timed window (barrier to barrier);
- scaling factor S_n = T_n / (n x T_1), where T_1 is the mean throughput of one rank
  training the same global batch alone *while n such single-rank runs share this machine*
  (so that CPU sharing does not count as communication overhead); S_iso uses T_1 measured
  alone, as the studies did on dedicated GPUs;
- network volume: bytes that crossed the emulated links (the sum over nodes of eth0's
  tx_bytes in the timed window), per step; the same counters for Gloo and nanoccl;
- network throughput: per node, (tx + rx) x 8 / window (full duplex, as the study measured
  at the NIC), averaged over nodes; ``Gb/s @ref`` multiplies by the time-dilation factor D
  to put it on the reference's clock (where the link is 1 Gb/s).
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import statistics
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import study_seeds as seeds  # noqa: E402

RUN_FIELDS = [
    "kind", "profile", "model", "strategy", "backend", "setup", "nodes", "procs_per_node",
    "world", "batch", "seq_len", "unit", "rep", "concurrency", "for_setup", "copy", "status",
    "error",
    "steps", "warmup_steps", "timed_steps", "window_s", "samples_per_s", "units_per_s",
    "step_time_mean_s", "step_time_std_s", "final_loss", "first_loss", "peak_rss_mb",
    "params", "link_tx_bytes", "link_rx_bytes", "link_run_tx_bytes", "link_run_rx_bytes",
    "nanoccl_sent_bytes", "nanoccl_inter_sent_bytes", "rate_bits", "dilation", "microbatches",
    "schedule", "bucket_cap_mb", "wall_s", "log",
    # Long runs (study_long.py): the held-out curve, and where a row's time was computed.
    "eval_every", "eval_loss", "eval_curve", "time_source", "same_as",
]

SETUP_ORDER = ["1x1", "1x2", "1x4", "2x1", "2x2", "4x1"]
STRATEGY_ORDER = ["single", "dp", "tp", "pp", "zero1", "zero2", "zero3", "zero3-hpz", "hsdp"]
STRATEGY_LABEL = {"single": "Single", "dp": "Data", "tp": "Tensor", "pp": "Pipeline",
                  "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
                  "zero3-hpz": "ZeRO-3 hpZ", "hsdp": "HSDP"}


def _num(value: Any) -> float | None:
    if value in (None, ""):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _setup_key(setup: str) -> tuple[int, str]:
    return (SETUP_ORDER.index(setup) if setup in SETUP_ORDER else 99, setup)


def _strategy_key(strategy: str) -> int:
    if strategy.startswith("diloco"):  # diloco-h10-f4-t2 and the like: after the others
        return len(STRATEGY_ORDER)
    return STRATEGY_ORDER.index(strategy) if strategy in STRATEGY_ORDER else 99


def _backend_key(backend: str) -> tuple[int, str]:
    order = {"gloo": 0, "nccl": 1, "nanoccl": 2}
    return (order.get(backend, 3), backend)


def write_runs_csv(path: Path, records: Iterable[dict[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=RUN_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for rec in records:
            writer.writerow({k: ("" if rec.get(k) is None else rec.get(k)) for k in RUN_FIELDS})


def read_runs_csv(path: Path) -> list[dict[str, Any]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@dataclass
class Summary:
    model: str
    strategy: str
    backend: str
    setup: str
    batch: int
    world: int
    unit: str
    reps: int
    failed: int
    throughput: float | None = None  # units/s, mean over repetitions
    throughput_std: float | None = None
    step_s: float | None = None
    step_s_std: float | None = None
    scaling: float | None = None  # vs T_1 under the same CPU sharing
    scaling_std: float | None = None
    scaling_iso: float | None = None  # vs T_1 alone
    t1_shared: float | None = None
    t1_iso: float | None = None
    net_mbps: float | None = None  # per node, tx + rx, emulated clock
    net_gbps_ref: float | None = None  # the same on the reference's clock (x dilation)
    link_util: float | None = None  # (tx + rx) / (2 x rate) per node
    volume_mb_step: float | None = None  # link bytes (sum of tx over nodes) per step
    volume_mb_run: float | None = None  # the whole run, init included
    nanoccl_mb_step: float | None = None
    nanoccl_inter_mb_step: float | None = None
    peak_rss_mb: float | None = None
    final_loss: float | None = None
    dilation: float | None = None
    rate_bits: float | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        return (self.model, self.strategy, self.backend, self.setup, self.batch)


def _mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def baselines(records: Sequence[dict[str, Any]],
              by_setup: bool = False) -> dict[tuple[Any, ...], float]:
    """T_1 per (model, batch, concurrency) -- and per setup it was measured for, with
    `by_setup` -- the mean over copies and repetitions."""
    groups: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for rec in records:
        if rec.get("kind") != "baseline" or rec.get("status") != "ok":
            continue
        value = _num(rec.get("units_per_s"))
        if value is None:
            continue
        key: tuple[Any, ...] = (rec["model"], int(rec["batch"]), int(rec["concurrency"]))
        if by_setup:
            key += (rec.get("for_setup") or "1x1",)
        groups[key].append(value)
    return {k: statistics.fmean(v) for k, v in groups.items()}


def summarize(records: Sequence[dict[str, Any]]) -> list[Summary]:
    t1 = baselines(records)
    t1_setup = baselines(records, by_setup=True)
    groups: dict[tuple[str, str, str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        if rec.get("kind") == "prefix":  # a computed row's prefix that ran on (study_long)
            continue
        if rec.get("kind") == "baseline":
            if int(rec.get("concurrency") or 1) != 1:
                continue
            key = (rec["model"], "single", "-", "1x1", int(rec["batch"]))
        else:
            key = (rec["model"], rec["strategy"], rec["backend"], rec["setup"], int(rec["batch"]))
        groups[key].append(rec)
    out: list[Summary] = []
    for (model, strategy, backend, setup, batch), recs in groups.items():
        ok = [r for r in recs if r.get("status") == "ok"]
        first = recs[0]
        world = int(first.get("world") or 1)
        nodes = int(first.get("nodes") or 1)
        s = Summary(model, strategy, backend, setup, batch, world, first.get("unit") or "",
                    reps=len(ok), failed=len(recs) - len(ok))
        s.errors = sorted({str(r.get("error") or r.get("status")) for r in recs if r not in ok})
        if not ok:
            out.append(s)
            continue
        thr = [_num(r["units_per_s"]) for r in ok]
        thr_ok = [v for v in thr if v is not None]
        s.throughput, s.throughput_std = _mean_std(thr_ok)
        s.step_s, s.step_s_std = _mean_std([v for v in (_num(r["step_time_mean_s"]) for r in ok)
                                            if v is not None])
        s.t1_iso = t1.get((model, batch, 1))
        s.t1_shared = (t1_setup.get((model, batch, world, setup)) or t1.get((model, batch, world))
                       or s.t1_iso)
        if s.t1_shared:
            s.scaling, s.scaling_std = _mean_std([v / (world * s.t1_shared) for v in thr_ok])
        if s.t1_iso and s.throughput is not None:
            s.scaling_iso = s.throughput / (world * s.t1_iso)
        s.dilation = _num(first.get("dilation"))
        s.rate_bits = _num(first.get("rate_bits"))
        vols, nets, utils, runs, nano, nano_inter = [], [], [], [], [], []
        for r in ok:
            steps = _num(r.get("timed_steps")) or 1.0
            window = _num(r.get("window_s"))
            tx, rx = _num(r.get("link_tx_bytes")), _num(r.get("link_rx_bytes"))
            if tx is not None and rx is not None and nodes > 1:
                vols.append(tx / steps / 1e6)
                if window:
                    per_node_bits = (tx + rx) * 8 / nodes / window
                    nets.append(per_node_bits / 1e6)
                    rate = _num(r.get("rate_bits"))
                    if rate:
                        utils.append(per_node_bits / (2 * rate))
            run_tx = _num(r.get("link_run_tx_bytes"))
            if run_tx is not None and nodes > 1:
                runs.append(run_tx / 1e6)
            sent = _num(r.get("nanoccl_sent_bytes"))
            if sent is not None:
                nano.append(sent / steps / 1e6)
            inter = _num(r.get("nanoccl_inter_sent_bytes"))
            if inter is not None:
                nano_inter.append(inter / steps / 1e6)
        s.volume_mb_step = _mean_std(vols)[0]
        s.net_mbps = _mean_std(nets)[0]
        if s.net_mbps is not None:
            s.net_gbps_ref = s.net_mbps / 1e3 * (s.dilation or 1.0)
        s.link_util = _mean_std(utils)[0]
        s.volume_mb_run = _mean_std(runs)[0]
        s.nanoccl_mb_step = _mean_std(nano)[0]
        s.nanoccl_inter_mb_step = _mean_std(nano_inter)[0]
        s.peak_rss_mb = max((v for v in (_num(r.get("peak_rss_mb")) for r in ok) if v is not None),
                            default=None)
        s.final_loss = _mean_std([v for v in (_num(r.get("final_loss")) for r in ok)
                                  if v is not None])[0]
        out.append(s)
    out.sort(key=lambda s: (s.model, s.batch, _setup_key(s.setup), _strategy_key(s.strategy),
                            _backend_key(s.backend)))
    return out


def write_summary_csv(path: Path, summaries: Sequence[Summary]) -> None:
    rows = [asdict(s) for s in summaries]
    for row in rows:
        row["errors"] = "; ".join(row["errors"])
    fields = list(rows[0].keys()) if rows else ["model"]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


# ----------------------------------------------------------------------------- markdown
def _f(value: float | None, fmt: str = "{:.2f}", missing: str = "-") -> str:
    return missing if value is None else fmt.format(value)


def _pm(mean: float | None, std: float | None, fmt: str = "{:.2f}") -> str:
    if mean is None:
        return "-"
    if std:
        return f"{fmt.format(mean)} ± {fmt.format(std)}"
    return fmt.format(mean)


def _kunits(value: float | None) -> float | None:
    return None if value is None else value / 1000.0


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _ref_batch(summaries: Sequence[Summary], model: str, meta: dict[str, Any]) -> int | None:
    ref = meta.get("ref_batch", {}).get(model)
    if ref is not None:
        return int(ref)
    batches = sorted({s.batch for s in summaries if s.model == model})
    return batches[len(batches) // 2] if batches else None


def study_table(summaries: Sequence[Summary], model: str, batch: int) -> list[str]:
    """Setup x parallelism x backend, in the nano-cluster table's columns, with the
    published GPT-2 small row beside each (same setup and parallelism)."""
    rows = [s for s in summaries if s.model == model and s.batch == batch]
    if not rows:
        return []
    unit = rows[0].unit or "samples"
    dp_volume: dict[tuple[str, str], float] = {}
    for s in rows:
        if s.strategy == "dp" and s.volume_mb_step:
            dp_volume[(s.setup, s.backend)] = s.volume_mb_step
    pub_dp = {r.setup: r.net_volume_gb for r in seeds.NANO_GPT2_SMALL if r.parallelism == "dp"}
    # The lossless final loss of each (setup, strategy): nanoccl's, else Gloo's (same steps).
    lossless: dict[tuple[str, str], float] = {}
    for backend in ("gloo", "nanoccl"):
        for s in rows:
            if s.backend == backend and s.final_loss is not None:
                lossless[(s.setup, s.strategy)] = s.final_loss
    header = ["Setup", "Parallelism", "Backend", f"Sample Thrp. (k{unit}/s)", "Scaling Factor",
              "S_iso", "Net Thrp. (Mb/s)", "Gb/s @ref", "Link use", "Net Vol. (MB/step)",
              "Vol./DP", "Peak RSS (MB)", "Final loss", "Loss vs lossless", "‖ study Thrp.",
              "study S", "study Net Thrp.", "study Net Vol. (GB/run)", "study Vol./DP"]
    table: list[list[str]] = []
    for s in rows:
        pub = seeds.nano_row(s.setup, s.strategy) if model.startswith("gpt2") else None
        if s.setup == "1x1" and model.startswith("gpt2"):
            pub_cells = [f"{seeds.NANO_GPT2_SMALL_1X1_KTOK:.2f}*", "1", "-", "-", "-"]
        elif pub is None:
            pub_cells = ["-"] * 5
        else:
            base = pub_dp.get(s.setup)
            ratio = (pub.net_volume_gb / base) if (pub.net_volume_gb and base) else None
            pub_cells = [f"{pub.ktokens_per_s:.2f}", f"{pub.scaling:.2f}",
                         _f(pub.net_gbps), _f(pub.net_volume_gb), _f(ratio)]
        vol_ratio = None
        base_vol = dp_volume.get((s.setup, s.backend))
        if s.volume_mb_step is not None and base_vol:
            vol_ratio = s.volume_mb_step / base_vol
        base_loss = lossless.get((s.setup, s.strategy))
        loss_delta = None
        if s.final_loss is not None and base_loss:
            loss_delta = s.final_loss / base_loss - 1
        if s.reps == 0:
            cells = [s.setup, STRATEGY_LABEL.get(s.strategy, s.strategy), s.backend,
                     "failed: " + "; ".join(s.errors)[:60]] + ["-"] * 10
        else:
            cells = [s.setup, STRATEGY_LABEL.get(s.strategy, s.strategy), s.backend,
                     _pm(_kunits(s.throughput), _kunits(s.throughput_std), "{:.2f}"),
                     _pm(s.scaling, s.scaling_std, "{:.2f}"), _f(s.scaling_iso),
                     _f(s.net_mbps, "{:.1f}"), _f(s.net_gbps_ref), _f(s.link_util, "{:.0%}"),
                     _f(s.volume_mb_step, "{:.2f}"), _f(vol_ratio), _f(s.peak_rss_mb, "{:.0f}"),
                     _f(s.final_loss, "{:.4f}"), _f(loss_delta, "{:+.2%}")]
        table.append(cells + pub_cells)
    return _md_table(header, table)


def nanoccl_effect(summaries: Sequence[Summary], model: str, batch: int) -> list[str]:
    """Every (setup, strategy) with Gloo and a nanoccl variant: throughput ratio and bytes."""
    rows = [s for s in summaries if s.model == model and s.batch == batch and s.world > 1]
    by_key: dict[tuple[str, str], dict[str, Summary]] = defaultdict(dict)
    for s in rows:
        by_key[(s.setup, s.strategy)][s.backend] = s
    header = ["Setup", "Parallelism", "Backend", "S (gloo)", "S (this)", "Thrp. / gloo",
              "Link MB/step (gloo)", "Link MB/step (this)", "nanoccl inter-node MB/step"]
    table = []
    for (setup, strategy), backs in sorted(by_key.items(),
                                           key=lambda kv: (_setup_key(kv[0][0]),
                                                           _strategy_key(kv[0][1]))):
        gloo = backs.get("gloo")
        for backend, s in sorted(backs.items(), key=lambda kv: _backend_key(kv[0])):
            if backend == "gloo":
                continue
            ratio = (s.throughput / gloo.throughput
                     if gloo and gloo.throughput and s.throughput else None)
            table.append([setup, STRATEGY_LABEL.get(strategy, strategy), backend,
                          _f(gloo.scaling if gloo else None), _f(s.scaling), _f(ratio, "{:.2f}x"),
                          _f(gloo.volume_mb_step if gloo else None),
                          _f(s.volume_mb_step), _f(s.nanoccl_inter_mb_step)])
    return _md_table(header, table) if table else []


def sweep_table(summaries: Sequence[Summary], model: str) -> list[str]:
    rows = [s for s in summaries if s.model == model and s.strategy in ("dp", "single")]
    batches = sorted({s.batch for s in rows})
    if len(batches) < 2:
        return []
    header = ["Setup", "Backend"] + [f"b={b}: k/s (S)" for b in batches]
    keyed: dict[tuple[str, str], dict[int, Summary]] = defaultdict(dict)
    for s in rows:
        keyed[(s.setup, s.backend)][s.batch] = s
    table = []
    for (setup, backend), per in sorted(keyed.items(),
                                        key=lambda kv: (_setup_key(kv[0][0]),
                                                        _backend_key(kv[0][1]))):
        cells = [setup, backend]
        for b in batches:
            s = per.get(b)
            cells.append("-" if s is None or s.throughput is None else
                         f"{s.throughput / 1000:.2f} ({_f(s.scaling)})")
        table.append(cells)
    return _md_table(header, table)


def findings(summaries: Sequence[Summary], model: str, batch: int) -> list[str]:
    """The studies' qualitative claims, checked against this run (gloo rows)."""
    rows = {(s.setup, s.strategy, s.backend): s for s in summaries
            if s.model == model and s.batch == batch and s.scaling is not None}

    def sc(setup: str, strategy: str, backend: str = "gloo") -> float | None:
        s = rows.get((setup, strategy, backend))
        return s.scaling if s else None

    out: list[str] = []

    def claim(text: str, ok: bool | None, detail: str) -> None:
        mark = "n/a" if ok is None else ("yes" if ok else "NO")
        out.append(f"- {text}: **{mark}** ({detail})")

    dp12, dp21, dp22 = sc("1x2", "dp"), sc("2x1", "dp"), sc("2x2", "dp")
    if dp12 is not None and dp21 is not None:
        claim("DP near-linear inside a node, collapsing across nodes (study 0.93 vs 0.11)",
              dp12 >= 0.6 and dp21 < 0.5 * dp12, f"S 1x2 {dp12:.2f}, 2x1 {dp21:.2f}"
              + (f", 2x2 {dp22:.2f}" if dp22 is not None else ""))
    for setup in ("2x1", "2x2"):
        cands = {k: sc(setup, k) for k in ("dp", "tp", "pp")}
        have = {k: v for k, v in cands.items() if v is not None}
        if len(have) >= 2 and "tp" in have:
            claim(f"TP worst across nodes ({setup}; study S 0.02 / 0.01)",
                  have["tp"] <= min(have.values()),
                  ", ".join(f"{k} {v:.3f}" for k, v in have.items()))
        if len(have) >= 2 and "pp" in have:
            claim(f"PP the most robust across nodes ({setup}; study PP 0.13 > DP 0.11 > TP 0.02)",
                  have["pp"] >= max(have.values()),
                  ", ".join(f"{k} {v:.3f}" for k, v in have.items()))
    for setup in ("1x2", "2x1", "2x2", "4x1"):
        z1, z2 = sc(setup, "zero1"), sc(setup, "zero2")
        if z1 is not None and z2 is not None:
            claim(f"ZeRO-2 slower than ZeRO-1 ({setup}; PCIe paper)", z2 < z1,
                  f"S zero1 {z1:.2f}, zero2 {z2:.2f}")
    tp21 = rows.get(("2x1", "tp", "gloo"))
    dp21s = rows.get(("2x1", "dp", "gloo"))
    if tp21 and dp21s and tp21.volume_mb_step and dp21s.volume_mb_step:
        claim("TP moves several times DP's bytes (study 1171 GB vs 223 GB = 5.2x)",
              tp21.volume_mb_step > 2 * dp21s.volume_mb_step,
              f"{tp21.volume_mb_step / dp21s.volume_mb_step:.1f}x")
    for backend in sorted({s.backend for s in summaries if s.backend.startswith("nanoccl")}):
        d = sc("2x1", "dp", backend)
        if d is not None:
            what = "GPT" if model.startswith("gpt2") else model
            claim(f"{what} DP across 2 nodes with {backend} reaches S >= 0.5 (goal; study GPT "
                  "0.11)",
                  d >= 0.5, f"S {d:.2f} vs gloo {_f(dp21)}")
    return out


def baseline_table(records: Sequence[dict[str, Any]]) -> list[str]:
    t1 = baselines(records, by_setup=True)
    if not t1:
        return []
    header = ["Model", "Batch", "Single-rank runs at once", "Measured before", "T_1 per run (k/s)"]
    rows = [[m, str(b), str(c), f if c > 1 else "-", f"{v / 1000:.3f}"]
            for (m, b, c, f), v in sorted(t1.items())]
    return _md_table(header, rows)


def write_report(out_dir: Path, records: Sequence[dict[str, Any]], meta: dict[str, Any],
                 plots: Sequence[str]) -> Path:
    summaries = summarize(records)
    lines: list[str] = [f"# nanoccl study: {meta.get('profile', '?')} profile", ""]
    lines.append(f"Generated {meta.get('finished', meta.get('started', ''))} by "
                 "`bench/study.py`; raw rows in `runs.csv`, aggregates in `summary.csv`.")
    lines.append("")
    env = meta.get("environment", {})
    window = meta.get("min_window_s") or 0
    lines += [
        "## Setup",
        "",
        f"- Machine: {env.get('cpu', '?')}, {env.get('cores', '?')} cores; torch "
        f"{env.get('torch', '?')}; nanoccl: {env.get('nanoccl', '?')}.",
        f"- Cluster: {meta.get('cluster', '?')}.",
        f"- Runs: {meta.get('steps', '?')} steps each, the first {meta.get('warmup', '?')} "
        f"left out" + (f", more where steps are short, to time about {window:g} s "
                       "(runs.csv's timed_steps)" if window else "")
        + f"; {meta.get('reps', '?')} repetition(s); one thread per rank.",
    ]
    for rerun in meta.get("reruns", []):
        window_again = (f", about {rerun['min_window_s']:g} s timed"
                        if rerun.get("min_window_s") else "")
        only = (f" (rows {', '.join(rerun['rows'])})" if rerun.get("rows") else "")
        lines.append(f"- Setups {', '.join(rerun.get('setups', []))}{only} measured again on "
                     f"{rerun.get('started', '?')} ({rerun.get('steps', '?')} steps, the first "
                     f"{rerun.get('warmup', '?')} left out{window_again}; "
                     f"{rerun.get('reps', '?')} repetition(s); {rerun.get('cpu', '?')}): "
                     f"{rerun.get('why', '')}")
    for model, d in meta.get("dilation", {}).items():
        lines.append(f"- Time dilation for {model}: {d.get('text', '')}")
    lines += ["", "Columns follow the nano-cluster study's table (Setup = servers x GPUs, here "
              "emulated nodes x ranks). `Scaling Factor` = T_n / (n T_1) with T_1 measured while "
              "n single-rank runs share this machine (mean ± std over repetitions); `S_iso` "
              "uses T_1 measured alone. `Net Thrp.` is per node, tx + rx (full duplex) on the "
              "emulated clock; `Gb/s @ref` is the same on the reference's clock (x D), "
              "comparable to the study's Gb/s; `Link use` = (tx + rx) / (2 x link rate). "
              "`Net Vol.` counts bytes that crossed the emulated links (eth0 tx, all nodes) per "
              "training step; absolute volumes are not comparable with the study's GB per run "
              "(different model, unknown step count), ratios to DP are. `Final loss` is the "
              "mean over repetitions of the loss after the profile's steps (also where a run "
              "timed more steps to fill its window); `Loss vs lossless` compares it "
              "with the lossless run (nanoccl, else Gloo) of the same setup and parallelism "
              "after the same steps. `‖ study ...` columns "
              "are the published GPT-2 small numbers for the same setup and parallelism "
              f"({seeds.NANO_SOURCE}); * = derived T_1.", ""]
    if any(s.strategy.startswith("diloco") for s in summaries):
        lines += ["`diloco` rows (diloco-h<H>-f<F>-t<TAU>[-lr<LR>]: H inner steps between two "
                  "outer steps of a fragment, F fragments, each exchange TAU steps behind, the "
                  "outer Nesterov's lr where not 0.7; the outer gradients with the backend's "
                  "codec) run at least two whole H-step "
                  "cycles (runs.csv's steps) and time whole cycles: their `Final loss` is "
                  "after those steps, not comparable with the other rows'.", ""]
    models = sorted({s.model for s in summaries})
    for model in models:
        batch = _ref_batch(summaries, model, meta)
        if batch is None:
            continue
        unit = next((s.unit for s in summaries if s.model == model), "")
        lines += [f"## {model}, global batch {batch}" + (f" ({unit})" if unit else ""), ""]
        lines += study_table(summaries, model, batch) + [""]
        found = findings(summaries, model, batch)
        if found:
            lines += ["### The studies' findings, checked (Gloo rows)", ""] + found + [""]
        effect = nanoccl_effect(summaries, model, batch)
        if effect:
            lines += ["### nanoccl against Gloo, row by row", ""] + effect + [""]
        sweep = sweep_table(summaries, model)
        if sweep:
            lines += [f"### {model}: throughput (k{unit}/s) and scaling factor vs global batch "
                      "(DP)", ""] + sweep + [""]
    import study_long

    lines += study_long.report_lines(records, meta)
    base = baseline_table(records)
    if base:
        lines += ["## Single-rank baselines (T_1)", "",
                  "Throughput of one single-rank run while N of them run at once on this "
                  "machine (the T_1 of an N-rank setup).", ""] + base + [""]
    failed = [r for r in records if r.get("status") not in ("ok", None)
              or r.get("kind") == "prefix"]
    if failed:
        lines += ["## Runs that did not finish", ""]
        for r in failed:
            lines.append(f"- {r.get('model')} {r.get('strategy')} {r.get('backend')} "
                         f"{r.get('setup')} b={r.get('batch')} rep {r.get('rep')}: "
                         f"{'prefix only' if r.get('kind') == 'prefix' else r.get('status')} "
                         f"{r.get('error') or ''} (log: {r.get('log') or '-'})")
        lines.append("")
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    lines += ["## Published findings this study stands beside", ""]
    lines += [f"- {t} (nano-cluster slides)" for t in seeds.NANO_FINDINGS]
    lines += [f"- {t} (PCIe paper)" for t in seeds.PCIE_FINDINGS]
    for model in ("gpt2 (85M)", "gpt2-large (708M)"):
        s12, s21 = seeds.net_scaling(model, 1, 2), seeds.net_scaling(model, 2, 1)
        if s12 is not None and s21 is not None:
            lines.append(f"- DDP {model} on A100: S = {s12:.2f} with NVLink (1x2), {s21:.2f} "
                         "across 2 nodes on InfiniBand HDR (2x1) (GPU-networking blog)")
    lines.append("")
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


# -------------------------------------------------------------------------------- plots
def make_plots(out_dir: Path, records: Sequence[dict[str, Any]],
               meta: dict[str, Any]) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # plots are optional
        return []
    summaries = summarize(records)
    written: list[str] = []
    for model in sorted({s.model for s in summaries}):
        rows = [s for s in summaries if s.model == model and s.throughput is not None]
        unit = rows[0].unit if rows else ""
        # Throughput vs batch size per setup (DP and the 1x1 baseline), one panel per backend.
        sweep = [s for s in rows if s.strategy in ("dp", "single")]
        batches = sorted({s.batch for s in sweep})
        backends = sorted({s.backend for s in sweep if s.backend != "-"}, key=_backend_key)
        if batches and backends:
            fig, axes = plt.subplots(1, len(backends), figsize=(5.5 * len(backends), 4),
                                     squeeze=False, sharey=True)
            for ax, backend in zip(axes[0], backends):
                setups = sorted({s.setup for s in sweep}, key=_setup_key)
                for setup in setups:
                    pts = sorted((s.batch, s.throughput) for s in sweep if s.setup == setup
                                 and (s.backend == backend or s.setup == "1x1"))
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] / 1000 for p in pts], marker="o",
                                label=setup)
                ax.set_xscale("log", base=2)
                ax.set_xlabel("global batch size")
                ax.set_title(f"{model} DP, {backend}")
                ax.grid(alpha=0.3)
                ax.legend(title="nodes x ranks")
            axes[0][0].set_ylabel(f"k{unit}/s")
            written.append(save_figure(fig, out_dir / f"throughput_vs_batch_{model}.png"))
        # Scaling factor per strategy and backend, one panel per setup.
        batch = _ref_batch(summaries, model, meta)
        scal = [s for s in rows if s.batch == batch and s.world > 1 and s.scaling is not None]
        setups = sorted({s.setup for s in scal}, key=_setup_key)
        if scal:
            strategies = sorted({s.strategy for s in scal}, key=_strategy_key)
            backends = sorted({s.backend for s in scal}, key=_backend_key)
            fig, axes = plt.subplots(1, len(setups), figsize=(4.2 * len(setups), 4),
                                     squeeze=False, sharey=True)
            width = 0.8 / max(1, len(backends))
            for ax, setup in zip(axes[0], setups):
                for k, backend in enumerate(backends):
                    vals, errs = [], []
                    for strat in strategies:
                        s = next((x for x in scal if x.setup == setup and x.strategy == strat
                                  and x.backend == backend), None)
                        vals.append(s.scaling if s else 0.0)
                        errs.append((s.scaling_std or 0.0) if s else 0.0)
                    xs = [i + (k - (len(backends) - 1) / 2) * width for i in range(len(strategies))]
                    ax.bar(xs, vals, width, yerr=errs, label=backend, capsize=2)
                ax.set_xticks(range(len(strategies)))
                ax.set_xticklabels([STRATEGY_LABEL.get(s, s) for s in strategies], rotation=30)
                ax.axhline(1.0, color="grey", lw=0.8, ls="--")
                ax.set_title(f"{model} {setup}")
                ax.grid(axis="y", alpha=0.3)
            axes[0][0].set_ylabel("scaling factor S_n = T_n / (n T_1)")
            axes[0][-1].legend(title="backend")
            written.append(save_figure(fig, out_dir / f"scaling_{model}.png"))
    return written


def save_figure(fig: Any, path: Path) -> str:
    """Lays out, writes (PNG, 110 dpi) and closes a matplotlib figure; returns the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def row_name(rec: dict[str, Any]) -> str:
    """A run's row, "strategy@backend" (as --rows and a profile's computed rows name it)."""
    return f"{rec.get('strategy')}@{rec.get('backend')}"


def _of_rows(rec: dict[str, Any], rows: set[str]) -> bool:
    """rec is a run (not a T_1) of one of `rows`."""
    return rec.get("kind") != "baseline" and row_name(rec) in rows


def _remeasured(rec: dict[str, Any], setups: set[str], rows: set[str]) -> bool:
    """rec belongs to one of `setups`: a run on it, or T_1 under its CPU sharing; with `rows`
    ("strategy@backend"), only a run of one of those rows on it."""
    if rows:
        return rec.get("setup") in setups and _of_rows(rec, rows)
    if rec.get("kind") == "baseline":
        return int(rec.get("concurrency") or 1) > 1 and rec.get("for_setup") in setups
    return rec.get("setup") in setups


def _file_of(name: str, setups: set[str], rows: set[str]) -> bool:
    """A runs/ or logs/ file name (study_plan's Run.key, Baseline.key) of one of `setups`
    (with `rows`, of one of those rows on it)."""
    if rows:
        return any(f"_{s}_{r.replace('@', '_').replace('+', '-')}_" in name
                   for s in setups for r in rows)
    parts = name.split("_")
    return (len(parts) > 1 and parts[1] in setups) or any(f"_for{s}_" in name for s in setups)


def _check_link_rates(new: list[dict[str, Any]], dilation: dict[str, Any],
                      into_dir: Path) -> None:
    """Runs across nodes measured at another link rate than the study's (another time
    dilation) would mix two emulated clusters in one table: refused. One node's ranks talk
    over its loopback, so its runs merge whatever rate their study computed."""
    for rec in new:
        if rec.get("kind") != "train" or int(rec.get("nodes") or 1) < 2:
            continue
        entry = dilation.get(rec.get("model"))
        want = _num(entry.get("rate_bits")) if isinstance(entry, dict) else None
        got = _num(rec.get("rate_bits"))
        if want is not None and got is not None and int(got) != int(want):
            raise ValueError(
                f"{rec.get('model')} on {rec.get('setup')} was measured with links at "
                f"{int(got)} bit/s, the study in {into_dir} at {int(want)} bit/s (its time "
                f"dilation): measure again with --dilation-of {into_dir}")


def merge(new_dir: Path, into_dir: Path, why: str, rows: Sequence[str] = ()) -> Path:
    """Puts the setups measured in new_dir (a study run with --setups) into the study of
    into_dir in place of its own: their runs, their T_1 under the same CPU sharing, their
    files; into_dir keeps its single-rank T_1 alone (and so its time dilation) and every
    other setup. With `rows` ("strategy@backend"), only those rows of the setups are put in
    place of (or beside) the study's, which keeps the setups' T_1 and other rows. meta.json's
    "reruns" says which setups (and rows) were measured again, when and why; the summary,
    plots and report are built again."""
    wanted = set(rows)
    new = [r for r in read_runs_csv(new_dir / "runs.csv") if not wanted or _of_rows(r, wanted)]
    setups = {r["setup"] for r in new if r.get("kind") == "train" and r.get("setup") != "1x1"}
    if not setups:
        raise ValueError(f"{new_dir / 'runs.csv'}: no runs on a setup other than 1x1")
    meta_path = into_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    if not isinstance(meta, dict) or not isinstance(meta.get("dilation", {}), dict):
        raise ValueError(f"{meta_path}: not a study's meta.json")
    _check_link_rates(new, meta.get("dilation", {}), into_dir)
    old = read_runs_csv(into_dir / "runs.csv")
    kept = [r for r in old if not _remeasured(r, setups, wanted)]
    records = kept + [r for r in new if _remeasured(r, setups, wanted)]
    for sub in ("runs", "logs"):
        for path in (into_dir / sub).glob("*"):
            if _file_of(path.stem, setups, wanted):
                path.unlink()
        for path in (new_dir / sub).glob("*"):
            if _file_of(path.stem, setups, wanted):
                shutil.copy2(path, into_dir / sub / path.name)
    write_runs_csv(into_dir / "runs.csv", records)
    new_meta = json.loads((new_dir / "meta.json").read_text())
    meta.setdefault("reruns", []).append({
        "setups": sorted(setups), **({"rows": sorted(wanted)} if wanted else {}),
        "started": new_meta.get("started"),
        "finished": new_meta.get("finished"), "steps": new_meta.get("steps"),
        "warmup": new_meta.get("warmup"), "min_window_s": new_meta.get("min_window_s"),
        "reps": new_meta.get("reps"), "cpu": new_meta.get("environment", {}).get("cpu"),
        "why": why})
    meta_path.write_text(json.dumps(meta, indent=1))
    return build(into_dir)


def build(out_dir: Path) -> Path:
    """Rebuilds summary.csv, the plots and report.md from runs.csv and meta.json."""
    records = read_runs_csv(out_dir / "runs.csv")
    meta_path = out_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    write_summary_csv(out_dir / "summary.csv", summarize(records))
    plots = make_plots(out_dir, records, meta)
    import study_long

    long_rows = study_long.time_to_target(records)
    if long_rows:
        study_long.write_csv(out_dir / "time_to_target.csv", long_rows)
        plots += study_long.make_plots(out_dir, records)
    return write_report(out_dir, records, meta, plots)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    print(build(Path(sys.argv[1])))
