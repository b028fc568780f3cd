"""nanoccl-advise --check: run the recommended configurations and print predicted against
measured.

    nanoccl-advise --model gpt2-small --batch 16 --cluster 2x2 --inter-gbps 1 \\
        --step-seconds 0.556 --check 2 --check-model gpt2-tiny

The check runs on the emulated cluster of this machine (bench/emucluster.py: one network
namespace per node, tc-shaped links; root needed), with the reference trainers
(trainers/train.py) through the study runner's own functions (bench/study.py), so it needs
the nanoccl repository. Its steps:

1. Time dilation, the study's method (bench/study.py; ``--check-dilation auto``): this CPU
   computes far slower than the devices advised for, so the emulated link runs at
   ``--inter-gbps`` / D, with D chosen so that moving the check model's fp32 gradients over
   it takes the same share of one rank's step here as the advised model's gradients over
   --inter-gbps take of --step-seconds. (For GPT-2 small on an A40 at 1 GbE this is the
   study's own reference, so the check runs under the study's dilation.) ``none`` keeps
   --inter-gbps; a number is D itself.
2. T_1: one rank's step on the whole global batch, measured while as many single-rank runs
   as the cluster has ranks share this machine (the study's t1_shared): the compute each rank
   of the check gets.
3. The links: nanoccl-tune measures the emulated cluster (latency and bandwidth per link
   class, this machine's reduce and codec rates, the cores a rank gets); the advisor predicts
   every configuration again from that profile and T_1, for the check's model and batch.
4. The configurations the advice ranked best (``--check N``), and stock DP (DDP's buckets,
   no codec: what the speed-ups are against), each trained for ``--check-steps`` steps; the
   step time is the trainer's mean over the steps after warm-up.

Output: each configuration's predicted and measured step time and scaling factor
S = T_1 / (n x step), the relative error of S, and the speed-up over stock DP predicted and
measured; check.md and check.json in ``--check-out`` beside the runs' logs and JSON.

A tool of the repository, not of the package: nanoccl-advise runs it as a program
(``python bench/advise_check.py REQUEST.json``, the advice and the options as JSON), so that
the installed package imports nothing from bench/ or trainers/.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))

from nanoccl import advise  # noqa: E402
from nanoccl.advise_traffic import AdviseError, Cluster, model_spec  # noqa: E402


@dataclass
class CheckRow:
    label: str
    predicted_step_s: float
    measured_step_s: float | None  # None: the run failed (error says why)
    predicted_S: float
    measured_S: float | None
    error: str = ""

    @property
    def rel_error(self) -> float | None:
        """(predicted S - measured S) / measured S."""
        if not self.measured_S:
            return None
        return (self.predicted_S - self.measured_S) / self.measured_S


def study_module() -> Any:
    """bench/study.py (the study runner) from the repository; AdviseError without it."""
    bench = REPO / "bench"
    if not (bench / "study.py").is_file() or not (REPO / "trainers" / "train.py").is_file():
        raise AdviseError("--check runs the reference trainers on the emulated cluster: it "
                          "needs the nanoccl repository (bench/, trainers/), not only the "
                          "installed package")
    for path in (str(bench), str(REPO)):
        if path not in sys.path:
            sys.path.insert(0, path)
    import study  # noqa: PLC0415

    return study


def config_key(cfg: Any) -> tuple[Any, ...]:
    """What makes two configurations the same run, whatever model they are for: DDP's tuned
    bucket size depends on the model, so it counts only as tuned or not."""
    return (cfg.strategy, cfg.codec, cfg.gather_codec, cfg.bucket_mb is not None,
            cfg.microbatches, cfg.schedule if cfg.strategy == "pp" else "",
            getattr(cfg, "sync_every", 0), getattr(cfg, "fragments", 1),
            getattr(cfg, "overlap_steps", 0))


def trainer_args(cfg: Any) -> tuple[str, list[str]]:
    """The trainer's --backend and its extra arguments for a configuration."""
    backend = "nanoccl" if cfg.codec == "none" else f"nanoccl+{cfg.codec}"
    if cfg.gather_codec != "none":  # the trainers' +qwz (+qwz4) gathers parameters as int8 (int4)
        suffix = {"int8": "+qwz", "int4": "+qwz4"}.get(cfg.gather_codec)
        if suffix is None or cfg.codec == "none":
            raise ValueError(f"the trainers gather parameters as int8 or int4 beside a gradient "
                             f"codec, not {cfg.gather_codec} with {cfg.codec}")
        backend += suffix
    extra: list[str] = []
    if cfg.strategy in ("dp", "zero1") and cfg.bucket_mb is not None:
        extra += ["--bucket-cap-mb", f"{cfg.bucket_mb:g}"]
    if cfg.strategy == "pp":
        extra += ["--microbatches", str(cfg.microbatches), "--schedule", cfg.schedule]
    if cfg.strategy == "diloco":
        extra += ["--sync-every", str(cfg.sync_every), "--fragments", str(cfg.fragments),
                  "--overlap-steps", str(cfg.overlap_steps)]
    return backend, extra


