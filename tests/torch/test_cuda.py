"""nanoccl on CUDA tensors through torch.distributed (backend/cuda_work.h).

Skipped without a CUDA device (torch.cuda.is_available() is False) and in builds without
CUDA (the ranks report nanoccl's "built without CUDA" error and the test skips with it).

Topologies are emulated with NANOCCL_NODE_ID, one rank per process, rank r on cuda:devices[r]:
- "2x1-one-gpu": two one-rank "nodes" both on cuda:0 (what a one-GPU machine runs): no NCCL
  (it cannot put two ranks on one GPU), every call goes through pinned host staging;
- "1x2" (2 GPUs): one node, NCCL only; "2x2" (4 GPUs): NCCL inside nodes, staging across.

Each job checks every CUDA collective against a CPU reference (each rank rebuilds every rank's
input from its seed), the stream semantics (inputs made by a kernel on the caller's current
stream just before the call; the result read on that stream right after work.wait(), with no
synchronize in between; a side stream), the future, and prints allreduce timings per size for
the notes (never asserted).

This file is also the rank program: ``python test_cuda.py --rank R ...``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch

HERE = Path(__file__).resolve().parent

TOPOLOGIES: dict[str, tuple[list[str], list[int]]] = {
    # name: (node id per rank, device per rank)
    "2x1-one-gpu": (["node0", "node1"], [0, 0]),
    "1x2": (["node0", "node0"], [0, 1]),
    "2x2": (["node0", "node0", "node1", "node1"], [0, 1, 2, 3]),
}
NOT_BUILT = "built without CUDA"


# ---- the test (parent process) ----------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_ranks(topology: str, timeout: float) -> list[dict[str, Any]]:
    """Starts one process per rank; kills them all at `timeout`; returns their results."""
    nodes, devices = TOPOLOGIES[topology]
    world = len(nodes)
    workdir = Path(tempfile.mkdtemp(prefix="nanoccl-cuda-test-"))
    port = _free_port()
    procs: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "NANOCCL_SOCKET_IFNAME": "lo",
                "NANOCCL_NODE_ID": nodes[rank],
                "NCCL_SOCKET_IFNAME": "lo",
                "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1",
                "PYTHONFAULTHANDLER": "1",
            }
        )
        log, res = workdir / f"rank{rank}.log", workdir / f"rank{rank}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--rank", str(rank),
               "--world-size", str(world), "--device", str(devices[rank]),
               "--result", str(res), "--pg-timeout", "60"]
        with open(log, "wb") as out:
            procs.append((subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                           cwd=workdir), log, res))
    deadline = time.monotonic() + timeout
    for proc, _, _ in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    results: list[dict[str, Any]] = []
    problems: list[str] = []
    for rank, (proc, log, res) in enumerate(procs):
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            problems.append(f"rank {rank} hung: killed after {timeout} s")
        output = log.read_text(errors="replace")
        if not res.exists():
            problems.append(f"rank {rank} (exit {proc.returncode}) wrote no result:\n"
                            f"{output[-4000:]}")
            continue
        result = json.loads(res.read_text())
        result["output"] = output
        results.append(result)
    assert not problems, "\n".join(problems)
    return results


@pytest.mark.timeout(300)
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_cuda_collectives(topology: str) -> None:
    needed = max(TOPOLOGIES[topology][1]) + 1
    if torch.cuda.device_count() < needed:
        pytest.skip(f"{topology} needs {needed} CUDA devices, "
                    f"found {torch.cuda.device_count()}")
    results = _run_ranks(topology, timeout=280)
    skips = [r["skip"] for r in results if r.get("skip")]
    if skips:
        pytest.skip(skips[0])
    failures = [f"rank {r['rank']}: {f}" for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures[:60])
    assert all(r["checks"] > 50 for r in results), [r["checks"] for r in results]
    plans = results[0]["stats"]["per_algorithm"]
    staged = len(set(TOPOLOGIES[topology][0])) > 1
    assert plans.get("allreduce/cuda_staged" if staged else "allreduce/cuda_nccl", 0) > 0, plans
    if staged:
        assert results[0]["stats"]["per_link"]["inter-node"]["bytes_sent"] > 0, plans
    # Timings for the notes (not asserted): `pytest -s` shows them.
    print(f"\n[{topology}] nanoccl CUDA allreduce, float32, rank 0:")
    print(f"{'bytes':>12} {'time_us':>10} {'algbw_GBps':>11} {'busbw_GBps':>11}")
    for row in results[0]["timings"]:
        print(f"{row['bytes']:>12} {row['time_us']:>10.1f} {row['algbw']:>11.3f} "
              f"{row['busbw']:>11.3f}")


# ---- the rank program ---------------------------------------------------------------------------


class Checks:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.count = 0

    def same(self, name: str, got: torch.Tensor, want: torch.Tensor, exact: bool = True) -> None:
        self.count += 1
        got, want = got.cpu(), want.cpu()
        try:
            assert got.dtype == want.dtype and got.shape == want.shape, (
                f"got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}")
            if exact or not got.is_floating_point():
                assert torch.equal(got, want), (
                    f"got {got.reshape(-1)[:8].tolist()}, want {want.reshape(-1)[:8].tolist()}")
            else:
                torch.testing.assert_close(got, want)
        except AssertionError as exc:
            self.failures.append(f"{name}: {str(exc)[:500]}")

    def run(self, name: str, fn: Any) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - recorded, the job goes on
            self.failures.append(f"{name}: raised {type(exc).__name__}: {str(exc)[:800]}")


def _input(dtype: torch.dtype, rank: int, n: int, seed: int) -> torch.Tensor:
    """Small integers: sums are exact in every dtype, whatever the order."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, (n,), generator=g).to(dtype)


