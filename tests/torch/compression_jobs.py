"""Rank programs of the compression tests (test_compression.py), on job_harness.py's harness.

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

import job_harness
import nanoccl
from job_harness import Checks, init, quiesce
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
    except TypeError as exc:
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


class TeacherTask:
    """A fixed synthetic regression task (a small random teacher network), the same on every
    rank; each rank draws its own batches."""

    def __init__(self) -> None:
        from torch import nn

        torch.manual_seed(7)
        self.teacher = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8))
        self.eval_x = torch.randn(512, 32, generator=torch.Generator().manual_seed(99))
        with torch.no_grad():
            self.eval_y = self.teacher(self.eval_x)

    @staticmethod
    def student() -> Any:
        from torch import nn

        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                             nn.Linear(256, 8))

    def sharded_student(self, mesh: Any = None, reshard: bool = False) -> Any:
        """The student under FSDP2: fully_shard on each Linear layer, then on the whole
        (`mesh` None: the default group's)."""
        from torch import nn
        from torch.distributed.fsdp import fully_shard

        net = self.student()
        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(net, mesh=mesh, reshard_after_forward=reshard)
        return net

    def train(self, net: Any, steps: int, rank: int) -> None:
        """`steps` of SGD with momentum on this rank's batches."""
        from torch import nn

        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(1000 + rank)
        for _ in range(steps):
            xb = torch.randn(64, 32, generator=g)
            with torch.no_grad():
                yb = self.teacher(xb)
            opt.zero_grad()
            nn.functional.mse_loss(net(xb), yb).backward()
            opt.step()

    def eval_loss(self, net: Any) -> float:
        from torch import nn

        with torch.no_grad():
            return nn.functional.mse_loss(net(self.eval_x), self.eval_y).item()


def scenario_convergence(a: argparse.Namespace, ck: Checks) -> None:
    """DDP on a fixed synthetic task: lossless, int8 + error feedback, int4 + error feedback,
    the same steps and data; reports each run's final evaluation loss."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    init(a)
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    steps = 120
    task = TeacherTask()
    losses: dict[str, float] = {}
    calls: dict[str, int] = {}
    for run in ("none", "int8", "int4", "int8-fused"):
        codec = run.split("-")[0]
        net = DDP(task.student(), bucket_cap_mb=0.1)  # several buckets
        # int8-fused: every bucket of a step held and sent as one compressed allreduce.
        fuse = 1 << 30 if run.endswith("fused") else 0
        state = (hooks.ErrorFeedbackState(codec=codec, fuse_bytes=fuse) if codec != "none"
                 else None)
        if state is not None:
            net.register_comm_hook(state, hooks.error_feedback_hook)
        task.train(net, steps, rank)
        losses[run] = task.eval_loss(net.module)
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
        net = DDP(task.student().to(torch.bfloat16), bucket_cap_mb=0.1)
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


def scenario_sharded(a: argparse.Namespace, ck: Checks) -> None:
    """reduce_scatter_compressed and all_gather_compressed (sharded training's calls), whatever
    their size: within the codec's bound, the same bits on every rank, fewer inter-node bytes;
    FSDP2 trained with compress_fsdp close to lossless; bad calls fail on every rank."""
    init(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    nodes = len(set(gathered_node_ids(gloo)))
    grp = dist.new_group(backend="nanoccl")  # default settings: calls this small stay lossless
    count = 20_011  # 80 KB a part: below compression_min_bytes

    def inter() -> int:
        """Bytes every rank of the group has sent across nodes so far (the algorithms may split
        a call's cross-node bytes unevenly among ranks, differently at different sizes)."""
        mine = torch.tensor([nanoccl.stats(grp)["per_link"]["inter-node"]["bytes_sent"]],
                            dtype=torch.float64)
        dist.all_reduce(mine, group=gloo)
        return int(mine.item())

    # reduce_scatter_compressed: SUM, AVG, PREMUL_SUM (FSDP2's), float32 and bfloat16.
    full = torch.rand(count * world, generator=torch.Generator().manual_seed(100 + rank),
                      dtype=torch.float64).mul(2).sub(1).float()
    want = full.double()
    dist.all_reduce(want, group=gloo)
    mine = want[rank * count:(rank + 1) * count]
    out = torch.empty(count)
    before = inter()
    dist.reduce_scatter_tensor(out, full, group=grp)
    lossless_rs = inter() - before
    ck.expect("plain reduce_scatter lossless here", (out.double() - mine).abs().max().item()
              < 1e-5)
    premul = dist.ReduceOp.PREMUL_SUM(0.5)  # type: ignore[operator]
    for op, scale in ((dist.ReduceOp.SUM, 1.0), (dist.ReduceOp.AVG, 1.0 / world),
                      (premul, 0.5)):
        before = inter()
        nanoccl.reduce_scatter_compressed(out, full, codec="int8", op=op, group=grp)
        sent = inter() - before
        err = (out.double() - mine * scale).abs().max().item()
        ck.expect(f"rs {op} error", 0 < err <= bound("int8", world, 1.0) * scale, f"{err}")
        ck.expect(f"rs {op} inter-node bytes", sent <= 0.27 * lossless_rs,
                  f"{sent} vs lossless {lossless_rs}")
    # With a residual: what this rank's encodings lost is kept (ranks carrying a part across
    # nodes write theirs); a residual of the wrong size is refused.
    residual = torch.zeros(count * world)
    nanoccl.reduce_scatter_compressed(out, full, residual, codec="int8", group=grp)
    err = (out.double() - mine).abs().max().item()
    ck.expect("rs residual error", 0 < err <= bound("int8", world, 1.0), f"{err}")
    written = torch.tensor([float(residual.abs().sum().item() > 0)])
    dist.all_reduce(written, group=gloo)
    ck.expect("rs residual written", written.item() > 0, str(written.item()))
    half = full.to(torch.bfloat16)
    want_h = half.double()
    dist.all_reduce(want_h, group=gloo)
    out_h = torch.empty(count, dtype=torch.bfloat16)
    nanoccl.reduce_scatter_compressed(out_h, half, codec="int8", op=dist.ReduceOp.AVG, group=grp)
    mine_h = want_h[rank * count:(rank + 1) * count] / world
    err_h = (out_h.double() - mine_h).abs()
    allowed = bound("int8", world, 1.0) / world + mine_h.abs() * 2.0 ** -8
    ck.expect("rs bf16 error", bool((err_h <= allowed).all()), f"{(err_h - allowed).max()}")
    ck.expect("rs bf16 dtype", out_h.dtype == torch.bfloat16)

    # all_gather_compressed: every part within int8's bound of its owner's input (half a step
    # of its block's scale), the same bits on every rank (the owner's own part too).
    count = 100_003  # int4's parts large enough for the same algorithm as the lossless call's
    x = torch.rand(count, generator=torch.Generator().manual_seed(rank),
                   dtype=torch.float64).mul(2).sub(1).float()
    xs = gathered(x, gloo)
    plain = torch.empty(count * world)
    before = inter()
    dist.all_gather_into_tensor(plain, x, group=grp)
    lossless_ag = inter() - before
    by_codec: dict[str, torch.Tensor] = {}
    for codec, unit in (("int8", UNIT["int8"]), ("int4", UNIT["int4"]), ("bf16", UNIT["bf16"])):
        got = by_codec[codec] = torch.empty(count * world)
        before = inter()
        work = nanoccl.all_gather_compressed(got, x, codec=codec, group=grp, async_op=True)
        assert work is not None
        work.wait()
        sent = inter() - before
        everyone = gathered(got, gloo)
        ck.expect(f"ag {codec} same bits", all(torch.equal(everyone[0], t) for t in everyone))
        err = max((got[r * count:(r + 1) * count] - xs[r]).abs().max().item()
                  for r in range(world))
        ck.expect(f"ag {codec} error", 0 < err <= unit * 1.05, f"{err} > {unit}")
        want_share = {"int8": 0.27, "int4": 0.15, "bf16": 0.51}[codec]
        ck.expect(f"ag {codec} inter-node bytes", sent <= want_share * lossless_ag,
                  f"{sent} vs lossless {lossless_ag}")
    xh = x.to(torch.float16)
    got_h = torch.empty(count * world, dtype=torch.float16)
    nanoccl.all_gather_compressed(got_h, xh, codec="int8", group=grp)
    everyone = gathered(got_h, gloo)
    ck.expect("ag fp16 same bits", all(torch.equal(everyone[0], t) for t in everyone))
    ck.expect("ag fp16 error", (got_h.double() - plain.double()).abs().max().item()
              <= UNIT["int8"] * 1.05 + 2.0 ** -11)
    strided = torch.empty(count * world, 2)[:, 0]  # a non-contiguous output
    nanoccl.all_gather_compressed(strided, x, codec="int8", group=grp)
    ck.expect("ag strided output", torch.equal(strided, by_codec["int8"]))
    quiesce(gloo)

    # FSDP2 (ZeRO-2's fully_shard) with compress_fsdp: int8 gradients, then int8 gradients and
    # int8 parameters, each within 2% of the lossless run's final loss after the same steps.
    task = TeacherTask()
    losses: dict[str, float] = {}
    for run in ("none", "rs", "rs+ag"):
        net = task.sharded_student()
        comms = None
        if run != "none":
            comms = hooks.compress_fsdp(net, "int8",
                                        gather_codec="int8" if run == "rs+ag" else None)
        task.train(net, 60, rank)
        loss = torch.tensor([task.eval_loss(net)])
        everyone = gathered(loss, gloo)
        ck.expect(f"fsdp {run} same loss everywhere", all(torch.equal(everyone[0], t)
                                                           for t in everyone))
        losses[run] = loss.item()
        if comms is not None:
            calls = comms.reduce_scatter_calls
            ck.expect(f"fsdp {run} rs compressed", calls >= 60 * 3, str(calls))
            want_ag = 60 * 3 if run == "rs+ag" else 0
            ck.expect(f"fsdp {run} ag compressed", (comms.all_gather_calls >= want_ag)
                      and (want_ag > 0) == (comms.all_gather_calls > 0),
                      str(comms.all_gather_calls))
            # One residual per unit that holds parameters (the three Linear layers, after the
            # root, which holds none), restored exactly from a checkpoint.
            state = comms.state_dict()
            ck.expect(f"fsdp {run} residuals", sorted(state["residuals"]) == [1, 2, 3],
                      str(sorted(state["residuals"])))
            buf = io.BytesIO()
            torch.save(state, buf)
            buf.seek(0)
            other = hooks.compress_fsdp(net, "int8")
            other.load_state_dict(torch.load(buf))
            ck.expect(f"fsdp {run} state_dict round trip",
                      all((a.residual is None and b.residual is None)
                          or (a.residual is not None and b.residual is not None
                              and torch.equal(a.residual, b.residual))
                          for a, b in zip(comms.reduce_scatters, other.reduce_scatters)))
            try:
                hooks.compress_fsdp(net, "int4").load_state_dict(state)
                ck.fail(f"fsdp {run} state_dict codec check", "loaded into another codec")
            except ValueError:
                ck.expect(f"fsdp {run} state_dict codec check", True)
        quiesce(gloo)
    for run in ("rs", "rs+ag"):
        ck.expect(f"fsdp {run} loss", abs(losses[run] - losses["none"]) <= 0.02 * losses["none"],
                  str(losses))
    ck.data["losses"] = losses

    # Bad calls: a rejection on every rank (all make it), a clear message; TypeError for a
    # dtype, ValueError for the rest (backend/errors.h).
    bad = dist.new_group(backend="nanoccl")
    for name, call, words, kind in (
        ("ag int32", lambda: nanoccl.all_gather_compressed(
            torch.empty(8 * world, dtype=torch.int32), torch.ones(8, dtype=torch.int32),
            group=bad), "float32", TypeError),
        ("ag size", lambda: nanoccl.all_gather_compressed(
            torch.empty(8 * world + 1), torch.ones(8), group=bad), "elements", ValueError),
        ("ag codec", lambda: nanoccl.all_gather_compressed(
            torch.empty(8 * world), torch.ones(8), codec="zip", group=bad), "zip", ValueError),
        ("rs int32", lambda: nanoccl.reduce_scatter_compressed(
            torch.empty(8, dtype=torch.int32), torch.ones(8 * world, dtype=torch.int32),
            group=bad), "float32", TypeError),
        ("rs max", lambda: nanoccl.reduce_scatter_compressed(
            torch.empty(8), torch.ones(8 * world), op=dist.ReduceOp.MAX, group=bad), "max",
         ValueError),
        ("rs residual", lambda: nanoccl.reduce_scatter_compressed(
            torch.empty(8), torch.ones(8 * world), torch.zeros(8), group=bad), "residual",
         ValueError),
    ):
        try:
            call()
            ck.fail(f"{name} rejected", "no error")
        except (TypeError, ValueError, RuntimeError) as exc:
            ck.expect(f"{name} raises {kind.__name__}", isinstance(exc, kind), repr(exc)[:300])
            ck.expect(f"{name} message", words in str(exc).lower(), str(exc)[:300])
    quiesce(gloo)
    ck.data["nodes"] = nodes


SCENARIOS = {
    "compressed": scenario_compressed,
    "convergence": scenario_convergence,
    "sharded": scenario_sharded,
}

if __name__ == "__main__":
    raise SystemExit(job_harness.main(SCENARIOS))
