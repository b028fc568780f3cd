"""Parallelism strategies on stock PyTorch, over whatever backend the default group runs.

Each strategy wraps the same model (same seed, same initial weights) and trains it on the
same global batches; they differ only in how the work and the state are split:

  single  one rank, plain training (the 1x1 baseline)
  dp      DistributedDataParallel; the global batch is split across ranks
  zero1   DDP + ZeroRedundancyOptimizer (optimizer state sharded)
  zero2   FSDP2 fully_shard, reshard_after_forward=False (optimizer state + gradients)
  zero3   FSDP2 fully_shard, reshard_after_forward=True (+ parameters)
  zero3-hpz  zero3 resharded after forward to the node only (reshard_after_forward =
          ranks per node: ZeRO++'s hpZ): the backward's all-gathers stay inside the node
  hsdp    FSDP2 fully_shard over a 2-D mesh (replicate across nodes, shard within a node):
          ZeRO-2 inside each node, gradient shards allreduced across nodes
  tp      DTensor tensor parallel: q/k/v and MLP fc column-wise, attention and MLP
          projections row-wise; every rank sees the whole global batch (GPT only)
  pp      torch.distributed.pipelining, one stage per rank, GPipe or 1F1B over
          microbatches of the global batch (GPT only)
  diloco  nanoccl.diloco: DDP inside each node, the nodes averaging their outer gradient
          every H inner steps (Streaming DiLoCo with F fragments and tau steps of overlap;
          the codec of nanoccl+<codec> for the outer gradients, lossless without one)

A strategy's ``train_step(step)`` runs one optimizer step on global batch ``step`` and
returns this rank's loss (the mean over the samples it saw), or None where the rank
computes no loss (pipeline stages before the last).

``held_out_loss(x, y, group)`` (train.py --eval-every; the strategies that hold the whole
model on every rank: single, dp, zero1, diloco) is the mean token loss over held-out
sequences, each rank taking every world-th sequence, summed over the ranks on `group`;
diloco evaluates the global parameters (its snapshot), not a node's local ones.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from trainers.data import Source, shard
from trainers.models import (GPT, BasicBlock, Block, GPTEmbedding, GPTHead, build_model,
                             count_params, gpt_config, gpt_loss, is_gpt)

STRATEGIES = ("single", "dp", "tp", "pp", "zero1", "zero2", "zero3", "zero3-hpz", "hsdp",
              "diloco")
# How the global batch reaches a rank (the studies' Table II).
BATCH_SPLIT = {"single": "whole", "dp": "split", "zero1": "split", "zero2": "split",
               "zero3": "split", "zero3-hpz": "split", "hsdp": "split", "tp": "whole",
               "pp": "microbatches", "diloco": "split"}


class StrategyError(RuntimeError):
    """The strategy cannot run with these arguments (world size, model, torch version)."""


@dataclass
class TrainConfig:
    model: str
    strategy: str
    global_batch: int
    seq_len: int
    lr: float = 3e-4
    seed: int = 1234
    # DDP's bucket_cap_mb (dp, zero1); "tuned": nanoccl.tune.ddp_bucket_cap_mb chooses it from
    # the group's link profile, the model's gradients and this model's measured backward time.
    bucket_cap_mb: float | str | None = None
    microbatches: int | None = None
    schedule: str = "1f1b"
    device: str = "cpu"
    # Ranks per node (torchrun's LOCAL_WORLD_SIZE): hsdp shards within a node of this many.
    # None: LOCAL_WORLD_SIZE from the environment, else the whole world (one node).
    local_world: int | None = None
    # nanoccl+<codec>: the group compresses its inter-node leg (Options(compression=...)), and
    # the gradients are compressed with this codec whatever their size: DDP's buckets through
    # nanoccl.hooks' error-feedback hook, FSDP2's reduce-scatters through compress_fsdp, HSDP's
    # cross-node allreduces on its replicate group.
    codec: str | None = None
    # nanoccl+<codec>+qwz: FSDP2 (zero2, zero3) all-gathers parameters quantized by this codec.
    gather_codec: str | None = None
    # The process group timeout (train.py --timeout); a DeviceMesh's nanoccl groups get it too.
    timeout_s: float | None = None
    nanoccl: bool = False  # the backend is nanoccl (with or without a codec)
    # FSDP2 on CPU (zero2, zero3, zero3-hpz, hsdp): collectives overlapped with compute as a
    # GPU's streams overlap them (nanoccl.hooks.overlap_fsdp), whatever the backend; False
    # (train.py's default: no faster on the emulated cluster, README): in place.
    fsdp_overlap: bool = False
    # hsdp with a codec (not overlapping): "forward" gathers each unit's averaged gradient and
    # steps the unit in its next forward (half the cross-node bytes move then); "backward":
    # the whole cross-node allreduce in the backward, one optimizer step after it.
    hsdp_step: str = "forward"
    # tp on one rank (train.py --probe-one-rank): nothing split, DTensor's dispatch and the
    # (one-rank) collectives kept, so that nanoccl-advise's probe can time the framework's own
    # work a step; no effect on more ranks.
    probe_one_rank: bool = False
    # diloco: H (inner steps between two outer steps of a fragment), F (fragments) and tau
    # (inner steps an exchange runs behind); the outer Nesterov SGD's lr and momentum.
    sync_every: int = 50
    fragments: int = 1
    overlap_steps: int = 0
    outer_lr: float = 0.7
    outer_momentum: float = 0.9


def loss_fn_for(model_name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if is_gpt(model_name):
        return gpt_loss
    return nn.functional.cross_entropy


def make_optimizer(params: Iterable[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    """AdamW, fused (one kernel over all parameters) where it can be: measured on this
    project's 2-core machine, gpt2-tiny's step took 0.5 ms fused against 2.0 ms one parameter
    at a time, and on FSDP2's sharded DTensors 1.1 ms against 5.7 (each DTensor op dispatched
    from Python). Tensor parallelism mixes DTensors and plain tensors, which one fused call
    cannot take: those step one parameter at a time."""
    params = list(params)
    kinds = {isinstance(p, DTensor) for p in params}
    fused = len(kinds) == 1 and all(p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0,
                             **({"fused": True} if fused else {"foreach": False}))


class Strategy:
    name = "base"

    def __init__(self, cfg: TrainConfig, source: Source, rank: int, world: int) -> None:
        self.cfg, self.source, self.rank, self.world = cfg, source, rank, world
        self.device = torch.device(cfg.device)
        self.loss_fn = loss_fn_for(cfg.model)
        self.params = 0  # parameters of the whole model

    def _batch(self, step: int, split: bool) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.source.global_batch(step)
        if split:
            batch = shard(batch, self.rank, self.world)
        return batch[0].to(self.device), batch[1].to(self.device)

    def train_step(self, step: int) -> float | None:
        raise NotImplementedError

    def finish(self) -> None:
        """After the last step: what the strategy left pending (hsdp steps each unit in its
        next forward: the last step's updates)."""

    def comm_groups(self) -> list[Any]:
        """The process groups the strategy's collectives run on (None: the default group);
        the trainer reports their nanoccl byte counts, summed."""
        return [None]

    def describe(self) -> str:
        return self.name

    # Whether held_out_loss() can run: the whole model on every rank (eval_model()).
    evaluates = False

    def eval_model(self) -> contextlib.AbstractContextManager[nn.Module]:
        """The model whose held-out loss is reported (diloco: the global parameters), for a
        with-block."""
        raise StrategyError(f"{self.name}: no held-out evaluation (--eval-every runs on "
                            "single, dp, zero1 and diloco)")

    def quiesce(self) -> None:
        """Waits for communication still running in the background (diloco's exchanges in
        flight) without changing the training: before an evaluation that is timed apart."""

    def held_out_loss(self, x: torch.Tensor, y: torch.Tensor, group: Any,
                      chunk: int = 32) -> tuple[float, str]:
        """The mean token loss of eval_model() over the held-out sequences (x, y), and the
        SHA-256 of the evaluated parameters (this rank's: the first 16 hex digits), by which
        two runs show that they trained the same bits. This rank takes sequences rank,
        rank + world, ...; the sums are all-reduced on `group`, so every rank returns the
        same loss whatever the world size."""
        import hashlib

        import torch.distributed as dist

        mine = torch.arange(self.rank, x.shape[0], self.world)
        total = torch.zeros(2, dtype=torch.float64)
        digest = hashlib.sha256()
        with self.eval_model() as model, torch.no_grad():
            for p in model.parameters():
                digest.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
            for start in range(0, mine.numel(), chunk):
                idx = mine[start:start + chunk]
                logits = model(x[idx].to(self.device))
                target = y[idx].to(self.device)
                loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                   target.flatten(), reduction="sum")
                total[0] += float(loss)
                total[1] += target.numel()
        if self.world > 1:
            dist.all_reduce(total, group=group)
        return float(total[0] / total[1]), digest.hexdigest()[:16]