def _reference(xs: list[torch.Tensor], op: str, factor: float = 1.0) -> torch.Tensor:
    acc = xs[0].double() * (factor if op == "premul" else 1.0)
    for x in xs[1:]:
        y = x.double() * (factor if op == "premul" else 1.0)
        if op in ("sum", "avg", "premul"):
            acc = acc + y
        elif op == "max":
            acc = torch.maximum(acc, y)
        elif op == "min":
            acc = torch.minimum(acc, y)
        elif op == "product":
            acc = acc * y
    if op == "avg":
        if xs[0].dtype.is_floating_point:
            acc = acc / len(xs)
        else:
            acc = torch.div(acc, len(xs), rounding_mode="trunc")
    return acc.to(xs[0].dtype)


def _rank_main(a: argparse.Namespace, ck: Checks, out: dict[str, Any]) -> None:
    import torch.distributed as dist

    import nanoccl

    RO = dist.ReduceOp
    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    dist.init_process_group("nanoccl", init_method="env://", rank=a.rank,
                            world_size=a.world_size,
                            timeout=datetime.timedelta(seconds=a.pg_timeout))
    world, rank = a.world_size, a.rank
    # A build without CUDA says so at the first CUDA call: the test skips with that reason.
    try:
        probe = torch.ones(4, device=dev)
        dist.all_reduce(probe)
    except ValueError as exc:  # refused on this rank (backend/errors.h)
        if NOT_BUILT in str(exc):
            out["skip"] = str(exc).splitlines()[0][:300]
            return
        raise
    ck.same("probe", probe, torch.full((4,), float(world), device=dev))

    ops = {"sum": RO.SUM, "avg": RO.AVG, "max": RO.MAX, "min": RO.MIN, "product": RO.PRODUCT}
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32,
              torch.int64, torch.int8, torch.uint8]
    seed = 0
    for n in (0, 1, 1000, 1001, (3 << 20) + 5):  # the last: several staging chunks
        for dtype in dtypes:
            big = n > 10000
            for name, op in ops.items():
                if big and name != "sum":
                    continue
                if name == "product" and dtype in (torch.int8, torch.uint8):
                    continue  # overflows differ by design, nothing to learn
                seed += 1
                xs = [_input(dtype, r, n, seed) for r in range(world)]
                want = _reference(xs, name)

                def call(xs: list[torch.Tensor] = xs, want: torch.Tensor = want,
                         op: Any = op, tag: str = f"all_reduce {name} {dtype} x{n}") -> None:
                    t = xs[rank].to(dev)
                    dist.all_reduce(t, op=op)
                    ck.same(tag, t, want, exact=not (name == "avg" and dtype.is_floating_point))

                ck.run(f"all_reduce {name} {dtype} x{n}", call)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        seed += 1
        xs = [_input(dtype, r, 999, seed) for r in range(world)]
        want = _reference(xs, "premul", 0.5)

        def premul(xs: list[torch.Tensor] = xs, want: torch.Tensor = want,
                   dtype: torch.dtype = dtype) -> None:
            t = xs[rank].to(dev)
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
            ck.same(f"premul_sum {dtype}", t, want)

        ck.run(f"premul_sum {dtype}", premul)

    for n in (0, 7, 100_000):
        for root in range(world):
            seed += 1
            xs = [_input(torch.float16, r, n, seed) for r in range(world)]

            def bcast(xs: list[torch.Tensor] = xs, root: int = root, n: int = n) -> None:
                t = xs[rank].to(dev)
                dist.broadcast(t, src=root)
                ck.same(f"broadcast root {root} x{n}", t, xs[root])

            ck.run(f"broadcast root {root} x{n}", bcast)

    for n in (1, 257, 50_000):
        seed += 1
        xs = [_input(torch.float32, r, n, seed) for r in range(world)]

        def gathers(xs: list[torch.Tensor] = xs, n: int = n) -> None:
            outs = [torch.full((n,), -1.0, device=dev) for _ in range(world)]
            dist.all_gather(outs, xs[rank].to(dev))
            for r in range(world):
                ck.same(f"all_gather x{n} part {r}", outs[r], xs[r])
            flat = torch.empty(world * n, device=dev)
            dist.all_gather_into_tensor(flat, xs[rank].to(dev))
            ck.same(f"all_gather_into_tensor x{n}", flat, torch.cat(xs))

        ck.run(f"all_gather x{n}", gathers)

        seed += 1
        parts = [[_input(torch.float32, r, n, seed * 31 + q) for q in range(world)]
                 for r in range(world)]

        def scatters(parts: list[list[torch.Tensor]] = parts, n: int = n) -> None:
            want = _reference([parts[r][rank] for r in range(world)], "sum")
            got = torch.empty(n, device=dev)
            dist.reduce_scatter(got, [p.to(dev) for p in parts[rank]])
            ck.same(f"reduce_scatter x{n}", got, want)
            got2 = torch.empty(n, device=dev)
            dist.reduce_scatter_tensor(got2, torch.cat(parts[rank]).to(dev))
            ck.same(f"reduce_scatter_tensor x{n}", got2, want)

        ck.run(f"reduce_scatter x{n}", scatters)

    def streams() -> None:
        # The input is made by kernels queued on the current stream just before the call; the
        # result is consumed on that stream right after wait(): no synchronize anywhere.
        n = 1 << 22
        side = torch.cuda.Stream(device=dev)
        with torch.cuda.stream(side):
            base = torch.ones(n, device=dev)
            for _ in range(20):  # keep the stream busy so that a missing wait would show
                base = base * 1.0001
            t = base / base * (rank + 1)
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            # On `side`, ordered after the collective by wait() alone; .cpu() copies on `side`.
            host = (t * 2).cpu()
        total = sum(range(1, world + 1))
        ck.same("stream semantics", host, torch.full((n,), 2.0 * total))
        deadline = time.monotonic() + 60
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(0.001)
        if not work.is_completed():
            ck.failures.append("work.is_completed() stayed False after the result was read")
        # The future completes with the output tensors; its value is usable on any stream.
        t2 = torch.full((1000,), float(rank + 1), device=dev)
        fut = dist.all_reduce(t2, async_op=True).get_future()
        got = fut.wait()[0]
        ck.same("future value", got, torch.full((1000,), float(total), device=dev))
        # A temporary: the backend keeps it alive until the GPU is done with it.
        dist.all_reduce(torch.ones(1 << 20, device=dev), async_op=True)
        torch.cuda.synchronize(dev)

    ck.run("streams", streams)

    def compressed() -> None:
        # allreduce_compressed on CUDA tensors with the residual in (pinned) host memory, and
        # DDP's error-feedback hook on a CUDA model: the same bits on every rank, within int8's
        # error of the sum across nodes (lossless on one node), the residual filled.
        g = torch.Generator().manual_seed(7 + rank)
        x = torch.randn(100_003, generator=g)
        want = x.double().clone()
        dist.all_reduce(want)
        t = x.to(dev)
        residual = torch.zeros(x.numel(), dtype=torch.float32, pin_memory=True)
        nanoccl.allreduce_compressed(t, residual, codec="int8")
        outs = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(outs, t)
        for r in range(world):
            ck.same(f"allreduce_compressed bits of rank {r}", outs[r], outs[0])
        err = (t.double().cpu() - want).abs().max().item()
        if err > 0.05 * want.abs().max().item():
            ck.failures.append(f"allreduce_compressed: error {err} off a sum of "
                               f"|max| {want.abs().max().item()}")
        from nanoccl import hooks
        model = torch.nn.Linear(64, 8).to(dev)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
        state = hooks.ErrorFeedbackState(codec="int8")
        ddp.register_comm_hook(state, hooks.error_feedback_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(3):
            inp = torch.randn(16, 64, generator=g).to(dev)
            ddp(inp).square().mean().backward()
            opt.step()
            opt.zero_grad()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        views = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(views, flat)
        for r in range(world):
            ck.same(f"DDP with the error-feedback hook: parameters of rank {r}", views[r], views[0])
        if not all(r.device.type == "cpu" for r in state.residuals.values()):
            ck.failures.append("the hook's residuals of CUDA buckets are not in host memory")

    ck.run("compressed", compressed)

    def rejected() -> None:
        # A call this rank rejects (an output of the wrong size) leaves a refused call in its
        # place on every rank: the group goes on, CUDA calls included.
        try:
            dist.all_gather_into_tensor(torch.empty(3, device=dev), torch.ones(2, device=dev))
            ck.failures.append("a wrong-sized all_gather_into_tensor was not rejected")
        except (RuntimeError, ValueError):
            pass
        t = torch.ones(10, device=dev)
        dist.all_reduce(t)
        ck.same("all_reduce after a rejected call", t, torch.full((10,), float(world), device=dev))

    ck.run("rejected", rejected)

    timings: list[dict[str, float]] = []
    for nbytes in (1 << 20, 1 << 22, 1 << 24, 1 << 26):
        n = nbytes // 4
        t = torch.ones(n, device=dev)
        for _ in range(2):
            dist.all_reduce(t)
        torch.cuda.synchronize(dev)
        iters = 10 if nbytes <= (1 << 24) else 4
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        torch.cuda.synchronize(dev)
        sec = (time.perf_counter() - start) / iters
        algbw = nbytes / sec / 1e9
        timings.append({"bytes": nbytes, "time_us": sec * 1e6, "algbw": algbw,
                        "busbw": algbw * 2 * (world - 1) / world})
    out["timings"] = timings
    out["stats"] = nanoccl.stats()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--device", type=int, required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--pg-timeout", type=float, default=60.0)
    a = p.parse_args()
    os.environ["RANK"] = str(a.rank)
    os.environ["WORLD_SIZE"] = str(a.world_size)
    ck = Checks()
    out: dict[str, Any] = {"rank": a.rank}
    try:
        _rank_main(a, ck, out)
    except Exception:  # noqa: BLE001 - reported through the result file
        ck.failures.append("rank program raised:\n" + traceback.format_exc()[-3000:])
    out["failures"] = ck.failures
    out["checks"] = ck.count
    Path(a.result).write_text(json.dumps(out, default=str))
    os._exit(0)  # no teardown that could hang after a failure: the parent has the result


if __name__ == "__main__":
    sys.exit(main())
