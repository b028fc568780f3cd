"""What nanoccl-perf reports: the Row each side gives for a size, the statistics of its
per-iteration times, the nccl-tests table (header, one line per size, summary), the cost
model's predictions beside the measured times, the line of bytes nanoccl sent, and the JSON
document of --json. Nothing here talks to a process group: perf.py measures, this formats;
it imports nothing of perf.py (perf.py imports it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import torch


# ------------------------------------------------------------------- rows
@dataclass
class Side:
    """One backend under measurement and the group that runs it."""

    label: str
    backend: str
    group: Any
    codec: str | None = None  # nanoccl's inter-node compression (--compression)


@dataclass
class Row:
    """One size of one collective on one side: a group of columns, and a row of the JSON."""

    collective: str
    backend: str
    label: str
    size: int
    count: int
    type: str
    redop: str
    root: int
    iters: int
    time_us: float
    algbw: float
    busbw: float
    wrong: int
    min_us: float
    median_us: float
    max_us: float
    p99_us: float = 0.0
    # nanoccl with a link profile: what the planner ran for these calls (stats()["modelled"]
    # keys with the calls of this size, "+"-joined), e.g. "allreduce hierarchical int8".
    plan: str = ""


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 < q <= 100) by the nearest-rank method."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


# ------------------------------------------------------------- cost model
def modelled_since(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """What a group ran between two stats()["modelled"] views, per planner row with calls in
    between: {"what", "calls", "predicted_s", "measured_s"}, the times per call."""
    chose = []
    for what, cur in after.items():
        prev = before.get(what, {"calls": 0, "predicted_s": 0.0, "measured_s": 0.0})
        n = cur["calls"] - prev["calls"]
        if n > 0:
            chose.append({"what": what, "calls": n,
                          "predicted_s": (cur["predicted_s"] - prev["predicted_s"]) / n,
                          "measured_s": (cur["measured_s"] - prev["measured_s"]) / n})
    return chose


def _plans(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The modelled rows (planner choices) that ran calls between two _modelled() views
    (perf.py)."""
    return "+".join(c["what"] for c in modelled_since(old, new))


def _model_lines(side: Side, old: dict[str, Any], new: dict[str, Any], size: int) -> list[str]:
    """"#   model: ..." lines: the cost model's prediction beside the measured time, per call,
    for the calls of one size (rank 0's view; docs/tuning.md)."""
    lines = []
    for c in modelled_since(old, new):
        pred, meas = c["predicted_s"] * 1e6, c["measured_s"] * 1e6
        lines.append(f"#   model: {side.label} {size} B: {c['what']} predicted {pred:.1f} us, "
                     f"measured {meas:.1f} us (x{meas / pred if pred > 0 else float('nan'):.2f})")
    return lines


# ------------------------------------------------------------------- output
# Two layouts of the table. The default fits 120 columns with two sides: per side the time,
# busbw, #wrong and p99 (the type, op and root are the same on every line and go in the
# section's title). --wide prints nccl-tests' full columns and min / median / max as well.
_FIXED = {
    False: ("{:>12}  {:>11}", ("size", "count"), ("(B)", "(elements)")),
    True: ("{:>12}  {:>12}  {:>8}  {:>6}  {:>6}", ("size", "count", "type", "redop", "root"),
           ("(B)", "(elements)", "", "", "")),
}
_GROUP = {
    False: ("  {:>9}  {:>7}  {:>6}  {:>9}", ("time", "busbw", "#wrong", "p99"),
            ("(us)", "(GB/s)", "", "(us)")),
    True: ("  {:>10}  {:>7}  {:>7}  {:>6}  {:>10}  {:>10}  {:>10}  {:>10}",
           ("time", "algbw", "busbw", "#wrong", "min", "median", "p99", "max"),
           ("(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(us)")),
}


def header(labels: list[str], wide: bool = False) -> list[str]:
    fixed, group = _FIXED[wide], _GROUP[wide]
    fixed_w = len(fixed[0].format(*fixed[1]))
    group_w = len(group[0].format(*group[1]))
    lines = []
    if len(labels) > 1:
        top = "#" + " " * (fixed_w - 1) + "".join(f"{lbl[:group_w - 2]:^{group_w}}"
                                                  for lbl in labels)
        lines.append(top.rstrip())
    for k in (1, 2):
        line = "#" + fixed[0].format(*fixed[k])[1:]
        line += "".join(group[0].format(*group[k]) for _ in labels)
        if len(labels) > 1:
            line += "  {:>7}".format("speedup" if k == 1 else "(x)")
        line += "  {:>5}".format("iters" if k == 1 else "")
        lines.append(line)
    return lines