class _WholeModel(Strategy):
    """Shared by the strategies that hold a (possibly wrapped) full model per rank."""

    split_batch = True

    def __init__(self, cfg: TrainConfig, source: Source, rank: int, world: int) -> None:
        super().__init__(cfg, source, rank, world)
        self.model = build_model(cfg.model, cfg.seed).to(self.device)
        self.params = count_params(self.model)
        self.module: nn.Module = self.model
        self.optim: torch.optim.Optimizer | None = None

    def train_step(self, step: int) -> float | None:
        assert self.optim is not None
        x, y = self._batch(step, self.split_batch)
        self.optim.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.module(x), y)
        loss.backward()
        self.step_optimizer()
        return float(loss.detach())

    def step_optimizer(self) -> None:
        """The optimizer step after each backward (diloco: its outer steps too)."""
        assert self.optim is not None
        self.optim.step()

    @contextlib.contextmanager
    def eval_model(self) -> Iterator[nn.Module]:
        """The whole model, unwrapped (no DDP hooks), as it is on this rank."""
        yield self.model


class Single(_WholeModel):
    name = "single"
    split_batch = False
    evaluates = True

    def __init__(self, cfg: TrainConfig, source: Source, rank: int, world: int) -> None:
        if world != 1:
            raise StrategyError("strategy 'single' runs on one rank; use dp for more")
        super().__init__(cfg, source, rank, world)
        self.optim = make_optimizer(self.model.parameters(), cfg.lr)


