"""DiLoCo and Streaming DiLoCo across nodes, data parallelism inside each node.

::

    import nanoccl.diloco
    inner = torch.optim.AdamW(model.parameters(), lr=3e-4)
    trainer = nanoccl.diloco.DiLoCo(model, inner, sync_every=50, fragments=4,
                                    overlap_steps=2, codec="int4")
    for x, y in batches:                 # this rank's slice of the global batch
        loss = loss_fn(trainer(x), y)    # the model under DDP over the node's ranks
        loss.backward()
        trainer.step()                   # inner step; outer steps as scheduled
        trainer.zero_grad()
    trainer.flush()                      # outer steps still in flight, applied now

Inside a node the ranks are one data-parallel worker: DDP over the node's ranks averages the
gradients every step, losslessly, and ``inner_optimizer`` steps the node's copy of the
model. Across nodes the workers meet only every ``sync_every`` (H) inner steps (DiLoCo,
arXiv 2311.08105): each node's *outer gradient*, the global parameters of the last outer step
(the snapshot) minus its local ones, is averaged over the nodes and an outer optimizer,
Nesterov SGD (lr 0.7, momentum 0.9 by default), applies it to the snapshot; the local
parameters then continue from it.

The cross-node average is nanoccl's: every local rank carries its share, as the backend's
hierarchical algorithms do. Local rank l takes the l-th slice of the flattened outer gradient
and averages it with the l-th local rank of every other node (a group of its own: one rank a
node), with ``nanoccl.allreduce_compressed`` and a per-rank residual for error feedback when
``codec`` is "int8" or "int4" (or "fp16"/"bf16"), or with a lossless ``all_reduce`` when it
is "none"; then the node's ranks all-gather their slices. Every rank ends with the same bits.

Streaming (Streaming DiLoCo, arXiv 2501.18512): the parameters are cut into ``fragments``
(F) by parameter order, about equal in elements; fragment f is synchronised at its own step
of the H-step cycle (inner steps (f+1)·H/F, then every H), its exchange runs in the
background (an async Work) while the next ``overlap_steps`` (tau) inner steps compute, and is
applied tau steps after it began: the fragment's local parameters become
``mixing · local + (1 - mixing) · global`` (mixing 0: the global ones; the default is 0
without overlap, 0.5 with it, so that half of what the fragment learnt during the tau steps
is kept). So the slow link carries 1/F of the model at a time, off the critical path.

One node: the outer loop has nothing to average with; the wrapper is DDP over the node
(plain data parallelism), said once in the log. One rank a node: no DDP, the node's one rank
is the worker. Buffers (batch-norm statistics) are not averaged across nodes.

Every rank must construct the wrapper at the same point (it creates process groups: one a
node, one a local rank across nodes) with the same H, F, tau and codec; what is wrong is
raised on every rank (ValueError), after one small all-gather at construction: H < 1, F
larger than the number of parameter tensors, tau outside [0, H), an unknown codec, ranks
that disagree, nodes of different sizes.

Evaluating the global model: ``with trainer.global_parameters() as model:`` puts each
fragment's snapshot (its global parameters as of its last outer step) into the wrapped
model for the block, under ``torch.no_grad()``, and the local parameters back, bit for bit,
when it ends; exchanges in flight are neither waited for nor applied (``wait()`` waits for
them without applying them, e.g. to leave the link idle while an evaluation is timed).
On one node the model is yielded as it is.

``state_dict()`` / ``load_state_dict()`` hold the outer state of this rank: the inner step
count, the snapshot, the outer optimizer, this rank's residuals and the exchanges in flight
(waited for, their averaged slices kept). Save it per rank next to the model's and the inner
optimizer's state; a run resumed from them continues bit for bit as the uninterrupted one
on the lossless path.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

import nanoccl

__all__ = ["CODECS", "DiLoCo"]

log = logging.getLogger("nanoccl.diloco")

CODECS = ("none", "fp16", "bf16", "int8", "int4")
_STATE_VERSION = 1
# all_gather_into_tensor is deprecated from torch 2.12 on, for all_gather_single (as in
# fsdp_hooks.py).
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


@dataclass
class _Fragment:
    index: int
    params: list[nn.Parameter]
    numel: int
    offset: int  # the inner step of the H-step cycle it is synchronised at (1..H)
    part: int  # elements of the slice each local rank carries (the fragment padded to L x part)
    snapshot: torch.Tensor  # the global parameters of the last outer step, flat float32
    residual: torch.Tensor | None  # this rank's error feedback for its slice (lossy codecs)


@dataclass
class _Exchange:
    fragment: int
    apply_at: int  # the inner step after which it is applied
    part: torch.Tensor  # this rank's slice of the outer gradient; averaged once `work` is done
    work: dist.Work | None  # None: done (or nothing to wait for)


def _node_id() -> str:
    """This rank's node as nanoccl sees it (NANOCCL_NODE_ID, torchrun's GROUP_RANK, else the
    host), from the default group's backend when it is nanoccl; else the same rule here."""
    try:
        return str(nanoccl.stats()["node"])
    except (ValueError, RuntimeError):
        pass
    for name in ("NANOCCL_NODE_ID", "GROUP_RANK"):
        if os.environ.get(name):
            return os.environ[name]
    return socket.gethostname()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_views(views: list[dict[str, Any]]) -> None:
    """Raises ValueError for what is wrong in any rank's view: the same message on every rank,
    since every rank checks the same gathered list."""
    def ranks_with(bad: Any) -> str:
        return ", ".join(f"rank {r} has {v[bad[0]]!r}" for r, v in enumerate(views)
                         if bad[1](v))

    rules = [
        ("sync_every", lambda v: not _is_int(v["sync_every"]) or v["sync_every"] < 1,
         "sync_every (H) must be an integer >= 1"),
        ("fragments", lambda v: not _is_int(v["fragments"]) or v["fragments"] < 1,
         "fragments (F) must be an integer >= 1"),
        ("fragments", lambda v: _is_int(v["fragments"]) and v["fragments"] > v["tensors"],
         "fragments (F) must not exceed the model's parameter tensors "
         f"({views[0]['tensors']} on rank 0)"),
        ("overlap_steps", lambda v: not _is_int(v["overlap_steps"]) or v["overlap_steps"] < 0
         or (_is_int(v["sync_every"]) and v["overlap_steps"] >= max(1, v["sync_every"])),
         "overlap_steps (tau) must be an integer in [0, sync_every)"),
        ("codec", lambda v: v["codec"] not in CODECS,
         f"codec must be one of {', '.join(CODECS)}"),
        ("mixing", lambda v: not isinstance(v["mixing"], (int, float))
         or not 0.0 <= float(v["mixing"]) <= 1.0, "mixing must be a number in [0, 1]"),
    ]
    for key, bad, why in rules:
        if any(bad(v) for v in views):
            raise ValueError(f"nanoccl.diloco: {why}: {ranks_with((key, bad))}")
    for key, what in (("sync_every", "sync_every (H)"), ("fragments", "fragments (F)"),
                      ("overlap_steps", "overlap_steps (tau)"), ("codec", "the codec"),
                      ("block_size", "the codec's block size"), ("outer_lr", "outer_lr"),
                      ("outer_momentum", "outer_momentum"), ("mixing", "mixing"),
                      ("tensors", "the model's parameter tensors"),
                      ("numel", "the model's parameter count")):
        values = [v[key] for v in views]
        if any(x != values[0] for x in values):
            listed = ", ".join(f"rank {r} has {x!r}" for r, x in enumerate(values))
            raise ValueError(f"nanoccl.diloco: ranks disagree about {what}: {listed}")