def format_rows(rows: list[Row], wide: bool = False) -> str:
    first = rows[0]
    if wide:
        line = _FIXED[True][0].format(first.size, first.count, first.type, first.redop,
                                      first.root)
    else:
        line = _FIXED[False][0].format(first.size, first.count)
    for row in rows:
        if wide:
            line += ("  {:>10.1f}  {:>7.3f}  {:>7.3f}  {:>6d}  {:>10.1f}  {:>10.1f}  {:>10.1f}"
                     "  {:>10.1f}").format(row.time_us, row.algbw, row.busbw, row.wrong,
                                           row.min_us, row.median_us, row.p99_us, row.max_us)
        else:
            line += "  {:>9.1f}  {:>7.3f}  {:>6d}  {:>9.1f}".format(row.time_us, row.busbw,
                                                                   row.wrong, row.p99_us)
    if len(rows) > 1:
        line += "  {:>7.3f}".format(rows[1].time_us / rows[0].time_us if rows[0].time_us else 0.0)
    line += "  {:>5d}".format(first.iters)
    return line


def summary_lines(rows: list[Row], labels: list[str]) -> list[str]:
    lines = []
    wrong = sum(r.wrong for r in rows)
    lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    avgs = []
    for label in labels:
        mine = [r.busbw for r in rows if r.label == label]
        avgs.append(statistics.fmean(mine) if mine else 0.0)
    if len(labels) == 1:
        lines.append(f"# Avg bus bandwidth    : {avgs[0]:.4f}")
    else:
        parts = "   ".join(f"{a:.4f} ({lbl})" for a, lbl in zip(avgs, labels))
        ratio = avgs[0] / avgs[1] if avgs[1] else 0.0
        lines.append(f"# Avg bus bandwidth    : {parts}   ratio {ratio:.3f} "
                     f"({labels[0]} / {labels[1]}, >1: {labels[0]} faster)")
    return lines


def _stats_line(stats: list[Any]) -> str:
    """Bytes all ranks sent through nanoccl, per link class (warm-up and checks included)."""
    if any("error" in s for s in stats):
        return f"nanoccl stats unavailable: {stats[0].get('error', '?')}"
    links: dict[str, int] = {}
    for s in stats:
        for link, counts in s.get("per_link", {}).items():
            links[link] = links.get(link, 0) + int(counts.get("bytes_sent", 0))
    rails: dict[str, int] = {}  # per network interface of tcp; only worth a word with several
    for s in stats:
        for ifname, counts in s.get("per_rail", {}).items():
            rails[ifname] = rails.get(ifname, 0) + int(counts.get("bytes_sent", 0))
    total = sum(int(s.get("bytes_sent", 0)) for s in stats)
    parts = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(links.items()))
    per_rail = ""
    if len(rails) > 1:
        per_rail = "; tcp per rail: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in rails.items())
    return (f"nanoccl sent {total / 1e6:.1f} MB over all ranks ({parts}{per_rail}), "
            "warm-up and checks included")


def _write_json(path: str, rows: list[Row], labels: list[str], sides: list[Side], world: int,
                nodes: int, local_world: int, device: torch.device, usable: bool, where: str,
                notes: list[str], args: argparse.Namespace, stats: list[Any] | None) -> None:
    speedups = []
    if len(labels) > 1:
        by_key: dict[tuple[str, int], dict[str, Row]] = {}
        for row in rows:
            by_key.setdefault((row.collective, row.size), {})[row.label] = row
        for (coll, size), pair in by_key.items():
            a, b = pair.get(labels[0]), pair.get(labels[1])
            if a and b and a.time_us > 0:
                speedups.append({"collective": coll, "size": size,
                                 "speedup": b.time_us / a.time_us})
    doc = {
        "tool": "nanoccl-perf",
        "meta": {
            "world_size": world, "nodes": nodes, "local_world_size": local_world,
            "labels": labels, "backends": [s.backend for s in sides],
            "device": device.type, "torch": torch.__version__, "host": platform.node(),
            "nanoccl_available": usable, "nanoccl": where, "notes": notes,
            "argv": sys.argv, "time": datetime.datetime.now().isoformat(timespec="seconds"),
            "env": {k: v for k, v in os.environ.items()
                    if k.startswith(("NANOCCL_", "GLOO_", "NCCL_"))},
        },
        "rows": [asdict(r) for r in rows],
        "speedup": speedups,
        "nanoccl_stats": stats,
    }
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, path)
