"""Rank programs of the compression tests (test_compression.py), on dist_jobs.py's harness.

    python compression_jobs.py SCENARIO --rank R --world-size N --init-method URL --result FILE

The topology comes from NANOCCL_NODE_ID per rank (the test sets it). References come from
Gloo (float64 sums of the same inputs) in the same processes.
"""

from __future__ import annotations

import argparse
import copy
import io
from typing import Any

import torch
import torch.distributed as dist

import dist_jobs
import nanoccl
from dist_jobs import Checks, init, quiesce
from nanoccl import hooks

CODECS = ["fp16", "bf16", "int8", "int4"]
# Half the codec's resolution at magnitude 1 (collectives/codec/codec.h).
UNIT = {"fp16": 2.0**-11, "bf16": 2.0**-8, "int8": 1 / 254, "int4": 1 / 14}


def bound(codec: str, world: int, amax: float) -> float:
    """Each input is encoded at most once inside its node's partial sum, the total once more."""
    return 2.0 * world * UNIT[codec] * amax * 1.05


def gathered(t: torch.Tensor, gloo: Any) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(gloo))]
    dist.all_gather(out, t, group=gloo)
    return out


def scenario_compressed(a: argparse.Namespace, ck: Checks) -> None:
    """Every codec: the same bits on every rank, the error within the codec's, fewer bytes
    across nodes, integers and MIN exact; allreduce_compressed with a residual; a mismatch."""
    init(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    nodes = len({str(s) for s in gathered_node_ids(gloo)})
    count = 50_021
    g = torch.Generator().manual_seed(rank)
    x = torch.rand(count, generator=g, dtype=torch.float64).mul(2).sub(1).float()
    exact = x.double()
    dist.all_reduce(exact, group=gloo)
    amax = 1.0

    lossless = dist.new_group(backend="nanoccl")
    ref = x.clone()
    dist.all_reduce(ref, group=lossless)
    lossless_inter = nanoccl.stats(lossless)["per_link"]["inter-node"]["bytes_sent"]

    for codec in CODECS:
        opts = nanoccl.Options(compression=codec, min_bytes=0)
        grp = dist.new_group(backend="nanoccl", pg_options=opts)
        for op, scale in ((dist.ReduceOp.SUM, 1.0), (dist.ReduceOp.AVG, 1.0 / world)):
            name = f"{codec}/{op}"
            y = x.clone()
            dist.all_reduce(y, op=op, group=grp)
            everyone = gathered(y, gloo)
            ck.expect(f"{name} same bits", all(torch.equal(everyone[0], t) for t in everyone),
                      "ranks differ")
            err = (y.double() - exact * scale).abs().max().item()
            ck.expect(f"{name} error", err <= bound(codec, world, amax) * scale,
                      f"max error {err} > {bound(codec, world, amax) * scale}")
            ck.expect(f"{name} lossy", err > 0, "no error at all: was the codec applied?")
        st = nanoccl.stats(grp)
        inter = st["per_link"]["inter-node"]["bytes_sent"]
        want = 0.5 if codec in ("fp16", "bf16") else (0.26 if codec == "int8" else 0.15)
        # Two allreduces (SUM, AVG) here against one lossless: per call at most `want` of it.
        ck.expect(f"{codec} inter-node bytes", inter <= 2 * lossless_inter * want * 1.02,
                  f"{inter} vs lossless {lossless_inter} x {want}")
        algos = st["per_algorithm"]
        ck.expect(f"{codec} lossy row", any(k in algos for k in
                                            ("allreduce/hierarchical", "allreduce/compressed")),
                  str(algos))

        # reduce_scatter_tensor: each rank its own sum, within the codec's error.
        full = torch.rand(count * world, generator=torch.Generator().manual_seed(100 + rank),
                          dtype=torch.float64).mul(2).sub(1).float()
        want_rs = full.double()
        dist.all_reduce(want_rs, group=gloo)
        out = torch.empty(count)
        dist.reduce_scatter_tensor(out, full, group=grp)
        err = (out.double() - want_rs[rank * count:(rank + 1) * count]).abs().max().item()
        ck.expect(f"{codec} reduce_scatter error", err <= bound(codec, world, amax),
                  f"max error {err}")

        # Integers and MIN stay exact.
        ints = torch.arange(count, dtype=torch.int32) % 7 + rank
        dist.all_reduce(ints, group=grp)
        ck.same(f"{codec} int32 exact", ints,
                (torch.arange(count, dtype=torch.int32) % 7) * world + world * (world - 1) // 2)
        mins = x.clone()
        dist.all_reduce(mins, op=dist.ReduceOp.MIN, group=grp)
        want_min = torch.stack(gathered(x, gloo)).min(dim=0).values
        ck.same(f"{codec} min exact", mins, want_min)

    # bfloat16 / float16 under int8: reduced in float32 and rounded back once to the input
    # type; the inter-node leg carries int8 (about a quarter of the float32 call's bytes, not
    # the half a lossless half-precision call moves); AVG as FSDP2 sends it.
    grp8 = dist.new_group(backend="nanoccl",
                          pg_options=nanoccl.Options(compression="int8", min_bytes=0))
    for dtype, rel in ((torch.bfloat16, 2.0 ** -8), (torch.float16, 2.0 ** -11)):
        name = f"int8 {dtype}"
        h = x.to(dtype)
        want_h = h.double()
        dist.all_reduce(want_h, group=gloo)
        want_h /= world
        before = nanoccl.stats(grp8)["per_link"]["inter-node"]["bytes_sent"]
        y = h.clone()
        dist.all_reduce(y, op=dist.ReduceOp.AVG, group=grp8)
        inter = nanoccl.stats(grp8)["per_link"]["inter-node"]["bytes_sent"] - before
        everyone = gathered(y, gloo)
        ck.expect(f"{name} dtype kept", y.dtype == dtype, str(y.dtype))
        ck.expect(f"{name} same bits", all(torch.equal(everyone[0], t) for t in everyone),
                  "ranks differ")
        err = (y.double() - want_h).abs()
        allowed = bound("int8", world, amax) / world + want_h.abs() * rel
        ck.expect(f"{name} error", bool((err <= allowed).all()),
                  f"max excess {(err - allowed).max().item()}")
        ck.expect(f"{name} lossy", err.max().item() > 0, "no error: was the codec applied?")
        ck.expect(f"{name} inter-node bytes", inter <= lossless_inter * 0.26 * 1.02,
                  f"{inter} vs the float32 call's lossless {lossless_inter}")
    # allreduce_compressed of a bfloat16 tensor keeps a float32 residual.
    hres = torch.zeros(count)
    y = x.to(torch.bfloat16)
    nanoccl.allreduce_compressed(y, hres, codec="int8", group=lossless)
    everyone = gathered(y, gloo)
    ck.expect("bf16 allreduce_compressed same bits",
              all(torch.equal(everyone[0], t) for t in everyone))
    ck.expect("bf16 allreduce_compressed dtype", y.dtype == torch.bfloat16, str(y.dtype))

    # The Python call with a caller-held residual, on the lossless group.
    residual = torch.zeros(count)
    y = x.clone()
    nanoccl.allreduce_compressed(y, residual, codec="int8", group=lossless)
    everyone = gathered(y, gloo)
    ck.expect("allreduce_compressed same bits", all(torch.equal(everyone[0], t) for t in everyone))
    err = (y.double() - exact).abs().max().item()
    ck.expect("allreduce_compressed error", 0 < err <= bound("int8", world, amax), f"{err}")
    # Each rank keeps what its own encodings lost: ranks that carry no shard across nodes
    # (the extra local ranks of uneven nodes) keep nothing.
    written = torch.tensor([float(residual.abs().sum().item() > 0)])
    dist.all_reduce(written, group=gloo)
    ck.expect("residual written", (written.item() > 0) == (nodes > 1),
              f"{written.item()} ranks wrote their residual, {nodes} nodes")
    for bad, why in ((torch.zeros(count, dtype=torch.float64), "float32"),
                     (torch.zeros(count + 1), "shape")):
        try:
            nanoccl.allreduce_compressed(x.clone(), bad, codec="int8", group=lossless)
            ck.fail(f"bad residual ({why})", "no error")
        except (ValueError, RuntimeError) as exc:
            ck.expect(f"bad residual ({why}) message", "residual" in str(exc), str(exc))
    try:
        nanoccl.allreduce_compressed(torch.ones(8, dtype=torch.int32), codec="int8", group=lossless)
        ck.fail("int32 allreduce_compressed", "no error")
    except RuntimeError as exc:
        ck.expect("int32 allreduce_compressed message", "float32" in str(exc), str(exc))
    quiesce(gloo)

    # Ranks that disagree about the codec: an error naming it on every rank, within the timeout.
    mixed = dist.new_group(backend="nanoccl", pg_options=nanoccl.Options(
        compression="int8" if rank == 0 else "none", min_bytes=0))
    try:
        dist.all_reduce(x.clone(), group=mixed)
        ck.fail("codec mismatch", "no error")
    except RuntimeError as exc:
        ck.expect("codec mismatch message", "int8 across nodes" in str(exc), str(exc)[:500])
    quiesce(gloo)


def gathered_node_ids(gloo: Any) -> list[str]:
    out: list[Any] = [None] * dist.get_world_size(gloo)
    dist.all_gather_object(out, nanoccl.stats()["node"], group=gloo)
    return out


def scenario_convergence(a: argparse.Namespace, ck: Checks) -> None:
    """DDP on a fixed synthetic task: lossless, int8 + error feedback, int4 + error feedback,
    the same steps and data; reports each run's final evaluation loss."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    init(a)
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    steps = 120

    torch.manual_seed(7)
    teacher = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8))
    eval_x = torch.randn(512, 32, generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        eval_y = teacher(eval_x)

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                             nn.Linear(256, 8))

    losses: dict[str, float] = {}
    calls: dict[str, int] = {}
    for run in ("none", "int8", "int4", "int8-fused"):
        codec = run.split("-")[0]
        net = DDP(model(), bucket_cap_mb=0.1)  # several buckets
        # int8-fused: every bucket of a step held and sent as one compressed allreduce.
        fuse = 1 << 30 if run.endswith("fused") else 0
        state = (hooks.ErrorFeedbackState(codec=codec, fuse_bytes=fuse) if codec != "none"
                 else None)
        if state is not None:
            net.register_comm_hook(state, hooks.error_feedback_hook)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(1000 + rank)
        for _ in range(steps):
            xb = torch.randn(64, 32, generator=g)
            with torch.no_grad():
                yb = teacher(xb)
            opt.zero_grad()
            nn.functional.mse_loss(net(xb), yb).backward()
            opt.step()
        with torch.no_grad():
            losses[run] = nn.functional.mse_loss(net.module(eval_x), eval_y).item()
        params = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        everyone = gathered(params, gloo)
        ck.expect(f"{run} replicas equal", all(torch.equal(everyone[0], t) for t in everyone))
        if state is not None:
            calls[run] = state.calls
        if run == "int8-fused":
            ck.expect("fused: one call per step", state.calls == steps, str(state.calls))
            ck.expect("fused: one residual", len(state.residuals) == 1, str(state.residuals))
            quiesce(gloo)
            continue
        if state is not None:
            ck.expect(f"{codec} residuals kept", len(state.residuals) >= 2, str(state.residuals))
            # A checkpoint round trip restores every residual exactly.
            buf = io.BytesIO()
            torch.save(state.state_dict(), buf)
            buf.seek(0)
            restored = hooks.ErrorFeedbackState(codec=codec)
            restored.load_state_dict(torch.load(buf))
            ck.expect(f"{codec} state_dict round trip",
                      all(torch.equal(restored.residuals[i], r)
                          for i, r in state.residuals.items())
                      and restored.residuals.keys() == state.residuals.keys())
            try:
                hooks.ErrorFeedbackState(codec="fp16").load_state_dict(copy.deepcopy(
                    state.state_dict()))
                ck.fail(f"{codec} state_dict codec check", "loaded into another codec")
            except ValueError:
                ck.expect(f"{codec} state_dict codec check", True)
        quiesce(gloo)
    ck.data["losses"] = losses
    ck.data["calls"] = calls

    # bfloat16 parameters: DDP's buckets are bfloat16; the hook compresses them with a float32
    # residual (fused, too), and every replica stays equal.
    for fuse in (0, 1 << 30):
        net = DDP(model().to(torch.bfloat16), bucket_cap_mb=0.1)
        state = hooks.ErrorFeedbackState(codec="int8", fuse_bytes=fuse)
        net.register_comm_hook(state, hooks.error_feedback_hook)
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(2000 + rank)
        for _ in range(5):
            xb = torch.randn(64, 32, generator=g).to(torch.bfloat16)
            opt.zero_grad()
            net(xb).float().square().mean().backward()
            opt.step()
        params = torch.cat([p.detach().float().reshape(-1) for p in net.parameters()])
        everyone = gathered(params, gloo)
        ck.expect(f"bf16 fuse={fuse} replicas equal",
                  all(torch.equal(everyone[0], t) for t in everyone))
        ck.expect(f"bf16 fuse={fuse} compressed", state.calls >= 5, str(state.calls))
        ck.expect(f"bf16 fuse={fuse} float32 residuals",
                  bool(state.residuals) and all(r.dtype == torch.float32
                                                for r in state.residuals.values()))
        quiesce(gloo)


SCENARIOS = {
    "compressed": scenario_compressed,
    "convergence": scenario_convergence,
}

if __name__ == "__main__":
    raise SystemExit(dist_jobs.main(SCENARIOS))