def _layout(nodes_of: list[str]) -> list[list[int]]:
    """The ranks of each node (nodes in the order of their first rank); equal sizes."""
    order: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes_of):
        order.setdefault(node, []).append(rank)
    nodes = list(order.values())
    sizes = sorted({len(n) for n in nodes})
    if len(sizes) > 1:
        listed = "; ".join(f"node {name!r}: ranks {ranks}" for name, ranks in order.items())
        raise ValueError(f"nanoccl.diloco needs the same number of ranks on every node: {listed}")
    return nodes


def split_fragments(sizes: list[int], fragments: int) -> list[range]:
    """Parameter indices of each fragment: consecutive, non-empty, about equal in elements
    (fragment k ends at the first tensor whose running total reaches (k+1)/F of the whole)."""
    if not 1 <= fragments <= len(sizes):
        raise ValueError(f"{fragments} fragments of {len(sizes)} parameter tensors")
    total = sum(sizes)
    bounds, start, running = [], 0, 0
    for k in range(fragments):
        left = fragments - k - 1  # fragments still to make after this one
        end = start + 1
        running += sizes[start]
        while end < len(sizes) - left and running * fragments < (k + 1) * total:
            running += sizes[end]
            end += 1
        if k == fragments - 1:
            end = len(sizes)
        bounds.append(range(start, end))
        start = end
    return bounds


