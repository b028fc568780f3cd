"""Rank programs of the DiLoCo tests (test_diloco.py), on job_harness.py's harness.

    python diloco_jobs.py SCENARIO --rank R --world-size N --init-method URL --result FILE

The nodes come from NANOCCL_NODE_ID per rank (the test sets it: "aabb" is 2 nodes x 2
ranks). Each rank trains a small regression network on its own deterministic batches.
"""

from __future__ import annotations

import argparse
import functools
import io
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import job_harness
from job_harness import Checks, expect_error, init, quiesce
from nanoccl.diloco import DiLoCo

TEACHER_SEED = 7


def teacher() -> nn.Module:
    torch.manual_seed(TEACHER_SEED)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def student() -> nn.Module:
    """Six parameter tensors, the same weights on every rank."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


TEACHER = teacher()
EVAL_X = torch.randn(256, 16, generator=torch.Generator().manual_seed(99))
with torch.no_grad():
    EVAL_Y = TEACHER(EVAL_X)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(step * 1000 + rank))
    with torch.no_grad():
        return x, TEACHER(x)


def train(net: Any, opt: torch.optim.Optimizer, step_fn: Any, rank: int, steps: range) -> None:
    """`steps` of MSE on this rank's batches through `net` (DDP or a DiLoCo wrapper)."""
    for s in steps:
        x, y = batch(rank, s)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(net(x), y).backward()
        step_fn()


def eval_loss(model: nn.Module) -> float:
    with torch.no_grad():
        return nn.functional.mse_loss(model(EVAL_X), EVAL_Y).item()


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def gathered(t: torch.Tensor, gloo: Any) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(gloo))]
    dist.all_gather(out, t, group=gloo)
    return out


