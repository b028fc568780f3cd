#!/usr/bin/env python3
"""The main job: nanoccl against Gloo on the emulated nano-cluster.

On 2 nodes x 2 ranks joined by 1 Gbit/s links (network namespaces, tc tbf;
see emucluster.py) it runs, in one cluster:

  1. nanoccl-perf allreduce --ab gloo over 1M..256M (calls interleaved per size),
     nanoccl lossless;
  2. the same with --compression auto: per call, the algorithm and codec the cost
     model predicts fastest from the link profile measured at start-up
     (docs/tuning.md), again against Gloo in the same job;
  3. a short DDP training of an MLP, steps interleaved (bench/ab_ddp.py): Gloo,
     nanoccl lossless, and nanoccl compressing across nodes (--hook-codec, int8
     by default) through the error-feedback hook with the tuned bucket size:
     mean step time, final loss, speedup.

and prints one summary table, writes results/ab/ab_main.json, allreduce.csv,
ddp.csv and ab_main.png (busbw vs size, step-time bars).

Side A is the backend under test: "nanoccl" as soon as `import nanoccl`
registers it; until then both sides run Gloo and every output says so.

    python bench/ab_main.py                 # the full job (~5 min on 2 cores)
    python bench/ab_main.py --quick         # a smoke run (~1 min)
    python bench/ab_main.py --no-shaping    # without root: loopback, no rate limit
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence, TextIO

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from ab_ddp import nanoccl_status  # noqa: E402
from emucluster import (EmuCluster, NoPrivilegeError, NO_PRIVILEGE_HELP,  # noqa: E402
                        format_rate)

PERF_SCRIPT = REPO / "torch_ext" / "nanoccl" / "perf.py"
DDP_SCRIPT = BENCH / "ab_ddp.py"


class Tee(io.TextIOBase):
    """Writes to a stream and keeps the lines (the cluster's streamed output)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.lines.extend(text.splitlines())
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="A/B of nanoccl against Gloo on the emulated "
                                            "nano-cluster (the main job).")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--procs-per-node", type=int, default=2)
    p.add_argument("--rate", default="1gbit", help="node link rate (tc syntax, default 1gbit)")
    p.add_argument("--backend", default=None,
                   help="side A (default: nanoccl when it imports, else gloo)")
    p.add_argument("--ref", default="gloo", help="side B, the reference (default gloo)")
    p.add_argument("-b", "--minbytes", default="1M")
    p.add_argument("-e", "--maxbytes", default="256M")
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("--iter-budget", default="1G",
                   help="per size and backend, iterations x size stays under this (default 1G)")
    p.add_argument("--steps", type=int, default=40, help="DDP steps per backend (default 40)")
    p.add_argument("--hook-codec", default="int8",
                   help="codec of the compressed DDP side (error-feedback hook, tuned bucket); "
                        "'none': no such side and no --compression auto allreduce job")
    p.add_argument("--out", default=str(REPO / "results" / "ab"), help="results directory")
    p.add_argument("--no-shaping", action="store_true",
                   help="no namespaces/tbf: the same launch on the host loopback")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1M..16M, 5 iterations, 12 DDP steps")
    p.add_argument("--timeout", type=float, default=1200.0, help="per job, seconds")
    args = p.parse_args(argv)
    if args.quick:
        args.maxbytes, args.iters, args.steps = "16M", 5, 12
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    usable, where = nanoccl_status()
    side_a = args.backend or ("nanoccl" if usable else "gloo")
    standin = side_a == args.ref
    if standin and not usable:
        print(f"ab_main: nanoccl is not available yet ({where}); running {args.ref} against "
              f"{args.ref} to exercise the A/B machinery. These are NOT nanoccl numbers.")
    cluster = EmuCluster(nodes=args.nodes, procs_per_node=args.procs_per_node, rate=args.rate,
                         shaping=not args.no_shaping)
    started = time.time()
    meta: dict[str, Any] = {
        "nodes": args.nodes, "procs_per_node": args.procs_per_node,
        "rate": args.rate if not args.no_shaping else "unshaped loopback",
        "side_a": side_a, "side_b": args.ref, "nanoccl_available": usable, "nanoccl": where,
        "standin": standin, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    perf_json = out_dir / "perf_allreduce.json"
    auto_json = out_dir / "perf_allreduce_auto.json"
    ddp_json = out_dir / "ddp.json"
    compressed = side_a == "nanoccl" and args.hook_codec not in ("", "none")
    if compressed:
        meta["hook_codec"] = args.hook_codec
    status = {"perf": -1, "ddp": -1} | ({"perf_auto": -1} if compressed else {})
    try:
        with cluster:
            if cluster.shaping and cluster.rate_bits is not None:
                meta["rate_bits"] = cluster.rate_bits
                meta["tbf"] = cluster.tbf_params()
                if args.nodes >= 2:
                    meta["tcp_goodput_mbit"] = cluster.netcheck(seconds=3.0)
                    print("ab_main: link TCP goodput " + ", ".join(
                        f"{k} {v:.0f} Mbit/s" for k, v in meta["tcp_goodput_mbit"].items()))
            # The tuned sides measure the links at start-up into a file of this run's: a saved
            # profile may be of other links (--no-shaping, another rate), and the user's saved
            # profile is left alone.
            profile = out_dir / "link_profile.txt"
            env = {"OMP_NUM_THREADS": "1", "NANOCCL_TUNING_FILE": str(profile.resolve())}
            jobs = {
                "perf": [str(PERF_SCRIPT), "-c", "allreduce", "-b", args.minbytes,
                         "-e", args.maxbytes, "-f", "2", "-w", "1", "-n", str(args.iters),
                         "--iter-budget", args.iter_budget, "--min-iters", "3",
                         "--backend", side_a, "--ab", args.ref, "--json", str(perf_json)],
            }
            if compressed:
                jobs["perf_auto"] = jobs["perf"][:jobs["perf"].index("--json")] + [
                    "--compression", "auto", "--json", str(auto_json)]
            jobs["ddp"] = [str(DDP_SCRIPT), "--backend", side_a, "--ab", args.ref,
                           "--steps", str(args.steps), "--json", str(ddp_json)] + (
                ["--hook-codec", args.hook_codec] if compressed else [])
            meta["link_bytes"] = {}
            for name, job in jobs.items():
                print(f"ab_main: == {name}: {' '.join(job)}", flush=True)
                before = cluster.link_bytes()
                t0 = time.time()
                job_env = dict(env, NANOCCL_TUNING="measure") if name == "perf_auto" else env
                status[name] = cluster.run(job, timeout_s=args.timeout, env=job_env)
                meta[f"{name}_seconds"] = round(time.time() - t0, 1)
                after = cluster.link_bytes()
                meta["link_bytes"][name] = {
                    f"n{i}": {"tx": after[i].tx_bytes - before[i].tx_bytes,
                              "rx": after[i].rx_bytes - before[i].rx_bytes} for i in after}
                if status[name] != 0:
                    print(f"ab_main: {name} failed with exit status {status[name]}")
    except NoPrivilegeError as exc:
        print(NO_PRIVILEGE_HELP.format(reason=exc), file=sys.stderr)
        return 2
    meta["seconds"] = round(time.time() - started, 1)
    perf = _load(perf_json) if status["perf"] == 0 else None
    auto = _load(auto_json) if status.get("perf_auto") == 0 else None
    ddp = _load(ddp_json) if status["ddp"] == 0 else None
    rate_label = (format_rate(cluster.rate_bits) if cluster.rate_bits and not args.no_shaping
                  else "unshaped loopback")
    title = (f"{side_a} vs {args.ref}" + (" (stand-in: nanoccl not built)" if standin and not
                                          usable else "")
             + f" -- {args.nodes} nodes x {args.procs_per_node} ranks, {rate_label}")
    meta["title"] = title
    lines = summary(perf, ddp, meta, auto)
    print("\n".join(lines))
    _write_outputs(out_dir, meta, perf, ddp, lines, auto)
    failed = [k for k, v in status.items() if v != 0]
    wrong = sum(r["wrong"] for job in (perf, auto) if job for r in job["rows"])
    if failed or wrong:
        print(f"ab_main: FAILED ({', '.join(failed) or ''}{' wrong results' if wrong else ''})")
        return 1
    return 0


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def summary(perf: dict[str, Any] | None, ddp: dict[str, Any] | None,
            meta: dict[str, Any], auto: dict[str, Any] | None = None) -> list[str]:
    lines = ["", "=" * 100, f"A/B: {meta['title']}", "=" * 100]
    if meta.get("standin"):
        lines.append("NOTE: side A is not nanoccl (" + meta["nanoccl"] + "): both sides run "
                     f"{meta['side_b']}; the speedups only show run-to-run noise.")
    if "tcp_goodput_mbit" in meta:
        lines.append("link TCP goodput (python stream, both directions at once): " + ", ".join(
            f"{k} {v:.0f} Mbit/s" for k, v in meta["tcp_goodput_mbit"].items()))
    if perf:
        lines += _perf_table(perf)
    else:
        lines.append("allreduce: no results (the perf job failed)")
    if auto:
        lines += _perf_table(auto)
        lines.append("  (auto: the planner's choice per call from the link profile measured at "
                     "start-up; plan: the algorithm/codec it ran)")
    elif meta.get("hook_codec"):
        lines.append("allreduce, compression auto: no results (the perf_auto job failed)")
    if ddp:
        m = ddp["meta"]
        lines += ["", f"DDP: MLP {m['depth']}x{m['width']} ({m['params'] / 1e6:.1f} M params, "
                      f"{m['grad_bytes'] / 2**20:.0f} MiB gradients/step), batch "
                      f"{m['batch_per_rank']}/rank, {m['steps']} steps (first "
                      f"{m['warmup_steps']} untimed), steps interleaved",
                  f"{'side':>24}  {'bucket MB':>10}  {'mean step(ms)':>14}  {'median(ms)':>11}  "
                  f"{'samples/s':>10}  {'final loss':>11}  {'speedup':>8}"]
        sides = ddp["sides"]
        ref = sides[1] if len(sides) > 1 else sides[0]
        for side in sides:
            cap = side.get("bucket_cap_mb")
            shown = "25 (dflt)" if cap is None else f"{cap:g}" + (" tuned" if side.get("tuned")
                                                                  else "")
            lines.append(f"{side['label']:>24}  {shown:>10}  {side['mean_step_ms']:>14.1f}  "
                         f"{side['median_step_ms']:>11.1f}  {side['samples_per_s']:>10.1f}  "
                         f"{side['final_loss']:>11.6f}  "
                         f"{ref['mean_step_ms'] / side['mean_step_ms']:>8.3f}")
        if len(sides) > 1:
            lines.append(f"speedup = {ref['label']} step / side's step; max |param A - param B| "
                         f"after training ({sides[0]['label']}, {sides[1]['label']}): "
                         f"{ddp['max_param_diff']:.3g}")
    else:
        lines.append("DDP: no results (the training job failed)")
    if meta.get("link_bytes"):
        lines.append("")
        for job, nodes in meta["link_bytes"].items():
            lines.append(f"bytes on the node links during {job}: " + ", ".join(
                f"{n} sent {_mb(v['tx'])} received {_mb(v['rx'])}" for n, v in nodes.items()))
    lines.append(f"total {meta['seconds']:.0f} s")
    return lines


def _perf_table(perf: dict[str, Any]) -> list[str]:
    labels = perf["meta"]["labels"]
    lines = ["", f"allreduce float sum, {perf['meta']['world_size']} ranks "
                 f"(busbw = algbw x 2(n-1)/n; speedup = {labels[1]} time / {labels[0]} "
                 f"time, >1: {labels[0]} faster)",
             f"{'size':>8}  {'iters':>5}  " + "  ".join(
                 f"{lbl + ' time(ms)':>18}  {lbl + ' busbw(GB/s)':>20}" for lbl in labels)
             + f"  {'speedup':>8}  {'#wrong':>6}  plan"]
    by_size: dict[int, dict[str, Any]] = {}
    for row in perf["rows"]:
        by_size.setdefault(row["size"], {})[row["label"]] = row
    for size, pair in sorted(by_size.items()):
        a, b = pair[labels[0]], pair[labels[1]]
        lines.append(f"{_fmt_size(size):>8}  {a['iters']:>5}  " + "  ".join(
            f"{r['time_us'] / 1000:>18.2f}  {r['busbw']:>20.4f}" for r in (a, b))
            + f"  {b['time_us'] / a['time_us']:>8.3f}  {a['wrong'] + b['wrong']:>6}"
            + f"  {a.get('plan', '').replace('allreduce/', '')}")
    avg = [sum(r["busbw"] for r in perf["rows"] if r["label"] == lbl) / len(by_size)
           for lbl in labels]
    lines.append(f"avg busbw: {labels[0]} {avg[0]:.4f} GB/s, {labels[1]} {avg[1]:.4f} GB/s, "
                 f"ratio {avg[0] / avg[1]:.3f}")
    return lines


def _fmt_size(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _write_outputs(out_dir: Path, meta: dict[str, Any], perf: dict[str, Any] | None,
                   ddp: dict[str, Any] | None, lines: list[str],
                   auto: dict[str, Any] | None = None) -> None:
    (out_dir / "ab_main.json").write_text(json.dumps(
        {"meta": meta, "perf": perf, "perf_auto": auto, "ddp": ddp}, indent=1))
    (out_dir / "summary.txt").write_text("\n".join(lines) + "\n")
    jobs = [j for j in (perf, auto) if j]
    if jobs:
        with open(out_dir / "allreduce.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["size_bytes", "count", "type", "redop", "backend", "label", "iters",
                             "time_us", "algbw_gbs", "busbw_gbs", "min_us", "median_us",
                             "max_us", "wrong", "speedup", "plan"])
            for job in jobs:
                speedup = {(x["collective"], x["size"]): x["speedup"]
                           for x in job.get("speedup", [])}
                for r in job["rows"]:
                    writer.writerow([
                        r["size"], r["count"], r["type"], r["redop"], r["backend"], r["label"],
                        r["iters"], f"{r['time_us']:.1f}", f"{r['algbw']:.5f}",
                        f"{r['busbw']:.5f}", f"{r['min_us']:.1f}", f"{r['median_us']:.1f}",
                        f"{r['max_us']:.1f}", r["wrong"],
                        f"{speedup.get((r['collective'], r['size']), 1.0):.4f}",
                        r.get("plan", "")])
    if ddp:
        with open(out_dir / "ddp.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["label", "backend", "step", "step_ms", "loss"])
            for side in ddp["sides"]:
                for step, (ms, loss) in enumerate(zip(side["step_ms"], side["losses"])):
                    writer.writerow([side["label"], side["backend"], step, f"{ms:.2f}",
                                     f"{loss:.6f}"])
    try:
        plot(out_dir / "ab_main.png", meta, perf, ddp, auto)
    except ImportError as exc:
        print(f"ab_main: no plot ({exc})")
    print(f"ab_main: wrote {out_dir}/ab_main.json, summary.txt, allreduce.csv, ddp.csv, "
          "ab_main.png")


def plot(path: Path, meta: dict[str, Any], perf: dict[str, Any] | None,
         ddp: dict[str, Any] | None, auto: dict[str, Any] | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [2, 1]})
    colors = ["tab:blue", "tab:orange", "tab:green"]
    if perf:
        labels = perf["meta"]["labels"]
        for k, lbl in enumerate(labels):
            rows = sorted((r for r in perf["rows"] if r["label"] == lbl), key=lambda r: r["size"])
            ax1.plot([r["size"] for r in rows], [r["busbw"] for r in rows], "o-",
                     color=colors[k % 2], label=lbl)
        tops = [r["busbw"] for r in perf["rows"]]
        if auto:
            lbl = auto["meta"]["labels"][0]
            rows = sorted((r for r in auto["rows"] if r["label"] == lbl), key=lambda r: r["size"])
            ax1.plot([r["size"] for r in rows], [r["busbw"] for r in rows], "o-",
                     color=colors[2], label=f"{lbl} (own run against gloo)")
            tops += [r["busbw"] for r in rows]
        goodput = meta.get("tcp_goodput_mbit")
        if goodput:
            gbs = sum(goodput.values()) / len(goodput) / 8 / 1000
            ax1.axhline(gbs, ls="--", color="gray", lw=1,
                        label=f"link TCP goodput, measured ({gbs:.3f} GB/s)")
            tops.append(gbs)
        if meta.get("rate_bits"):
            line = meta["rate_bits"] / 8 / 1e9
            ax1.axhline(line, ls=":", color="black", lw=1, label=f"line rate ({line:.3f} GB/s)")
            tops.append(line)
        ax1.set_ylim(0, max(tops) * 1.15)
        ax1.set_xscale("log", base=2)
        sizes = sorted({r["size"] for r in perf["rows"]})
        ax1.set_xticks(sizes, [_fmt_size(s) for s in sizes])
        ax1.legend(loc="lower right")
    ax1.set_xlabel("message size (bytes)")
    ax1.set_ylabel("allreduce busbw (GB/s)")
    ax1.set_title("nanoccl-perf allreduce")
    ax1.grid(True, alpha=0.3)
    if ddp:
        sides = ddp["sides"]
        warm = ddp["meta"]["warmup_steps"]
        means = [s["mean_step_ms"] for s in sides]
        lows = [max(0.0, s["mean_step_ms"] - min(s["step_ms"][warm:])) for s in sides]
        highs = [max(0.0, max(s["step_ms"][warm:]) - s["mean_step_ms"]) for s in sides]
        bars = ax2.bar([s["label"] for s in sides], means, yerr=[lows, highs], capsize=6,
                       color=colors[: len(sides)])
        for bar, side in zip(bars, sides):
            ax2.annotate(f"{side['mean_step_ms']:.0f} ms\nloss {side['final_loss']:.4f}",
                         (bar.get_x() + bar.get_width() / 2, bar.get_height() / 2),
                         ha="center", va="center", color="white", fontsize=9)
        if len(sides) > 1:
            ax2.set_title("DDP step time (speedup vs " + sides[1]["label"] + ": " + ", ".join(
                f"{means[1] / m:.2f}" for k, m in enumerate(means) if k != 1) + ")")
            ax2.tick_params(axis="x", labelsize=8)
        ax2.set_ylabel("mean step time (ms), bars: min..max")
    else:
        ax2.set_title("DDP: no results")
    fig.suptitle(meta["title"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