class DiLoCo:
    """Wraps `model` and its `inner_optimizer` for (Streaming) DiLoCo across the default
    group's nodes, DDP inside each node (see the module's docstring).

    sync_every: H, the inner steps between two outer steps of a fragment (>= 1).
    fragments: F, parameter-order fragments synchronised at staggered steps (1..tensors).
    overlap_steps: tau, the inner steps each exchange runs behind (0 <= tau < H).
    codec: the cross-node average of the outer gradient: "none" (lossless all_reduce),
        "fp16", "bf16", "int8" or "int4" (``nanoccl.allreduce_compressed`` with error
        feedback); block_size as there.
    outer_lr, outer_momentum, nesterov: the outer SGD (Nesterov only with momentum).
    mixing: after an outer step the fragment's local parameters become
        mixing * local + (1 - mixing) * global; None: 0 without overlap, 0.5 with.
    backend, timeout: of the process groups made here (default: nanoccl, and torch's
        default timeout for new groups, which trainers set to the run's).
    ddp_kwargs: for DistributedDataParallel over the node's ranks.

    Call ``step()`` in place of the inner optimizer's (it steps it), and forward through the
    wrapper (or ``.module``: DDP inside the node). The wrapper broadcasts rank 0's parameters
    to every rank when it is constructed: load a checkpoint's model state after that.
    Tested on CPU tensors (the compressed path is nanoccl's CPU one).
    """

    def __init__(
        self,
        model: nn.Module,
        inner_optimizer: torch.optim.Optimizer,
        *,
        sync_every: int,
        fragments: int = 1,
        overlap_steps: int = 0,
        codec: str = "none",
        block_size: int = 0,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        nesterov: bool = True,
        mixing: float | None = None,
        backend: str = "nanoccl",
        timeout: datetime.timedelta | None = None,
        ddp_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("nanoccl.diloco.DiLoCo needs an initialized default process group")
        self.model = model
        self.inner_optimizer = inner_optimizer
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        params = [p for p in model.parameters() if p.requires_grad]
        if mixing is None and _is_int(overlap_steps):
            mixing = 0.5 if overlap_steps > 0 else 0.0
        mine = {"sync_every": sync_every, "fragments": fragments, "overlap_steps": overlap_steps,
                "codec": codec, "block_size": block_size, "outer_lr": outer_lr,
                "outer_momentum": outer_momentum, "mixing": mixing, "tensors": len(params),
                "numel": sum(p.numel() for p in params), "node": _node_id()}
        views: list[Any] = [None] * self.world
        dist.all_gather_object(views, mine)  # the one check every rank agrees on
        _check_views(views)
        assert mixing is not None  # checked above, on every rank
        self.sync_every, self.fragments = int(sync_every), int(fragments)
        self.overlap_steps, self.codec = int(overlap_steps), str(codec)
        self.block_size, self.mixing = int(block_size), float(mixing)
        self.nodes_ranks = _layout([str(v["node"]) for v in views])
        self.nodes = len(self.nodes_ranks)
        self.local_world = len(self.nodes_ranks[0])
        self.node_index = next(i for i, n in enumerate(self.nodes_ranks) if self.rank in n)
        self.local_rank = self.nodes_ranks[self.node_index].index(self.rank)
        self.inner_steps = 0
        self.outer_steps = 0  # fragment exchanges applied on this rank
        self.exchanges = 0  # fragment exchanges begun on this rank

        self.intra_group, self.cross_group = self._make_groups(backend, timeout)
        self._broadcast_from_rank0(params)
        self.module: nn.Module = model
        if self.local_world > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.module = DistributedDataParallel(model, process_group=self.intra_group,
                                                  **(ddp_kwargs or {}))
        self._fragments: list[_Fragment] = []
        self._pending: list[_Exchange] = []
        self.outer_optimizer: torch.optim.Optimizer | None = None
        if self.nodes == 1:
            if self.rank == 0:
                log.warning("nanoccl.diloco: one node (%d rank(s)): no outer steps, plain data "
                            "parallelism (DDP over the node)", self.world)
            return
        lossy = self.codec != "none"
        for k, idx in enumerate(split_fragments([p.numel() for p in params], self.fragments)):
            ps = [params[i] for i in idx]
            numel = sum(p.numel() for p in ps)
            part = -(-numel // self.local_world)
            snapshot = self._flat(ps)
            offset = max(1, ((k + 1) * self.sync_every) // self.fragments)
            residual = torch.zeros(part, dtype=torch.float32, device=snapshot.device) \
                if lossy else None
            self._fragments.append(_Fragment(k, ps, numel, offset, part, snapshot, residual))
        self.outer_optimizer = torch.optim.SGD(
            [f.snapshot for f in self._fragments], lr=outer_lr, momentum=outer_momentum,
            nesterov=bool(nesterov and outer_momentum > 0))

    # ---- set-up ---------------------------------------------------------------------------

    def _make_groups(self, backend: str, timeout: datetime.timedelta | None
                     ) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
        """The node's group (None on one rank a node) and this local rank's group across the
        nodes (None on one node). Every rank creates every group, in the same order."""
        def options() -> Any:
            # Lossless wherever this module does not compress on purpose (whatever
            # NANOCCL_COMPRESSION says): the node's DDP and the "none" codec.
            return nanoccl.Options(compression="none") if backend == "nanoccl" else None

        intra = cross = None
        kwargs: dict[str, Any] = {"backend": backend}
        if timeout is not None:
            kwargs["timeout"] = timeout
        if self.local_world > 1:
            for node, ranks in enumerate(self.nodes_ranks):
                group = dist.new_group(ranks, pg_options=options(), **kwargs)
                if node == self.node_index:
                    intra = group
        if self.nodes > 1:
            for local in range(self.local_world):
                ranks = [n[local] for n in self.nodes_ranks]
                group = dist.new_group(ranks, pg_options=options(), **kwargs)
                if local == self.local_rank:
                    cross = group
        return intra, cross

    @staticmethod
    def _flat(params: list[nn.Parameter]) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in params])

    def _broadcast_from_rank0(self, params: list[nn.Parameter]) -> None:
        """Every node starts from rank 0's parameters (DDP does so only inside a node)."""
        if self.world == 1 or not params:
            return
        flat = torch.cat([p.detach().reshape(-1) for p in params]) \
            if len({p.dtype for p in params}) == 1 else None
        if flat is None:  # mixed dtypes: one call each
            for p in params:
                dist.broadcast(p.data, src=0)
            return
        dist.broadcast(flat, src=0)
        offset = 0
        with torch.no_grad():
            for p in params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    # ---- training -------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The forward pass of the wrapped model (under DDP inside the node)."""
        return self.module(*args, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner_optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def plain_dp(self) -> bool:
        """True on one node: no outer steps."""
        return self.nodes == 1

    def step(self) -> None:
        """One inner optimizer step; then the exchanges due now are applied and the fragments
        due now begin theirs (applied at once when tau is 0)."""
        self.inner_optimizer.step()
        self.inner_steps += 1
        if self.nodes == 1:
            return
        t = self.inner_steps
        due = [e for e in self._pending if e.apply_at <= t]
        self._pending = [e for e in self._pending if e.apply_at > t]
        for exchange in due:
            self._apply(exchange)
        for frag in self._fragments:
            if t >= frag.offset and (t - frag.offset) % self.sync_every == 0:
                exchange = self._begin(frag, t)
                if self.overlap_steps == 0:
                    self._apply(exchange)
                else:
                    self._pending.append(exchange)

    def flush(self) -> None:
        """Applies every exchange still in flight now (at the end of training)."""
        pending, self._pending = self._pending, []
        for exchange in pending:
            self._apply(exchange)

    def _begin(self, frag: _Fragment, t: int) -> _Exchange:
        """Starts averaging this rank's slice of `frag`'s outer gradient across the nodes."""
        with torch.no_grad():
            delta = frag.snapshot - self._flat(frag.params)
        lo = min(frag.numel, self.local_rank * frag.part)
        hi = min(frag.numel, lo + frag.part)
        part = torch.zeros(frag.part, dtype=torch.float32, device=delta.device)
        part[:hi - lo] = delta[lo:hi]
        if self.codec == "none":
            work = dist.all_reduce(part, op=dist.ReduceOp.AVG, group=self.cross_group,
                                   async_op=True)
        else:
            work = nanoccl.allreduce_compressed(
                part, frag.residual, codec=self.codec, block_size=self.block_size,
                op=dist.ReduceOp.AVG, group=self.cross_group, async_op=True)
        self.exchanges += 1
        return _Exchange(frag.index, t + self.overlap_steps, part, work)

    def _apply(self, exchange: _Exchange) -> None:
        """Waits for the exchange, gathers the node's slices, steps the snapshot with the outer
        optimizer and moves the fragment's local parameters to it."""
        if exchange.work is not None:
            exchange.work.wait()
            exchange.work = None
        frag = self._fragments[exchange.fragment]
        if self.local_world > 1:
            full = torch.empty(frag.part * self.local_world, dtype=torch.float32,
                               device=exchange.part.device)
            _all_gather(full, exchange.part, group=self.intra_group)
        else:
            full = exchange.part
        assert self.outer_optimizer is not None
        frag.snapshot.grad = full[:frag.numel]
        self.outer_optimizer.step()
        frag.snapshot.grad = None
        offset = 0
        with torch.no_grad():
            for p in frag.params:
                n = p.numel()
                target = frag.snapshot[offset:offset + n].view_as(p)
                if self.mixing:
                    target = torch.lerp(target, p.detach().to(torch.float32), self.mixing)
                p.copy_(target)
                offset += n
        self.outer_steps += 1

    def wait(self) -> None:
        """Waits for the exchanges in flight, without applying them (each is still applied
        at its step)."""
        for exchange in self._pending:
            if exchange.work is not None:
                exchange.work.wait()
                exchange.work = None

    @contextlib.contextmanager
    def global_parameters(self) -> Iterator[nn.Module]:
        """The wrapped model (not under DDP) holding the global parameters for the block:
        each fragment's snapshot of its last outer step, under ``torch.no_grad()``; the local
        parameters are put back, bit for bit, when the block ends (also on an exception).
        Nothing is communicated; on one node, the model as it is.

            with trainer.global_parameters() as model:
                held_out_loss = loss_fn(model(x_val), y_val)
        """
        params = [p for frag in self._fragments for p in frag.params]
        saved = [p.detach().clone() for p in params]
        try:
            with torch.no_grad():
                for frag in self._fragments:
                    offset = 0
                    for p in frag.params:
                        p.copy_(frag.snapshot[offset:offset + p.numel()].view_as(p))
                        offset += p.numel()
                yield self.model
        finally:
            with torch.no_grad():
                for p, local in zip(params, saved):
                    p.copy_(local)

    # ---- checkpoints ----------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        return {"sync_every": self.sync_every, "fragments": self.fragments,
                "overlap_steps": self.overlap_steps, "codec": self.codec,
                "block_size": self.block_size, "mixing": self.mixing, "nodes": self.nodes,
                "local_world": self.local_world}

    def state_dict(self) -> dict[str, Any]:
        """This rank's outer state (exchanges in flight are waited for, not applied)."""
        self.wait()
        return {
            "version": _STATE_VERSION,
            "config": self._config(),
            "inner_steps": self.inner_steps,
            "outer_steps": self.outer_steps,
            "exchanges": self.exchanges,
            "snapshots": [f.snapshot.detach().clone() for f in self._fragments],
            "residuals": [None if f.residual is None else f.residual.clone()
                          for f in self._fragments],
            "outer_optimizer": (copy.deepcopy(self.outer_optimizer.state_dict())
                                if self.outer_optimizer is not None else None),
            "pending": [{"fragment": e.fragment, "apply_at": e.apply_at,
                         "part": e.part.clone()} for e in self._pending],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what state_dict() saved on this rank (with the same configuration)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"nanoccl.diloco: checkpoint version {state.get('version')!r}, "
                             f"this code reads {_STATE_VERSION}")
        if state.get("config") != self._config():
            raise ValueError(f"nanoccl.diloco: the checkpoint was written with "
                             f"{state.get('config')}, this run is {self._config()}")
        if self._pending:
            raise ValueError("nanoccl.diloco: load_state_dict with exchanges in flight "
                             "(load before the first step)")
        self.inner_steps = int(state["inner_steps"])
        self.outer_steps = int(state["outer_steps"])
        self.exchanges = int(state["exchanges"])
        with torch.no_grad():
            for frag, snap, res in zip(self._fragments, state["snapshots"], state["residuals"]):
                frag.snapshot.copy_(snap)
                if frag.residual is not None:
                    frag.residual.copy_(res)
        if self.outer_optimizer is not None:
            self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self._pending = [
            _Exchange(int(e["fragment"]), int(e["apply_at"]),
                      e["part"].to(self._fragments[int(e["fragment"])].snapshot.device).clone(),
                      None)
            for e in state["pending"]]

    def describe(self) -> str:
        if self.nodes == 1:
            return f"diloco on one node: plain data parallelism over {self.world} rank(s)"
        return (f"diloco (H={self.sync_every}, {self.fragments} fragment(s), "
                f"tau={self.overlap_steps}, outer {self.codec}, mixing {self.mixing:g}; "
                f"{self.nodes} nodes x {self.local_world} rank(s))")