def tuned_bucket_cap_mb(model: nn.Module, loss_of: Callable[[], torch.Tensor],
                        codec: str | None) -> float:
    """nanoccl's choice of DDP bucket size for `model` on the default group (a collective):
    from the group's link profile and the backward time of `loss_of()` measured here, each
    bucket compressed with `codec` when the error-feedback hook sends them."""
    from nanoccl.tune import ddp_bucket_cap_mb, measure_backward_seconds

    return ddp_bucket_cap_mb(model, None, measure_backward_seconds(model, loss_of), codec=codec)


def wrap_ddp(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    kwargs: dict[str, object] = {}
    if cfg.bucket_cap_mb is not None:
        if not isinstance(cfg.bucket_cap_mb, float | int):
            raise StrategyError(f"bucket_cap_mb {cfg.bucket_cap_mb!r} was not resolved to MB")
        kwargs["bucket_cap_mb"] = cfg.bucket_cap_mb
    if cfg.device.startswith("cuda"):
        kwargs["device_ids"] = [torch.device(cfg.device).index]
    ddp = DistributedDataParallel(model, **kwargs)  # type: ignore[arg-type]
    if cfg.codec is not None:
        hooks = _hooks()
        ddp.register_comm_hook(hooks.ErrorFeedbackState(codec=cfg.codec),
                               hooks.error_feedback_hook)
    return ddp


class _DDPModel(_WholeModel):
    """A whole model under DDP; a "tuned" bucket size is chosen before DDP wraps the model."""

    def __init__(self, cfg: TrainConfig, source: Source, rank: int, world: int) -> None:
        super().__init__(cfg, source, rank, world)
        self.tuned = cfg.bucket_cap_mb == "tuned"
        if self.tuned:
            x, y = self._batch(0, self.split_batch)
            cfg.bucket_cap_mb = tuned_bucket_cap_mb(
                self.model, lambda: self.loss_fn(self.model(x), y), cfg.codec)
        self.module = wrap_ddp(self.model, cfg)


class DataParallel(_DDPModel):
    name = "dp"
    evaluates = True

    def __init__(self, cfg: TrainConfig, source: Source, rank: int, world: int) -> None:
        super().__init__(cfg, source, rank, world)
        self.optim = make_optimizer(self.module.parameters(), cfg.lr)

    def describe(self) -> str:
        cap = self.cfg.bucket_cap_mb
        shown = "default 25" if cap is None else f"{cap:g}" + (" tuned" if self.tuned else "")
        hook = f", {self.cfg.codec} + error feedback hook" if self.cfg.codec else ""
        return f"dp (DDP, bucket_cap_mb={shown}{hook})"


class Zero1(_DDPModel):
    name = "zero1"
    evaluates = True

    def __init__(self, cfg: TrainConfig, source: Source, rank: int, world: int) -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        super().__init__(cfg, source, rank, world)
        self.optim = ZeroRedundancyOptimizer(
            self.module.parameters(), optimizer_class=torch.optim.AdamW, lr=cfg.lr,
            weight_decay=0.0, fused=True)  # as make_optimizer's

    def describe(self) -> str:
        return "zero1 (DDP + ZeroRedundancyOptimizer)"


def _hooks() -> Any:
    """nanoccl.hooks (FSDP2's compressed and overlapped collectives), imported on demand."""
    from trainers import backends

    backends.import_nanoccl()
    from nanoccl import hooks

    return hooks


def _overlaps(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether FSDP2's collectives are overlapped (--fsdp-overlap on, CPU: a GPU's streams
    overlap them already)."""
    return cfg.fsdp_overlap and device.type == "cpu"


def _units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 shards one by one (transformer blocks / residual blocks)."""
    return [m for m in model.modules() if isinstance(m, (Block, BasicBlock))]


class Zero23(_WholeModel):
    """FSDP2: stage 2 keeps parameters gathered between forward and backward, 3 reshards."""

    def __init__(self, cfg: TrainConfig, source: Source, rank: int, world: int,
                 stage: int, node: int | None = None) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        super().__init__(cfg, source, rank, world)
        self.name = f"zero{stage}" + ("-hpz" if node is not None else "")
        mesh = init_device_mesh(self.device.type, (world,))
        # hpZ (node: ranks per node): after forward each unit keeps its parameters sharded
        # over the node's ranks only (FSDP2 makes a group of each node's ranks, numbered node
        # by node), so the backward gathers them inside the node; forward still gathers them
        # across nodes. One node, or one rank per node: zero3's True / zero2's False.
        reshard: bool | int = stage == 3
        if node is not None and 1 < node < world:
            reshard = node
        elif node == 1:
            reshard = False
        self.reshard = reshard
        for unit in _units(self.model):
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(self.model, mesh=mesh, reshard_after_forward=reshard)
        self.compressed = ""
        compress = cfg.nanoccl and cfg.codec is not None
        overlap = _overlaps(cfg, self.device)
        if compress:
            # Each unit's reduce-scatter is one call per step, mostly below the group's
            # compression_min_bytes: compressed whatever its size, with error feedback (a
            # residual per unit, kept by the hook for the run).
            _hooks().compress_fsdp(self.model, cfg.codec, gather_codec=cfg.gather_codec,
                                   overlap=overlap)
            self.compressed = f", gradients {cfg.codec}" + (
                f", parameters {cfg.gather_codec}" if cfg.gather_codec else "")
        elif overlap:
            # Gloo and nanoccl lossless alike: on CPU FSDP2 runs its collectives in place.
            _hooks().overlap_fsdp(self.model)
        if overlap:
            self.compressed += ", collectives overlapped"
        self.optim = make_optimizer(self.model.parameters(), cfg.lr)

    def comm_groups(self) -> list[Any]:
        """The default group, and for hpZ the groups of the node's ranks FSDP2 made for the
        post-forward shards (the backward's all-gathers run there)."""
        from torch.distributed.fsdp import FSDPModule

        groups: list[Any] = [None]
        for unit in self.model.modules():
            if not isinstance(unit, FSDPModule):
                continue
            for group in unit._get_fsdp_state()._fsdp_param_groups:
                info = group.post_forward_mesh_info
                if info is not None and info is not group.mesh_info:
                    groups.append(info.shard_process_group)
        return groups

    def describe(self) -> str:
        return (f"{self.name} (FSDP2 fully_shard, reshard_after_forward={self.reshard}"
                f"{self.compressed})")


class HybridSharded(_WholeModel):
    """HSDP: FSDP2 over the 2-D mesh (nodes, ranks per node), dims ("replicate", "shard").

    Parameters, gradients and optimizer state are sharded among a node's ranks and
    replicated across nodes. Per unit, a backward reduce-scatters the gradients on the shard
    group (within the node) and then allreduces each rank's shard on the replicate group
    (across nodes: the only inter-node traffic, 1/local_world of the gradients per rank);
    forward all-gathers parameters within the node only.

    reshard_after_forward=False, as zero2: parameters stay gathered from forward to backward,
    so the backward makes no second all-gather per unit. True (zero3's choice) would save only
    memory, at one more intra-node collective per unit on the critical path (the studies' ZeRO-2
    lost to ZeRO-1 on such small calls); the trainers' models fit with their parameters whole.

    With nanoccl+<codec>, or with --fsdp-overlap on (CPU), the units are sharded on the node's
    1-D "shard" sub-mesh and nanoccl.hooks.compress_fsdp(replicate_group=...) installs the
    cross-node allreduce as FSDP2's all-reduce hook: compressed whatever its size with a
    residual per unit (error feedback), and with --fsdp-overlap on overlapped with the rest of
    the backward (FSDP2 runs its own in place on CPU). Otherwise FSDP2's own 2-D HSDP. The
    sub-groups the mesh creates get the default group's codec and the run's timeout.

    One node: the mesh is (1, world), FSDP2 within the node (zero2's calls). One rank per
    node: (nodes, 1), nothing sharded, a full-gradient allreduce per unit across nodes.
    A layout the mesh cannot follow (nodes of unequal size, ranks not numbered node by node)
    is refused on every rank.
    """

    name = "hsdp"

    def __init__(self, cfg: TrainConfig, source: Source, rank: int, world: int) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        local = _node_layout(cfg, rank, world)
        super().__init__(cfg, source, rank, world)
        self.nodes, self.local = world // local, local
        mesh = init_device_mesh(self.device.type, (self.nodes, local),
                                mesh_dim_names=("replicate", "shard"),
                                backend_override=_mesh_backend_override(cfg, ("replicate",
                                                                              "shard")))
        # FSDP2's own HSDP (fully_shard on the 2-D mesh) all-reduces each unit's shard across
        # nodes in place, with no hook for a residual. With a codec, or overlapping on CPU, the
        # units are sharded on the node's 1-D "shard" mesh instead and nanoccl.hooks'
        # all-reduce hook averages each shard across the replicate group: the same HSDP, its
        # cross-node call compressed with error feedback (and, with --fsdp-overlap on,
        # overlapped with the backward).
        compress = cfg.nanoccl and cfg.codec is not None
        overlap = _overlaps(cfg, self.device)
        shard_mesh = mesh["shard"] if compress or overlap else mesh
        for unit in _units(self.model):
            fully_shard(unit, mesh=shard_mesh, reshard_after_forward=False)
        fully_shard(self.model, mesh=shard_mesh, reshard_after_forward=False)
        self.how = ""
        self.comms: Any = None
        # With a codec (on CPU, not overlapping): the cross-node average split, its gather and
        # each unit's optimizer step moved to the unit's next forward
        # (fsdp_hooks._ReplicaStepInForward).
        in_forward = (compress and not overlap and cfg.hsdp_step == "forward"
                      and self.device.type == "cpu")
        if compress or overlap:
            self.comms = _hooks().compress_fsdp(
                self.model, cfg.codec if compress else None, overlap=overlap,
                replicate_group=mesh.get_group("replicate"),
                step_in_forward=(lambda ps: make_optimizer(ps, cfg.lr)) if in_forward else None)
            self.how = ((f", cross-node {cfg.codec} + error feedback" if compress else "")
                        + (", collectives overlapped" if overlap else "")
                        + (", gradients gathered and units stepped in the next forward"
                           if in_forward else ""))
        self.in_forward = in_forward
        self.optim = None if in_forward else make_optimizer(self.model.parameters(), cfg.lr)
        self.groups = [mesh.get_group("replicate"), mesh.get_group("shard")]

    def comm_groups(self) -> list[Any]:
        return [None, *self.groups]

    def train_step(self, step: int) -> float | None:
        if not self.in_forward:
            return super().train_step(step)
        x, y = self._batch(step, self.split_batch)
        loss = self.loss_fn(self.module(x), y)  # each unit first steps on its last gradient
        loss.backward()  # each unit's shard reduce-scattered across nodes
        return float(loss.detach())

    def finish(self) -> None:
        if self.in_forward:
            self.comms.flush()

    def describe(self) -> str:
        return (f"hsdp (FSDP2 fully_shard on mesh replicate {self.nodes} x shard {self.local}, "
                f"reshard_after_forward=False{self.how})")


class DiLoCoStrategy(_WholeModel):
    """nanoccl.diloco.DiLoCo: each node a DDP worker with the inner AdamW; every H inner steps
    (per fragment, staggered) the nodes average their outer gradient, compressed with the
    backend's codec (nanoccl+int4: int4 with error feedback), and an outer Nesterov SGD
    applies it. The global batch is split over every rank, as dp's. The wrapper checks its
    arguments on every rank at once (ValueError: the run stops with exit code 3)."""

    name = "diloco"
    evaluates = True

    def __init__(self, cfg: TrainConfig, source: Source, rank: int, world: int) -> None:
        super().__init__(cfg, source, rank, world)
        if not cfg.nanoccl:
            raise StrategyError("diloco runs on the nanoccl backend (--backend nanoccl or "
                                "nanoccl+<codec>)")
        _hooks()  # imports nanoccl (installed or from the source tree)
        from nanoccl.diloco import DiLoCo

        self.optim = make_optimizer(self.model.parameters(), cfg.lr)
        try:
            self.diloco = DiLoCo(self.model, self.optim, sync_every=cfg.sync_every,
                                 fragments=cfg.fragments, overlap_steps=cfg.overlap_steps,
                                 codec=cfg.codec or "none", outer_lr=cfg.outer_lr,
                                 outer_momentum=cfg.outer_momentum)
        except ValueError as exc:
            raise StrategyError(str(exc)) from exc
        self.module = self.diloco.module

    def step_optimizer(self) -> None:
        self.diloco.step()  # the inner step, then the outer steps due

    @contextlib.contextmanager
    def eval_model(self) -> Iterator[nn.Module]:
        """The global model: each fragment's snapshot swapped in, the local parameters put
        back afterwards (DiLoCo.global_parameters)."""
        with self.diloco.global_parameters() as model:
            yield model

    def quiesce(self) -> None:
        self.diloco.wait()

    def finish(self) -> None:
        self.diloco.flush()

    def comm_groups(self) -> list[Any]:
        return [None, self.diloco.intra_group, self.diloco.cross_group]

    def describe(self) -> str:
        return self.diloco.describe()


def _node_layout(cfg: TrainConfig, rank: int, world: int) -> int:
    """Ranks per node for hsdp's mesh, checked on every rank's view at once (one gather on
    the default group), so that a layout the mesh cannot follow is refused on every rank
    alike instead of leaving the others waiting in init_device_mesh."""
    import torch.distributed as dist

    local = cfg.local_world or env_int("LOCAL_WORLD_SIZE", world)
    mine = (local, env_int("LOCAL_RANK", rank % max(1, local)))
    views: list[Any] = [None] * world
    dist.all_gather_object(views, mine)
    sizes = sorted({v[0] for v in views})
    if len(sizes) > 1:
        raise StrategyError(f"hsdp needs the same number of ranks on every node: "
                            f"LOCAL_WORLD_SIZE is {', '.join(map(str, sizes))} across ranks")
    if local < 1 or world % local:
        raise StrategyError(f"hsdp needs the same number of ranks on every node: {world} "
                            f"ranks do not split into nodes of {local} (LOCAL_WORLD_SIZE)")
    for r, (_, local_rank) in enumerate(views):
        if local_rank != r % local:
            raise StrategyError(f"hsdp needs the ranks numbered node by node, as torchrun "
                                f"numbers them: rank {r} is local rank {local_rank}, not "
                                f"{r % local} of {local}")
    return local


def env_int(name: str, default: int) -> int:
    """An integer from the environment (torchrun's LOCAL_RANK, ...); `default` where it is
    unset or not a number."""
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _mesh_backend_override(cfg: TrainConfig, dims: tuple[str, ...]) -> dict[str, Any] | None:
    """nanoccl's Options for the groups a DeviceMesh creates: new_group gives a group the
    backend's defaults (NANOCCL_* settings) and not the default group's pg_options, so
    without this the replicate group would run lossless under nanoccl+<codec>; and new_group's
    default timeout (30 minutes), not --timeout, so a dead peer would be reported that late."""
    if not cfg.nanoccl:
        return None
    import datetime

    from trainers import backends

    nanoccl = backends.import_nanoccl()
    out = {}
    for dim in dims:
        options = None
        if cfg.codec is not None:
            options = backends.pg_options(backends.parse_backend(f"nanoccl+{cfg.codec}"))
            if dim == "replicate":  # FSDP2's gradient allreduces only: whatever their size
                options = nanoccl.Options(compression=cfg.codec, min_bytes=0)
        if options is None:
            options = nanoccl.Options()
        if cfg.timeout_s:
            options._timeout = datetime.timedelta(seconds=cfg.timeout_s)
        out[dim] = ("nanoccl", options)
    return out


class TensorParallel(_WholeModel):
    name = "tp"
    split_batch = False

    def __init__(self, cfg: TrainConfig, source: Source, rank: int, world: int) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)

        if not is_gpt(cfg.model):
            raise StrategyError("tensor parallelism is implemented for the GPT models only")
        if world < 2 and not cfg.probe_one_rank:
            raise StrategyError("tensor parallelism needs at least 2 ranks")
        gcfg = gpt_config(cfg.model)
        if gcfg.n_head % world or (4 * gcfg.n_embd) % world:
            raise StrategyError(f"{cfg.model}: {gcfg.n_head} heads do not split over {world} ranks")
        super().__init__(cfg, source, rank, world)
        mesh = init_device_mesh(self.device.type, (world,))
        plan = {
            "attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(),
            "attn.v_proj": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
            "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel(),
        }
        assert isinstance(self.model, GPT)
        for block in self.model.blocks:
            parallelize_module(block, mesh, plan)  # type: ignore[arg-type]
        self.optim = make_optimizer(self.model.parameters(), cfg.lr)

    def describe(self) -> str:
        return "tp (DTensor: q/k/v, fc colwise; attn proj, mlp proj rowwise)"