def pick(advised: Sequence[Any], top: int) -> list[Any]:
    """The `top` best runnable configurations of the advice that train as DP does (not DiLoCo:
    a few steps show nothing of its outer steps), and stock DP after them."""
    chosen = [c for c in advised if not c.refused and c.strategy != "diloco"][:top]
    stock = advise.stock_dp(advised)
    if stock is not None and all(config_key(c) != config_key(stock) for c in chosen):
        chosen.append(stock)
    return chosen


def dilate(study: Any, model: str, mode: str, inter_gbps: float, here_s: float,
           here_params: int, advised_step_s: float, advised_params: int) -> Any:
    """The emulated link (a study.Dilation): --inter-gbps divided by D (module docstring)."""
    base = int(inter_gbps * 1e9)
    if mode == "auto":
        advised_comm_s = advised_params * 32 / base  # fp32 gradients over the advised link
        ratio = advised_step_s / advised_comm_s
        rate = int(here_params * 32 / (here_s / ratio))
        factor = base / rate
        return study.Dilation(model, rate, factor, (
            f"D = {factor:.1f}: the advised device takes {advised_step_s:.3f} s a step against "
            f"{advised_comm_s:.3f} s for its gradients at {inter_gbps:g} Gbit/s (ratio "
            f"{ratio:.3f}); one rank here takes {here_s:.3f} s, so {here_params * 4 / 1e6:.2f} "
            f"MB of gradients must take {here_s / ratio:.3f} s: links at "
            f"{study.rate_text(rate)} stand for {inter_gbps:g} Gbit/s"))
    try:
        return study.compute_dilation(model, mode, base, here_s, here_params)
    except ValueError as exc:
        raise AdviseError(f"--check-dilation: {exc}") from None