def expected_exchanges(steps: int, h: int, f: int) -> int:
    """Fragment exchanges begun in `steps` inner steps (fragment k at (k+1)H/F, then every H)."""
    offsets = [max(1, (k + 1) * h // f) for k in range(f)]
    return sum(1 for t in range(1, steps + 1) for o in offsets if t >= o and (t - o) % h == 0)


def scenario_equivalence(a: argparse.Namespace, ck: Checks) -> None:
    """On 2 nodes (of 1 or 2 ranks): H = 1, plain SGD inside, outer SGD of lr 1 without
    momentum, lossless: DDP with that SGD over every rank, within float32 reordering (one
    fragment and two); then streaming with int4 outer gradients: the loss goes down, the
    snapshot is the same bits everywhere."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    init(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    steps = 6

    ref_model = student()
    ref = DDP(ref_model)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    train(ref, ref_opt, ref_opt.step, rank, range(steps))
    want = flat(ref_model)

    for fragments in (1, 2):
        name = f"H=1 F={fragments}"
        model = student()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dl = DiLoCo(model, opt, sync_every=1, fragments=fragments, codec="none", outer_lr=1.0,
                    outer_momentum=0.0)
        ck.expect(f"{name} layout", (dl.nodes, dl.local_world) == (2, world // 2),
                  f"{dl.nodes} nodes x {dl.local_world}")
        train(dl, opt, dl.step, rank, range(steps))
        got = flat(model)
        ck.same(f"{name} equals DDP", got, want, exact=False)
        ck.expect(f"{name} outer steps", dl.outer_steps == steps * fragments,
                  str(dl.outer_steps))
        everyone = gathered(got, gloo)
        ck.expect(f"{name} same bits on every rank",
                  all(torch.equal(everyone[0], t) for t in everyone), "ranks differ")
        ck.data.setdefault("max_diff_vs_ddp", {})[name] = (got - want).abs().max().item()
        quiesce(gloo)

    # Streaming: 3 fragments, the exchange 2 steps behind, int4 outer gradients.
    h, f, tau, steps = 4, 3, 2, 48
    model = student()
    adamw = torch.optim.AdamW(model.parameters(), lr=3e-3)
    dl = DiLoCo(model, adamw, sync_every=h, fragments=f, overlap_steps=tau, codec="int4")
    before = eval_loss(model)
    train(dl, adamw, dl.step, rank, range(steps))
    # global_parameters(): the snapshot swapped in for an evaluation, nothing applied, the
    # local parameters back bit for bit when the block ends (also on an exception).
    local_before = flat(model).clone()
    in_flight = len(dl._pending)
    with dl.global_parameters() as global_model:
        inside = flat(global_model).clone()
        ck.data["global_eval_loss"] = eval_loss(global_model)
    ck.same("global_parameters holds the snapshot", inside,
            torch.cat([fr.snapshot for fr in dl._fragments]), exact=True)
    ck.same("global_parameters puts the local ones back", flat(model), local_before, exact=True)
    ck.expect("global_parameters applies nothing", len(dl._pending) == in_flight > 0
              and not torch.equal(inside, local_before), f"{len(dl._pending)} of {in_flight}")
    try:
        with dl.global_parameters():
            raise KeyError("inside the block")
    except KeyError:
        pass
    ck.same("global_parameters restores after an exception", flat(model), local_before,
            exact=True)
    dl.flush()
    after = eval_loss(model)
    ck.data["streaming_loss"] = [before, after]
    ck.expect("streaming loss goes down", after < 0.5 * before, f"{before} -> {after}")
    want_ex = expected_exchanges(steps, h, f)
    ck.expect("streaming exchanges", dl.exchanges == want_ex, f"{dl.exchanges} != {want_ex}")
    ck.expect("streaming applied after flush", dl.outer_steps == dl.exchanges and in_flight > 0,
              f"{dl.outer_steps} of {dl.exchanges}, {in_flight} in flight before flush")
    snaps = torch.cat([fr.snapshot for fr in dl._fragments])
    everyone = gathered(snaps, gloo)
    ck.expect("streaming snapshot same bits on every rank",
              all(torch.equal(everyone[0], t) for t in everyone), "ranks differ")
    mine = gathered(flat(model), gloo)
    local = world // 2  # 2 nodes, numbered node by node
    node_start = rank - rank % local
    ck.expect("streaming node's ranks equal",
              all(torch.equal(mine[rank], mine[r]) for r in range(node_start, node_start + local)))
    ck.expect("streaming nodes differ (local steps)", not torch.equal(mine[0], mine[local]))
    residuals = [fr.residual for fr in dl._fragments]
    ck.expect("streaming residuals written",
              all(r is not None for r in residuals)
              and any(r is not None and r.abs().sum() > 0 for r in residuals))
    # int4 across nodes: the cross group's inter-node bytes against a lossless average of the
    # same slices (a 2-rank allreduce sends about its input's bytes).
    import nanoccl

    inter = nanoccl.stats(dl.cross_group)["per_link"]["inter-node"]["bytes_sent"]
    lossless = sum(4 * fr.part for fr in dl._fragments) * want_ex // f
    ck.data["streaming_inter_bytes"] = [inter, lossless]
    ck.expect("streaming int4 bytes", 0 < inter < 0.35 * lossless, f"{inter} vs {lossless}")
    quiesce(gloo)


def scenario_errors_and_checkpoint(a: argparse.Namespace, ck: Checks) -> None:
    """Bad arguments and ranks that disagree: a ValueError on every rank, naming the rank; a
    checkpoint taken with an exchange in flight resumes bit for bit (lossless, and int8)."""
    init(a)
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    limit = a.pg_timeout

    def build(**kw: Any) -> DiLoCo:
        model = student()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        args: dict[str, Any] = {"sync_every": 4}
        args.update(kw)
        return DiLoCo(model, opt, **args)

    cases: list[tuple[str, dict[str, Any], list[int], str]] = [
        ("H=0 everywhere", {"sync_every": 0}, [0, 3], "sync_every (H) must be"),
        ("H=0 on rank 2", {"sync_every": 0 if rank == 2 else 4}, [2], "sync_every (H) must be"),
        ("F > tensors", {"fragments": 7}, [0], "must not exceed the model's parameter tensors"),
        ("tau >= H", {"overlap_steps": 4}, [1], "overlap_steps (tau)"),
        ("unknown codec", {"codec": "int3"}, [0], "codec must be one of"),
        ("H disagrees", {"sync_every": 8 if rank == 3 else 4}, [0, 3],
         "ranks disagree about sync_every (H)"),
        ("F disagrees", {"fragments": 2 if rank == 1 else 1}, [1],
         "ranks disagree about fragments"),
        ("tau disagrees", {"overlap_steps": 1 if rank == 0 else 0}, [0],
         "ranks disagree about overlap_steps (tau)"),
        ("codec disagrees", {"codec": "int8" if rank == 2 else "int4"}, [2],
         "ranks disagree about the codec"),
    ]
    for name, kw, must_name, words in cases:
        msg = expect_error(ck, name, functools.partial(build, **kw), must_name, limit,
                           exc_types=(ValueError,))
        ck.expect(f"{name} says what", words in msg, msg[:300])
    quiesce(gloo)

    # Checkpoint: 12 inner steps straight, against 6, a checkpoint (fragment 0's exchange in
    # flight: begun at step 6, applied at 7), then a fresh model, optimizer and wrapper loaded
    # from it for steps 6..11.
    h, f, tau, total, cut = 4, 2, 1, 12, 6

    def fresh(codec: str) -> tuple[nn.Module, torch.optim.Optimizer, DiLoCo]:
        model = student()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        return model, opt, DiLoCo(model, opt, sync_every=h, fragments=f, overlap_steps=tau,
                                  codec=codec)

    for codec in ("none", "int8"):
        model, opt, dl = fresh(codec)
        train(dl, opt, dl.step, rank, range(total))
        straight = flat(model)

        model, opt, dl = fresh(codec)
        train(dl, opt, dl.step, rank, range(cut))
        ck.expect(f"{codec}: an exchange in flight at the checkpoint", len(dl._pending) == 1,
                  str(len(dl._pending)))
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                    "diloco": dl.state_dict()}, buf)
        del model, opt, dl
        buf.seek(0)
        saved = torch.load(buf)
        model, opt, dl = fresh(codec)  # the wrapper first: it broadcasts rank 0's weights
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        dl.load_state_dict(saved["diloco"])
        train(dl, opt, dl.step, rank, range(cut, total))
        resumed = flat(model)
        ck.same(f"{codec}: resume equals uninterrupted", resumed, straight, exact=True)
        if codec == "none":
            try:
                _, _, other = fresh("int8")
                other.load_state_dict(saved["diloco"])
                ck.fail("checkpoint of another codec", "loaded")
            except ValueError as exc:
                ck.expect("checkpoint of another codec", "checkpoint" in str(exc), str(exc))
        quiesce(gloo)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def scenario_one_node(a: argparse.Namespace, ck: Checks) -> None:
    """Every rank on one node: plain DP (DDP over the node), the same bits as DDP, said once."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    init(a)
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    records = Records()
    logging.getLogger("nanoccl.diloco").addHandler(records)
    steps = 5
    ref_model = student()
    ref = DDP(ref_model)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1, momentum=0.9)
    train(ref, ref_opt, ref_opt.step, rank, range(steps))

    model = student()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    dl = DiLoCo(model, opt, sync_every=2, fragments=2, overlap_steps=1, codec="int4")
    train(dl, opt, dl.step, rank, range(steps))
    dl.flush()
    ck.expect("plain DP", dl.plain_dp and dl.nodes == 1 and dl.outer_optimizer is None,
              f"{dl.nodes} nodes")
    ck.same("equals DDP bit for bit", flat(model), flat(ref_model), exact=True)
    ck.expect("no exchanges", dl.exchanges == 0 and dl.outer_steps == 0)
    said = [m for m in records.messages if "plain data parallelism" in m]
    ck.expect("said once in the log", len(said) == (1 if rank == 0 else 0), str(records.messages))
    ck.data["log"] = records.messages
    quiesce(gloo)


def scenario_uneven_nodes(a: argparse.Namespace, ck: Checks) -> None:
    """Nodes of 2 and 1 ranks: refused on every rank, naming the nodes' ranks."""
    init(a)
    gloo = dist.new_group(backend="gloo")
    model = student()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    msg = expect_error(ck, "uneven nodes", lambda: DiLoCo(model, opt, sync_every=4), [],
                       a.pg_timeout, exc_types=(ValueError,))
    ck.expect("uneven nodes says what", "same number of ranks on every node" in msg
              and "ranks [0, 1]" in msg and "ranks [2]" in msg, msg[:300])
    quiesce(gloo)


SCENARIOS: dict[str, Callable[[argparse.Namespace, Checks], None]] = {
    "equivalence": scenario_equivalence,
    "errors_and_checkpoint": scenario_errors_and_checkpoint,
    "one_node": scenario_one_node,
    "uneven_nodes": scenario_uneven_nodes,
}

if __name__ == "__main__":
    raise SystemExit(job_harness.main(SCENARIOS))