class GPTStage(nn.Module):
    """A contiguous slice of GPT: optional embedding, some blocks, optional head."""

    def __init__(self, embed: GPTEmbedding | None, blocks: list[Block],
                 head: GPTHead | None) -> None:
        super().__init__()
        self.embed = embed
        self.blocks = nn.ModuleList(blocks)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(x)
        return x


def split_layers(n_layer: int, stages: int) -> list[range]:
    """Blocks per stage: as even as possible, the extra ones to the middle stages.

    The first stage also runs the embedding and the last the LM head, so they get the
    smaller share first.
    """
    base, extra = divmod(n_layer, stages)
    order = sorted(range(stages), key=lambda s: (s in (0, stages - 1), s))
    counts = [base] * stages
    for s in order[:extra]:
        counts[s] += 1
    ranges, start = [], 0
    for c in counts:
        ranges.append(range(start, start + c))
        start += c
    return ranges


class PipelineParallel(Strategy):
    name = "pp"

    def __init__(self, cfg: TrainConfig, source: Source, rank: int, world: int) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        if not is_gpt(cfg.model):
            raise StrategyError("pipeline parallelism is implemented for the GPT models only")
        if world < 2:
            raise StrategyError("pipeline parallelism needs at least 2 ranks")
        super().__init__(cfg, source, rank, world)
        self.microbatches = cfg.microbatches or world  # the study's setting: m = p
        if cfg.global_batch % self.microbatches:
            raise StrategyError(f"global batch {cfg.global_batch} is not divisible by "
                                f"{self.microbatches} microbatches")
        # Built whole on every rank from one seed, then cut: every stage starts from the
        # weights the single-rank model has. The LM head cannot share the embedding's
        # weight across stages, so both start equal. (The tied model's shared weight is
        # the LM head's draw: the init visits lm_head after wte.)
        full = build_model(cfg.model, cfg.seed, tie_weights=False)
        assert isinstance(full, GPT)
        with torch.no_grad():
            full.embed.wte.weight.copy_(full.head.lm_head.weight)
        self.params = count_params(full)
        layers = split_layers(full.cfg.n_layer, world)[rank]
        self.layers = layers
        first, last = rank == 0, rank == world - 1
        self.is_last = last
        self.stage_module = GPTStage(full.embed if first else None,
                                     [full.blocks[i] for i in layers],
                                     full.head if last else None).to(self.device)
        del full
        stage = PipelineStage(self.stage_module, rank, world, self.device)
        kind = cfg.schedule.lower()
        if kind == "gpipe":
            self.schedule = ScheduleGPipe(stage, self.microbatches, loss_fn=gpt_loss)
        elif kind == "1f1b":
            self.schedule = Schedule1F1B(stage, self.microbatches, loss_fn=gpt_loss)
        else:
            raise StrategyError(f"unknown pipeline schedule {cfg.schedule!r} (gpipe, 1f1b)")
        self.optim = make_optimizer(self.stage_module.parameters(), cfg.lr)

    def train_step(self, step: int) -> float | None:
        x, y = self._batch(step, split=False)
        self.optim.zero_grad(set_to_none=True)
        if self.rank == 0:
            self.schedule.step(x)
            loss = None
        elif self.is_last:
            losses: list[torch.Tensor] = []
            self.schedule.step(target=y, losses=losses)
            loss = float(torch.stack([v.detach() for v in losses]).mean())
        else:
            self.schedule.step()
            loss = None
        self.optim.step()
        return loss

    def describe(self) -> str:
        return (f"pp ({self.cfg.schedule}, {self.microbatches} microbatches, this stage: blocks "
                f"{self.layers.start}..{self.layers.stop - 1}"
                f"{' + embedding' if self.rank == 0 else ''}"
                f"{' + head' if self.is_last else ''})")