def run_check(cluster: Cluster, advised: Sequence[Any], top: int, model: str, batch: int,
              inter_gbps: float, advised_step_s: float, advised_params: int,
              dilation: str = "auto", steps: int = 6, warmup: int = 2,
              out_dir: Path | None = None, timeout_s: float = 900.0,
              codecs: Sequence[str] | None = None, log: Any = None) -> list[CheckRow]:
    """Runs pick(advised, top) on the emulated cluster (module docstring) and returns a row
    per configuration, in that order; progress and the table go to `log` (stdout)."""
    log = log or sys.stdout

    if top < 1:
        raise AdviseError(f"--check {top}: give how many of the best configurations to run")
    study = study_module()
    spec = model_spec(model, batch)
    chosen = pick(advised, top)
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="nanoccl-check-"))
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    prof = study.Profile("check", (model,), {model: ()}, (str(cluster),), ("nanoccl",),
                         {model: (batch,)}, {model: batch}, steps=steps, warmup=warmup)

    def t1(concurrency: int) -> tuple[float, int]:
        base = study.Baseline(model, batch, concurrency, 0, for_setup=str(cluster))
        recs = study.run_baseline(base, prof, out, timeout_s)
        ok = [r for r in recs if r["status"] == "ok"]
        if len(ok) != len(recs):
            bad = next(r for r in recs if r["status"] != "ok")
            raise AdviseError(f"single-rank {model} run failed ({bad.get('error')}); its log: "
                              f"{out / bad['log']}")
        return (statistics.median(float(r["step_time_mean_s"]) for r in ok),
                int(ok[0]["params"]))

    alone_s, params = t1(1)
    dil = dilate(study, model, dilation, inter_gbps, alone_s, params, advised_step_s,
                 advised_params)
    print(f"check: one rank here takes {alone_s:.3f} s a step of {model} b{batch}; time "
          f"dilation {dil.text}", file=log, flush=True)
    one_device_s, _ = t1(cluster.world)
    print(f"check: T_1 with {cluster.world} single-rank runs sharing this machine: "
          f"{one_device_s:.3f} s", file=log, flush=True)

    rate = f"{dil.rate_bits}bit" if dil.rate_bits else "none"
    rows: list[CheckRow] = []
    try:
        emu = study.EmuCluster(nodes=cluster.nodes, procs_per_node=cluster.per_node, rate=rate)
        with emu:
            profile_path = out / "link_profile.txt"
            with (out / "logs" / "tune.log").open("w") as fh:
                rc = emu.run(["-m", "nanoccl.tune", "--file", str(profile_path)],
                             timeout_s=timeout_s, out=fh)
            if rc != 0:
                raise AdviseError(f"nanoccl-tune on the emulated cluster failed (exit {rc}); "
                                  f"its log: {out / 'logs' / 'tune.log'}")
            profile = advise.profile_from_file(str(profile_path))
            predicted = advise.advise(spec, cluster, profile, one_device_s, math.inf,
                                      codecs=codecs or advise.CODECS)
            by_key = {config_key(c): c for c in predicted}
            for cfg in chosen:
                mine = by_key.get(config_key(cfg))
                if mine is None or mine.refused:
                    why = mine.refused if mine else f"not a configuration of {model} b{batch}"
                    rows.append(CheckRow(cfg.label, math.nan, None, math.nan, None,
                                         f"not run: {why}"))
                    continue
                backend, extra = trainer_args(mine)
                run = study.Run(model, mine.strategy, backend,
                                study.Setup(cluster.nodes, cluster.per_node), batch, len(rows))
                print(f"check: {mine.label} ...", file=log, flush=True)
                rec = study.run_in_cluster(emu, run, prof, out, timeout_s, dil, extra)
                if rec["status"] != "ok":
                    rows.append(CheckRow(mine.label, mine.step_s, None, mine.scaling, None,
                                         f"failed: {rec.get('error')}; log {out / rec['log']}"))
                    continue
                step = float(rec["step_time_mean_s"])
                rows.append(CheckRow(mine.label, mine.step_s, step, mine.scaling,
                                     one_device_s / (cluster.world * step)))
    except study.NoPrivilegeError as exc:
        raise AdviseError(f"--check needs network namespaces (root): {exc}") from None
    except study.EmuClusterError as exc:
        raise AdviseError(f"--check: the emulated cluster failed: {exc}") from None
    text = check_table(rows, model, batch, cluster, dil.text, one_device_s)
    (out / "check.md").write_text(text + "\n")
    (out / "check.json").write_text(json.dumps({
        "model": model, "batch": batch, "cluster": str(cluster), "dilation": dil.text,
        "rate_bits": dil.rate_bits, "t1_alone_s": alone_s, "t1_shared_s": one_device_s,
        "steps": steps, "warmup": warmup,
        "rows": [{**asdict(r), "rel_error": r.rel_error} for r in rows]}, indent=1) + "\n")
    print(text, file=log)
    print(f"check: wrote {out / 'check.md'}, {out / 'check.json'} (runs' logs in {out})",
          file=log, flush=True)
    return rows


def check_table(rows: Sequence[CheckRow], model: str, batch: int, cluster: Cluster,
                dilation: str, t1_s: float) -> str:
    """Predicted against measured, as Markdown; x stock DP against the last row that is stock
    DP (pick() puts it last)."""
    stock = next((r for r in reversed(rows) if r.label == "DP (DDP buckets)"), None)

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}" if a and b and math.isfinite(a) and math.isfinite(b) else "-"

    def num(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None and math.isfinite(v) else "-"

    lines = [f"check on the emulated cluster: {model}, global batch {batch}, {cluster}; "
             f"T_1 {t1_s:.3f} s (shared as the ranks share this machine); {dilation}", "",
             "| configuration | step s predicted | step s measured | S predicted | S measured | "
             "error of S | x stock DP predicted | x stock DP measured | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        err = r.rel_error
        lines.append(
            f"| {r.label} | {num(r.predicted_step_s, '.3f')} | {num(r.measured_step_s, '.3f')} "
            f"| {num(r.predicted_S, '.3f')} | {num(r.measured_S, '.3f')} | "
            f"{'-' if err is None else f'{err:+.0%}'} | "
            f"{ratio(stock.predicted_step_s, r.predicted_step_s) if stock else '-'} | "
            f"{ratio(stock.measured_step_s, r.measured_step_s) if stock else '-'} | {r.error} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the check nanoccl-advise asks for: argv[0] is its request (JSON)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python bench/advise_check.py REQUEST.json (written by nanoccl-advise "
              "--check)", file=sys.stderr)
        return 2
    req = json.loads(Path(args[0]).read_text())
    advised = [advise.Config(**c) for c in req["advised"]]
    try:
        run_check(advise.parse_cluster(req["cluster"]), advised, req["top"], req["model"],
                  req["batch"], req["inter_gbps"], req["advised_step_s"], req["advised_params"],
                  req["dilation"], req["steps"], req["warmup"],
                  Path(req["out_dir"]) if req["out_dir"] else None, codecs=req["codecs"])
    except AdviseError as exc:
        print(f"nanoccl-advise: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
