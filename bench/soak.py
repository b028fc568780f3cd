#!/usr/bin/env python3
"""A soak of nanoccl under faults, on the emulated cluster (not part of CI).

Jobs of a random mix of collectives, dtypes and sizes run one after another on the emulated
2 x 2 cluster; while they run, the driver kills a random rank (SIGKILL) or takes a node's link
down for a few seconds, at random moments. Each job that a fault broke is started again (the
"restart"). What is checked:

- every call is either correct (each rank derives every rank's inputs from a seed, so it knows
  the exact expected result: integers exactly, floats within reordering error) or raises;
- a job that a fault broke ends on every surviving rank with an error, within the process
  group's timeout (plus a grace for teardown): no hang, ever;
- nothing grows: a job runs the same schedule of calls `--rounds` times over one process
  group; each rank records open file descriptors, threads (nanoccl's own, named
  "nanoccl-*", and all) and RSS after every round. Counts must end where the first round left
  them. RSS moves by tens of MiB from round to round with the allocator's caching (as much
  under Gloo); what would betray a leak is a trend, so the soak reports the least-squares slope
  of RSS over the rounds after the first (which warms the allocator up), per rank and job;
  after every job no nanoccl segment is left in /dev/shm;
- teardown is prompt: each rank records how long destroy_process_group took.

    python bench/soak.py --minutes 30 --json results/soak/soak.json

Prints one line per job and a summary (calls, faults injected, errors, wrong results, hangs,
growth). Exit 0 when there was no wrong result and no hang. Needs root (namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OPS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "barrier",
       "send_recv", "reduce", "gather"]
DTYPES = ["float32", "float64", "int32", "int64", "bfloat16", "uint8"]
USAGE_KEYS = ("fds", "threads", "nanoccl_threads", "rss")  # what must not grow


# ----------------------------------------------------------------------------- rank program
def _inputs(torch: Any, seed: int, call: int, rank: int, n: int, dtype: Any) -> Any:
    g = torch.Generator().manual_seed(seed * 1_000_003 + call * 101 + rank)
    if dtype.is_floating_point:
        # Small integers: exact in every float type, so sums are exact whatever the order.
        return torch.randint(-8, 9, (n,), generator=g).to(dtype)
    hi = 2 if dtype == torch.uint8 else 100
    return torch.randint(0, hi, (n,), generator=g).to(dtype)


def _check(torch: Any, got: Any, want: Any) -> bool:
    return bool(torch.equal(got, want.to(got.dtype)))


def rank_program(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    import nanoccl  # noqa: F401 - registers the backend

    out_dir = Path(args.out)
    rank = int(os.environ["RANK"])
    (out_dir / f"pid{rank}").write_text(str(os.getpid()))
    log = open(out_dir / f"rank{rank}.jsonl", "a", buffering=1)

    def record(**kw: Any) -> None:
        log.write(json.dumps({"t": time.time(), "rank": rank, **kw}) + "\n")

    def usage() -> dict[str, int]:
        fds = len(os.listdir("/proc/self/fd"))
        tasks = os.listdir("/proc/self/task")
        threads = len(tasks)
        ours = 0  # nanoccl's own threads are named "nanoccl-<role>" (common/thread_name.h)
        for t in tasks:
            try:
                ours += Path(f"/proc/self/task/{t}/comm").read_text().startswith("nanoccl-")
            except OSError:
                pass  # a thread that just ended
        rss = 0
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
        return {"fds": fds, "threads": threads, "nanoccl_threads": ours, "rss": rss}

    import datetime

    ok = wrong = 0
    try:
        dist.init_process_group(args.backend,
                                timeout=datetime.timedelta(seconds=args.pg_timeout))
        world = dist.get_world_size()
        for rnd, call in ((r, c) for r in range(args.rounds) for c in range(args.calls)):
            if call == 0:
                rng = random.Random(args.seed)  # the same schedule on every rank, every round
            op = rng.choice(OPS)
            dtype = getattr(torch, rng.choice(DTYPES))
            n = rng.choice([1, 7, 1000, 65_537, 1 << 18, 1 << 20, 3 << 20])
            n = max(world, n - n % world) if op in ("reduce_scatter", "all_to_all") else n
            xs = [_inputs(torch, args.seed, call, r, n, dtype) for r in range(world)]
            sum_ok = dtype != torch.uint8  # uint8 sums wrap; use it for data movement only
            if op == "all_reduce" and sum_ok:
                t = xs[rank].clone()
                dist.all_reduce(t)
                good = _check(torch, t, sum(x.to(torch.float64) for x in xs))
            elif op == "reduce" and sum_ok:
                t = xs[rank].clone()
                dist.reduce(t, dst=call % world)
                good = rank != call % world or _check(torch, t, sum(x.double() for x in xs))
            elif op == "broadcast" or (op in ("all_reduce", "reduce") and not sum_ok):
                src = call % world
                t = xs[rank].clone()
                dist.broadcast(t, src=src)
                good = _check(torch, t, xs[src])
            elif op == "all_gather":
                outs = [torch.empty_like(xs[rank]) for _ in range(world)]
                dist.all_gather(outs, xs[rank])
                good = all(_check(torch, o, x) for o, x in zip(outs, xs))
            elif op == "gather":
                dst = call % world
                outs = [torch.empty_like(xs[rank]) for _ in range(world)] if rank == dst else None
                dist.gather(xs[rank], outs, dst=dst)
                good = rank != dst or all(_check(torch, o, x) for o, x in zip(outs, xs))
            elif op == "reduce_scatter" and sum_ok:
                chunk = n // world
                out = torch.empty(chunk, dtype=dtype)
                dist.reduce_scatter_tensor(out, xs[rank].clone())
                total = sum(x.double() for x in xs)
                good = _check(torch, out, total[rank * chunk:(rank + 1) * chunk])
            elif op == "all_to_all" or op == "reduce_scatter":
                out = torch.empty_like(xs[rank])
                dist.all_to_all_single(out, xs[rank])
                chunk = n // world
                want = torch.cat([x[rank * chunk:(rank + 1) * chunk] for x in xs])
                good = _check(torch, out, want)
            elif op == "send_recv":
                nxt, prv = (rank + 1) % world, (rank - 1) % world
                t = torch.empty_like(xs[prv])
                reqs = [dist.isend(xs[rank], nxt), dist.irecv(t, prv)]
                for r in reqs:
                    r.wait()
                good = _check(torch, t, xs[prv])
            else:
                dist.barrier()
                good = True
            ok += good
            wrong += not good
            if not good:
                record(kind="wrong", round=rnd, call=call, op=op, dtype=str(dtype), n=n)
            if call == args.calls - 1:
                record(kind="usage", round=rnd, **usage())
        record(kind="done", ok=ok, wrong=wrong)
        t0 = time.monotonic()
        dist.destroy_process_group()
        record(kind="destroyed", seconds=round(time.monotonic() - t0, 3))
        return 0 if wrong == 0 else 1
    except Exception as exc:  # noqa: BLE001 - what the soak checks is that it is clear
        record(kind="error", ok=ok, wrong=wrong, message=f"{type(exc).__name__}: {exc}"[:2000])
        log.close()
        # torchrun stops a node's other ranks as soon as one of them exits non-zero: linger
        # until they have reported too (or their timeout is long past), so that a rank the
        # launcher stopped is never taken for one that hung, nor the other way round.
        _linger_for_siblings(out_dir, args.pg_timeout + 5)
        os._exit(3)  # a broken group is not torn down


def _linger_for_siblings(out_dir: Path, limit_s: float) -> None:
    lws = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    first = int(os.environ.get("GROUP_RANK", "0")) * lws  # torchrun: a node's ranks are contiguous
    until = time.monotonic() + limit_s
    while time.monotonic() < until:
        reported = 0
        for r in range(first, first + lws):
            f = out_dir / f"rank{r}.jsonl"
            text = f.read_text() if f.exists() else ""
            reported += '"kind": "error"' in text or '"kind": "done"' in text
        if reported == lws:
            return
        time.sleep(0.1)


# ------------------------------------------------------------------------------------ driver
def _shm_segments() -> list[str]:
    try:
        return [n for n in os.listdir("/dev/shm") if n.startswith("nanoccl-")]
    except OSError:
        return []


def _slope(ys: list[float]) -> float:
    """Least-squares slope of ys over 0, 1, 2, ..."""
    n = len(ys)
    mx, my = (n - 1) / 2, sum(ys) / n
    den = sum((x - mx) ** 2 for x in range(n))
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / den if den else 0.0


def _read_records(d: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(d.glob("rank*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by SIGKILL
    return out


def soak(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import emucluster

    rng = random.Random(args.seed)
    totals: dict[str, Any] = {"jobs": 0, "calls_ok": 0, "calls_wrong": 0, "faults": 0,
                              "kills": 0, "link_downs": 0, "jobs_failed_cleanly": 0,
                              "errors": 0, "hangs": 0, "shm_left": 0, "usage": [],
                              "error_examples": [], "minutes": args.minutes,
                              "rounds_per_job": args.rounds, "calls_per_round": args.calls,
                              "destroy_s_max": 0.0, "samples": []}
    soak_start = time.monotonic()
    deadline = soak_start + args.minutes * 60
    cluster = emucluster.EmuCluster(nodes=2, procs_per_node=2, rate=args.rate)
    with cluster:
        while time.monotonic() < deadline:
            job = totals["jobs"]
            totals["jobs"] += 1
            work = Path(tempfile.mkdtemp(prefix=f"nanoccl-soak{job}-"))
            seed = rng.randrange(1 << 30)
            fault = rng.random() < args.fault_rate
            kind = rng.choice(["kill", "link"]) if fault else "none"
            job_timeout = args.rounds * args.calls * 2.0 + args.pg_timeout * 3 + 60
            env = {"NANOCCL_ENCRYPT": "1" if rng.random() < 0.3 else "0"}
            status: dict[str, int] = {}

            def run() -> None:
                status["rc"] = cluster.run(
                    [str(Path(__file__).resolve()), "--rank-program", "--out", str(work),
                     "--seed", str(seed), "--calls", str(args.calls),
                     "--rounds", str(args.rounds), "--backend", args.backend,
                     "--pg-timeout", str(args.pg_timeout)],
                    timeout_s=job_timeout, env=env, out=open(work / "job.log", "w"),
                    fail_grace_s=args.pg_timeout + 15)

            started = time.monotonic()
            th = threading.Thread(target=run)
            th.start()
            fault_at = None
            victim_node = None
            # After start-up, at a random moment of the job (a round of 60 calls takes ~7 s);
            # a job that ended first gets none. Drawn now, so that a seed gives the same jobs.
            fault_after = rng.uniform(3.0, 7.0 * args.rounds * args.calls / 60)
            victim = rng.randrange(4)
            node = cluster.node_list[rng.randrange(2)]
            down = rng.uniform(1.0, 5.0)
            if fault:
                th.join(timeout=fault_after)
                fault = th.is_alive()
                kind = kind if fault else "none"
            if fault:
                fault_at = time.time()
                if kind == "kill":
                    pid_file = work / f"pid{victim}"
                    try:
                        os.kill(int(pid_file.read_text()), signal.SIGKILL)
                        totals["kills"] += 1
                        totals["faults"] += 1
                        # torchrun then stops the victim's sibling: only the other node's
                        # ranks are sure to report.
                        victim_node = victim // 2
                    except (OSError, ValueError):
                        fault_at = None  # the job had already ended
                        fault, kind = False, "none"
                else:
                    subprocess.run(["ip", "-n", node.netns, "link", "set", node.ifname, "down"],
                                   check=False)
                    time.sleep(down)
                    subprocess.run(["ip", "-n", node.netns, "link", "set", node.ifname, "up"],
                                   check=False)
                    totals["link_downs"] += 1
                    totals["faults"] += 1
            th.join()
            elapsed = time.monotonic() - started
            records = _read_records(work)
            ok = sum(r.get("ok", 0) for r in records if r["kind"] in ("done", "error"))
            wrong = sum(1 for r in records if r["kind"] == "wrong")
            errors = [r for r in records if r["kind"] == "error"]
            done = [r for r in records if r["kind"] == "done"]
            totals["calls_ok"] += ok
            totals["calls_wrong"] += wrong
            totals["errors"] += len(errors)
            # Every rank that was neither killed nor stopped by its node's torchrun must have
            # finished or raised: anything else hung (or died without a word).
            reported = {r["rank"] for r in done + errors}
            expected = {r for r in range(4) if victim_node is None or r // 2 != victim_node}
            silent = sorted(expected - reported)
            hung = status.get("rc") == 124 or bool(silent)
            totals["hangs"] += int(hung)
            slow = False
            if errors:
                totals["jobs_failed_cleanly"] += int(not hung)
                if len(totals["error_examples"]) < 8:
                    totals["error_examples"].append(errors[0]["message"][:300])
                if fault_at is not None and kind == "kill":
                    late = max(r["t"] for r in errors) - fault_at
                    totals.setdefault("error_latency_s", []).append(round(late, 2))
                    slow = late > args.slow_error_s
            destroyed = [r["seconds"] for r in records if r["kind"] == "destroyed"]
            totals["destroy_s_max"] = max([totals["destroy_s_max"], *destroyed])
            if not fault and len(done) == 4:
                use = [r for r in records if r["kind"] == "usage"]
                by_rank: dict[int, list[dict[str, Any]]] = {}
                for r in use:
                    by_rank.setdefault(r["rank"], []).append(r)
                for rk, rs in sorted(by_rank.items()):
                    rs.sort(key=lambda r: r["round"])
                    if len(rs) == args.rounds:
                        grown = {k: rs[-1][k] - rs[0][k] for k in USAGE_KEYS}
                        grown["rss_slope"] = _slope([r["rss"] for r in rs[1:]])
                        totals["usage"].append(grown)
                    # The time series: rank 0's figures after each round, job by job.
                    if rk == 0:
                        totals["samples"].append({
                            "minute": round((time.monotonic() - soak_start) / 60, 1),
                            "job": job,
                            **{k: [r[k] for r in rs] for k in USAGE_KEYS}})
            left = _shm_segments()
            totals["shm_left"] = max(totals["shm_left"], len(left))
            print(f"soak: job {job} seed {seed} fault {kind} encrypt {env['NANOCCL_ENCRYPT']}: "
                  f"exit {status.get('rc')}, {ok} calls ok, {wrong} wrong, {len(errors)} rank "
                  f"errors, {len(done)} ranks done, {elapsed:.0f} s"
                  + (f" HUNG (silent ranks {silent})" if hung else "")
                  + (f", /dev/shm left {left}" if left else ""),
                  flush=True)
            if not hung and not wrong and not left and not slow:
                subprocess.run(["rm", "-rf", str(work)], check=False)
            else:
                print(f"soak: job {job} kept in {work}"
                      + (" (an error came late after its fault)" if slow else ""), flush=True)
    return totals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank-program", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--calls", type=int, default=60, help="calls per round")
    p.add_argument("--rounds", type=int, default=4,
                   help="rounds of the same calls per job, at least 4 (the RSS trend is fitted "
                        "over the rounds after the first)")
    p.add_argument("--fault-rate", type=float, default=0.5, help="share of jobs with a fault")
    p.add_argument("--pg-timeout", type=float, default=20.0)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slow-error-s", type=float, default=5.0,
                   help="keep the files of a job whose ranks took longer to fail after a kill")
    p.add_argument("--backend", default="nanoccl", help=argparse.SUPPRESS)  # gloo: a reference
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.rounds < 4 and not args.rank_program:
        p.error("--rounds must be at least 4: growth is judged over rounds 2.. of a job")
    if args.rank_program:
        return rank_program(args)
    t = soak(args)
    usage = t.pop("usage")
    growth = {k: max((u[k] for u in usage), default=0) for k in USAGE_KEYS}  # counts
    t["max_growth_first_to_last_round"] = growth
    slopes = sorted(u["rss_slope"] for u in usage)
    t["rss_slope_mib_per_round"] = {
        "median": round(slopes[len(slopes) // 2] / 2**20, 2) if slopes else 0,
        "max": round(slopes[-1] / 2**20, 2) if slopes else 0,
        "share_positive": round(sum(x > 0 for x in slopes) / len(slopes), 2) if slopes else 0}
    t["fault_free_jobs_measured"] = len(usage) // 4
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(t, indent=2) + "\n")
    lat = t.get("error_latency_s", [])
    slope = t["rss_slope_mib_per_round"]
    print(f"soak: {t['minutes']} min, {t['jobs']} jobs, {t['calls_ok']} calls correct, "
          f"{t['calls_wrong']} wrong; {t['faults']} faults ({t['kills']} kills, "
          f"{t['link_downs']} link downs); {t['errors']} rank errors in "
          f"{t['jobs_failed_cleanly']} failed jobs, hangs {t['hangs']}; "
          f"max error latency after a fault {max(lat) if lat else '-'} s; growth from the "
          f"first to the last round of a fault-free job: fds {growth['fds']}, nanoccl threads "
          f"{growth['nanoccl_threads']} (all threads {growth['threads']}); RSS slope over "
          f"rounds 2.. {slope['median']} MiB/round median, {slope['max']} max, "
          f"{slope['share_positive']:.0%} positive; /dev/shm segments left {t['shm_left']}; "
          f"slowest destroy_process_group {t['destroy_s_max']} s")
    return 0 if t["calls_wrong"] == 0 and t["hangs"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