def make_strategy(cfg: TrainConfig, source: Source, rank: int, world: int) -> Strategy:
    name = cfg.strategy
    if cfg.gather_codec is not None and name not in ("zero2", "zero3", "zero3-hpz"):
        raise StrategyError(f"+qwz quantizes FSDP2's parameter all-gathers: zero2 and zero3 "
                            f"only (and zero3-hpz), not {name}")
    if name == "single":
        return Single(cfg, source, rank, world)
    if name == "dp":
        return DataParallel(cfg, source, rank, world)
    if name == "zero1":
        return Zero1(cfg, source, rank, world)
    if name in ("zero2", "zero3"):
        return Zero23(cfg, source, rank, world, stage=int(name[-1]))
    if name == "zero3-hpz":
        return Zero23(cfg, source, rank, world, stage=3, node=_node_layout(cfg, rank, world))
    if name == "hsdp":
        return HybridSharded(cfg, source, rank, world)
    if name == "tp":
        return TensorParallel(cfg, source, rank, world)
    if name == "pp":
        return PipelineParallel(cfg, source, rank, world)
    if name == "diloco":
        return DiLoCoStrategy(cfg, source, rank, world)
    raise StrategyError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")


def check_batch(strategy: str, global_batch: int, world: int) -> None:
    if BATCH_SPLIT.get(strategy) == "split" and global_batch % world:
        raise StrategyError(f"global batch {global_batch} is not divisible by {world} ranks "
                            f"({strategy} splits it)")
