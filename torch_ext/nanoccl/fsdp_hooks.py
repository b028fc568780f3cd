"""FSDP2's collectives through nanoccl: compressed gradient reduce-scatters with error feedback,
parameter all-gathers quantized by a codec (ZeRO++'s qwZ), HSDP's cross-node average (in the
backward, or split with each unit stepped in its next forward), and overlap with compute on
CPU. ``compress_fsdp`` and ``overlap_fsdp`` install them; ``nanoccl.hooks``, beside DDP's
error-feedback hook, re-exports them and the public classes below.

FSDP2 (torch.distributed.fsdp.fully_shard) lets a module replace its reduce-scatter of
gradients and its all-gather of parameters (FSDPModule.set_custom_reduce_scatter /
set_custom_all_gather, torch 2.8 and later). Its calls are one flat buffer per module per
step, often below a group's compression_min_bytes: these compress them whatever their size.
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import nanoccl
from nanoccl import _COMPRESSIBLE

__all__ = ["CompressedAllGather", "CompressedReduceScatter", "FSDPCompression",
           "PlainReduceScatter", "compress_fsdp", "overlap_fsdp"]

try:
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGather
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatter
except ImportError:  # a torch without FSDP2's custom comms: compress_fsdp says so
    _AllGather = _ReduceScatter = object  # type: ignore[assignment,misc]


# FSDP2's own calls: reduce_scatter_single / all_gather_single (torch 2.12 and later; the
# *_tensor names they replace warn there).
_reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


class _HostBuffers:
    """FSDP2 comms allocate their buffers themselves: plain tensors, as FSDP2's default."""

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class _InFlight:
    """The reduce-scatters one backward pass left running, waited for at its end.

    On CPU, FSDP2 runs each unit's reduce-scatter on the thread that runs the backward (its
    "streams" are CUDA's): the backward of the units below waits for the gradients above to
    cross the network. On a GPU the collectives overlap the backward on their own stream; here
    an overlapped unit's call returns at once and the gradients arrive while the backward goes
    on, and an autograd final callback, queued by the pass's first such call, waits for every
    one of them before ``backward()`` returns (as DDP does with its buckets): nothing reads a
    gradient before it has arrived. An error of any of them is raised there, from
    ``backward()``."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, torch.Tensor, torch.Tensor]] = []
        self.armed = False
        self.overlapped = 0  # calls that returned before their result arrived

    def arm(self) -> bool:
        """Queues the wait at the end of the running backward pass (once per pass); False
        outside a backward pass (nothing would wait: the caller runs its call in place)."""
        if not self.armed:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self.wait_all)
            except RuntimeError:
                return False
            self.armed = True
        return True

    def add(self, work: Any, output: torch.Tensor, input: torch.Tensor) -> None:
        # The tensors ride along: FSDP2 drops its own reference to the input once the call
        # returns.
        self.calls.append((work, output, input))
        self.overlapped += 1

    def wait_all(self) -> None:
        calls, self.calls, self.armed = self.calls, [], False
        first: BaseException | None = None
        for work, _, _ in calls:
            try:
                work.wait()
            except BaseException as exc:  # wait for the others too, then raise the first
                first = first or exc
        if first is not None:
            raise first


def _unit_params(unit: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The sharded parameters one FSDP2 unit reduces: its own, not those of units inside it."""
    from torch.distributed.fsdp import FSDPModule

    inner = {id(p) for m in unit.modules() if m is not unit and isinstance(m, FSDPModule)
             for p in m.parameters()}
    return [p for p in unit.parameters() if id(p) not in inner]


class _UnitReduceScatter(_HostBuffers, _ReduceScatter):  # type: ignore[misc,valid-type]
    """One FSDP2 unit's gradient reduce-scatter, overlapped with the rest of the backward
    (``_InFlight``) where FSDP2 reads its output no sooner than the optimizer does: a CPU
    tensor, AVG or PREMUL_SUM (no division after the call), the gradients in the parameters'
    type (no cast after), none accumulated (no gradient from an earlier backward to add to),
    no post-accumulate-grad hook, and a 1-D mesh (HSDP all-reduces the output right after).
    Any other call runs in place, as FSDP2's own."""

    def __init__(self) -> None:
        self.params: list[torch.nn.Parameter] = []
        self.in_flight: _InFlight | None = None
        # Set by compress_fsdp(replicate_group=...): FSDP2 hands the output to the unit's
        # all-reduce hook (_ReplicaAllReduce) right after this call, which runs in place then;
        # the hook overlaps its own call where this one could have been (`may_overlap`).
        self.then_all_reduce = False
        self.may_overlap = False

    def bind(self, unit: torch.nn.Module, in_flight: _InFlight | None) -> None:
        self.params, self.in_flight = _unit_params(unit), in_flight

    def overlappable(self, output: torch.Tensor, input: torch.Tensor, op: Any) -> bool:
        if self.in_flight is None or input.device.type != "cpu":
            return False
        rop = op if isinstance(op, dist.ReduceOp) else dist.ReduceOp(op)
        if not (rop == dist.ReduceOp.AVG or rop == dist.ReduceOp.PREMUL_SUM):
            return False
        for p in self.params:
            mesh = getattr(p, "device_mesh", None)
            if (p.grad is not None or p.dtype != output.dtype
                    or getattr(p, "_post_accumulate_grad_hooks", None)
                    or (mesh is not None and mesh.ndim != 1)):
                return False
        return True

    def launch(self, output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup,
               op: Any, async_op: bool) -> Any:
        raise NotImplementedError

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: Any, async_op: bool = False) -> Any:
        self.may_overlap = not async_op and self.overlappable(output_tensor, input_tensor, op)
        if (not self.may_overlap or self.then_all_reduce
                or not self.in_flight.arm()):  # type: ignore[union-attr]
            return self.launch(output_tensor, input_tensor, group, op, async_op)
        work = self.launch(output_tensor, input_tensor, group, op, True)
        self.in_flight.add(work, output_tensor, input_tensor)  # type: ignore[union-attr]
        return None


class _UnitResidual:
    """One FSDP2 unit's error feedback: a float32 residual shaped like its compressed call's
    input, zeros at first and again when that shape changes (counted in ``resets``)."""

    def __init__(self, error_feedback: bool) -> None:
        self.error_feedback = error_feedback
        self.residual: torch.Tensor | None = None
        self.resets = 0

    def residual_for(self, shape: tuple[int, ...]) -> torch.Tensor | None:
        """The residual to pass with a call on `shape`; None without error feedback."""
        if not self.error_feedback:
            return None
        if self.residual is None or tuple(self.residual.shape) != tuple(shape):
            if self.residual is not None:
                self.resets += 1
            self.residual = torch.zeros(shape, dtype=torch.float32)
        return self.residual


class PlainReduceScatter(_UnitReduceScatter):
    """FSDP2's own reduce-scatter (``dist.reduce_scatter_single``, any backend), overlapped
    with the backward where it can be (``overlap_fsdp``)."""

    def launch(self, output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup,
               op: Any, async_op: bool) -> Any:
        return _reduce_scatter(output, input, op=op, group=group, async_op=async_op)


class CompressedReduceScatter(PlainReduceScatter, _UnitResidual):
    """One FSDP2 unit's gradient reduce-scatter with its inter-node leg compressed by `codec`
    (``nanoccl.reduce_scatter_compressed``): float32, bfloat16 and float16 gradients, SUM, AVG
    or PREMUL_SUM as FSDP2 sends them; other types and devices go lossless.

    With ``error_feedback`` it keeps the unit's residual (float32, the size of the unit's
    unsharded gradients: what this rank's encodings lost, added back next step); a unit whose
    gradient size changes starts over (``resets``).
    """

    def __init__(self, codec: str = "int8", *, block_size: int = 0,
                 error_feedback: bool = True) -> None:
        PlainReduceScatter.__init__(self)
        _UnitResidual.__init__(self, error_feedback)
        self.codec, self.block_size = codec, block_size
        self.calls = 0  # compressed reduce-scatters sent

    def launch(self, output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup,
               op: Any, async_op: bool) -> Any:
        if input.dtype not in _COMPRESSIBLE or input.device.type != "cpu":
            return super().launch(output, input, group, op, async_op)
        residual = self.residual_for((input.numel(),))
        self.calls += 1
        return nanoccl.reduce_scatter_compressed(output, input, residual, codec=self.codec,
                                                 block_size=self.block_size, op=op,
                                                 group=group, async_op=async_op)


class CompressedAllGather(_HostBuffers, _AllGather):  # type: ignore[misc,valid-type]
    """FSDP2's parameter all-gather quantized by `codec` (ZeRO++'s qwZ,
    ``nanoccl.all_gather_compressed``): forward and backward compute with the decoded
    parameters, the same bits on every rank; each rank's sharded parameters, which the optimizer
    updates, stay exact. Modules whose parameters differ in type gather bytes (FSDP2 then views
    them as uint8): those go lossless."""

    def __init__(self, codec: str = "int8", *, block_size: int = 0) -> None:
        self.codec, self.block_size = codec, block_size
        self.calls = 0  # compressed all-gathers sent

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False) -> Any:
        if input_tensor.dtype not in _COMPRESSIBLE or input_tensor.device.type != "cpu":
            return _all_gather(output_tensor, input_tensor, group=group, async_op=async_op)
        self.calls += 1
        return nanoccl.all_gather_compressed(output_tensor, input_tensor, codec=self.codec,
                                             block_size=self.block_size, group=group,
                                             async_op=async_op)


class _ReplicaAllReduce(_UnitResidual):
    """One unit's gradient shard averaged across the replicas of the shard (the same shard on
    the other nodes: `group`), FSDP2's all-reduce hook after the unit's reduce-scatter inside
    the node: HSDP. `codec` compresses it with error feedback (a residual per unit, as
    CompressedReduceScatter's); None: lossless, on any backend. Overlapped with the rest of the
    backward where the reduce-scatter before it could have been (``_UnitReduceScatter``)."""

    def __init__(self, group: dist.ProcessGroup, scatter: _UnitReduceScatter,
                 codec: str | None, block_size: int, error_feedback: bool,
                 in_flight: _InFlight | None) -> None:
        super().__init__(error_feedback)
        self.group, self.scatter, self.in_flight = group, scatter, in_flight
        self.codec, self.block_size = codec, block_size
        self.replicas = dist.get_world_size(group)
        self.calls = 0  # compressed all-reduces sent

    def launch(self, grad: torch.Tensor, async_op: bool) -> Any:
        if self.codec and grad.dtype in _COMPRESSIBLE and grad.device.type == "cpu":
            residual = self.residual_for(tuple(grad.shape))
            self.calls += 1
            return nanoccl.allreduce_compressed(grad, residual, codec=self.codec,
                                                block_size=self.block_size,
                                                op=dist.ReduceOp.AVG, group=self.group,
                                                async_op=async_op)
        grad.div_(self.replicas)  # SUM of the shares: Gloo has no AVG
        return dist.all_reduce(grad, group=self.group, async_op=async_op)

    def __call__(self, grad: torch.Tensor) -> None:
        if self.replicas == 1:
            return
        if (self.in_flight is not None and self.scatter.may_overlap
                and self.in_flight.arm()):
            self.in_flight.add(self.launch(grad, True), grad, grad)
        else:
            self.launch(grad, False)


class _ReplicaStepInForward(_UnitResidual):
    """One unit's HSDP average across the replicas split in two, with the unit's optimizer step
    moved to just before its next forward (``compress_fsdp(step_in_forward=...)``).

    A replica all-reduce is a reduce-scatter and an all-gather, and HSDP runs both in the
    backward: the link idles through the forward and every cross-node byte sits between the
    first gradient and the optimizer step. Here FSDP2's all-reduce hook only reduce-scatters the
    unit's shard across the replicas (this rank keeps 1/r of it, averaged; `codec` with error
    feedback). The all-gathers of the averaged parts start together when the next forward
    starts (the first unit's forward pre-hook launches every pending one, in module order), and
    each unit's pre-hook, run before FSDP2 gathers the unit's parameters inside the node, waits
    for its own, writes the averaged gradient where FSDP2 left the unit's ``.grad`` and steps
    the unit's own optimizer: the link carries the next units' gradients while this one
    computes. Half the bytes cross in the backward and half in the forward, as ZeRO-2's
    gradients and qwZ's parameters do.

    The same update as stepping after the backward: AdamW and the like are elementwise, so one
    optimizer per unit, stepped when the unit next runs, computes what one optimizer over all
    of them would have (not so for a step that reads every gradient at once, e.g. clipping by
    the global norm). Every replica ends with the same bits: each part is encoded once by its
    owner (its encoding error fed back next time) and everyone, the owner too, decodes those
    bytes."""

    def __init__(self, unit: torch.nn.Module, group: dist.ProcessGroup, codec: str | None,
                 block_size: int, error_feedback: bool, make_optimizer: Any,
                 siblings: list["_ReplicaStepInForward"]) -> None:
        super().__init__(error_feedback)  # the reduce-scatter's residual (its input's size)
        self.gather = _UnitResidual(error_feedback)  # the all-gather's (the part's size)
        self.unit, self.group = unit, group
        self.codec, self.block_size = codec, block_size
        self.replicas, self.me = dist.get_world_size(group), dist.get_rank(group)
        self.siblings = siblings  # every unit of the module, in module order (this one too)
        self.params = _unit_params(unit)
        self.optimizer = make_optimizer(self.params) if self.params else None
        self.grad: torch.Tensor | None = None  # FSDP2's reduce output awaiting its gather
        self.part: torch.Tensor | None = None  # this rank's averaged 1/replicas of it
        # The all-gather in flight: its work, output, and the exact values it encoded.
        self.gathering: tuple[Any, torch.Tensor, torch.Tensor | None] | None = None
        self.calls = 0  # compressed reduce-scatters sent (each gathered once)
        unit.register_forward_pre_hook(self._before_forward, prepend=True)

    def _compressed(self, t: torch.Tensor) -> bool:
        return bool(self.codec) and t.dtype in _COMPRESSIBLE and t.device.type == "cpu"

    def __call__(self, grad: torch.Tensor) -> None:
        """FSDP2's all-reduce hook (the backward): the cross-node reduce-scatter, in place."""
        if self.grad is not None:
            raise RuntimeError("compress_fsdp(step_in_forward=...): a second backward reached a "
                               "unit before its forward stepped the first one's gradient; to "
                               "accumulate micro-batches, set_requires_gradient_sync(False) "
                               "on the model for all but the last one")
        if grad.dtype == torch.float16:  # FSDP2 would divide it after this hook, not after ours
            raise RuntimeError("compress_fsdp(step_in_forward=...) takes float32 or bfloat16 "
                               "gradients (FSDP2 post-divides float16 ones): reduce_dtype "
                               "float16 needs step_in_forward=None")
        # The gather writes the average into `grad`, which FSDP2 makes the parameters' .grad
        # only where it neither casts it (a reduce_dtype other than the parameters') nor adds
        # it to a .grad already there.
        for p in self.params:
            if p.requires_grad and (p.dtype != grad.dtype or p.grad is not None):
                raise RuntimeError(
                    "compress_fsdp(step_in_forward=...) needs gradients reduced in the "
                    f"parameters' dtype and no .grad left from before (here {grad.dtype} "
                    f"gradients for {p.dtype} parameters, .grad "
                    f"{'set' if p.grad is not None else 'None'}): use a MixedPrecisionPolicy "
                    "whose reduce_dtype is the parameters' dtype, and let the forward step")
        # FSDP2 divides the output after this hook when it sums in the reduce-scatter, and an
        # explicit forward prefetch gathers a unit's parameters before its pre-hook steps them.
        state = self.unit._get_fsdp_state()  # type: ignore[operator]
        groups = (getattr(state, "_fsdp_param_groups", None)
                  or [getattr(state, "_fsdp_param_group", None)])
        if (any(getattr(g, "force_sum_reduction_for_comms", False) for g in groups)
                or getattr(state, "_states_to_forward_prefetch", None)):
            raise RuntimeError("compress_fsdp(step_in_forward=...) cannot take "
                               "set_force_sum_reduction_for_comms(True) or "
                               "set_modules_to_forward_prefetch(...): the unit would be divided "
                               "or gathered before its step")
        n = grad.numel()
        per = -(-n // self.replicas)
        padded = grad.reshape(-1)
        if per * self.replicas != n:
            padded = torch.zeros(per * self.replicas, dtype=grad.dtype)
            padded[:n].copy_(grad.reshape(-1))
        part = torch.empty(per, dtype=grad.dtype)
        if self._compressed(grad):
            residual = self.residual_for((padded.numel(),))
            self.calls += 1
            nanoccl.reduce_scatter_compressed(part, padded, residual, codec=self.codec or "",
                                              block_size=self.block_size,
                                              op=dist.ReduceOp.AVG, group=self.group)
        else:
            _reduce_scatter(part, padded, group=self.group)  # SUM: Gloo has no AVG
            part.div_(self.replicas)
        self.grad, self.part = grad, part

    def _before_forward(self, *_: Any) -> None:
        for unit in self.siblings:
            unit.launch()
        self.step()

    def launch(self) -> None:
        """Starts the all-gather of the averaged gradient, if a backward left one and it has
        not started (a collective on the replicate group: every rank launches in the same
        order)."""
        if self.part is None or self.gathering is not None:
            return
        part = self.part
        out = torch.empty(part.numel() * self.replicas, dtype=part.dtype)
        if self._compressed(part):
            sent, exact = part, None
            residual = self.gather.residual_for((part.numel(),))
            if residual is not None:
                exact = part.float() + residual
                sent = exact.to(part.dtype)
            work = nanoccl.all_gather_compressed(out, sent, codec=self.codec or "",
                                                 block_size=self.block_size, group=self.group,
                                                 async_op=True)
        else:
            work, exact = _all_gather(out, part, group=self.group, async_op=True), None
        self.gathering = (work, out, exact)

    def step(self) -> None:
        """Waits for the gathered average (launching it if need be), writes it into the
        unit's gradients and steps the unit's parameters; nothing if no backward left one."""
        if self.part is None:
            return
        self.launch()
        assert self.gathering is not None and self.grad is not None
        (work, out, exact), grad, n = self.gathering, self.grad, self.part.numel()
        self.gathering = self.grad = self.part = None
        work.wait()
        if exact is not None and self.gather.residual is not None:
            torch.sub(exact, out[self.me * n:(self.me + 1) * n].float(),
                      out=self.gather.residual)
        grad.reshape(-1).copy_(out[:grad.numel()])
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


class FSDPCompression:
    """What ``compress_fsdp`` (or ``overlap_fsdp``) installed: one compressed reduce-scatter
    per FSDP2 unit (in module order, each with its residual; none without a codec), the shared
    all-gather (or None), and, when overlapping, the calls in flight (``overlapped`` counts the
    reduce-scatters that returned before their result arrived). ``state_dict()`` holds the
    residuals: save and load it per rank, next to the optimizer state (they differ per rank)."""

    def __init__(self, codec: str | None, gather_codec: str | None, block_size: int,
                 reduce_scatters: list[CompressedReduceScatter],
                 all_gather: CompressedAllGather | None,
                 in_flight: _InFlight | None = None,
                 all_reduces: list[_ReplicaAllReduce] | None = None,
                 stepped: list[_ReplicaStepInForward] | None = None) -> None:
        self.codec, self.gather_codec, self.block_size = codec, gather_codec, block_size
        self.reduce_scatters, self.all_gather = reduce_scatters, all_gather
        self.in_flight = in_flight
        self.all_reduces = all_reduces or []
        self.stepped = stepped or []  # step_in_forward: each unit's split average and optimizer
        self.prefetch: _ForwardPrefetch | None = None

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """step_in_forward: the units' own optimizers (one per unit with parameters)."""
        return [u.optimizer for u in self.stepped if u.optimizer is not None]

    @property
    def pending(self) -> int:
        """step_in_forward: units whose gradient a backward left and no forward has stepped."""
        return sum(u.grad is not None for u in self.stepped)

    def flush(self) -> None:
        """step_in_forward: steps every unit a backward left a gradient for, now (before
        evaluating without a forward, saving, or at the end of training); a collective on the
        replicate group, as the forward's would be."""
        for unit in self.stepped:
            unit.launch()
        for unit in self.stepped:
            unit.step()

    @property
    def forward_order(self) -> list[torch.nn.Module]:
        """The units in the order the first forward ran them (each prefetches the next one's
        parameters from the second forward on); empty before it, or without overlap."""
        return list(self.prefetch.order) if self.prefetch is not None else []

    @property
    def overlapped(self) -> int:
        return self.in_flight.overlapped if self.in_flight is not None else 0

    @property
    def reduce_scatter_calls(self) -> int:
        return sum(rs.calls for rs in self.reduce_scatters)

    @property
    def all_gather_calls(self) -> int:
        return self.all_gather.calls if self.all_gather is not None else 0

    @property
    def all_reduce_calls(self) -> int:
        return (sum(ar.calls for ar in self.all_reduces)
                + sum(u.calls for u in self.stepped))

    def _carriers(self) -> dict[str, list[Any]]:
        """The calls that keep residuals, by the state_dict key that holds theirs."""
        return {"residuals": list(self.reduce_scatters),
                "replica_residuals": list(self.all_reduces) + list(self.stepped),
                "gather_residuals": [u.gather for u in self.stepped]}

    def state_dict(self) -> dict[str, Any]:
        """The residuals (and, with step_in_forward, each unit's optimizer state, under
        "optimizers"); with step_in_forward, flush() first."""
        if self.pending:
            raise RuntimeError(f"FSDPCompression.state_dict: {self.pending} unit(s) hold a "
                               f"gradient not yet stepped: call flush() first")
        state: dict[str, Any] = {"codec": self.codec, "block_size": self.block_size}
        for key, calls in self._carriers().items():
            state[key] = {i: c.residual.detach().clone() for i, c in enumerate(calls)
                          if c.residual is not None}
        if self.stepped:
            state["optimizers"] = [o.state_dict() for o in self.optimizers]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("codec") != self.codec or int(state.get("block_size", 0)) != self.block_size:
            raise ValueError(
                f"checkpoint was written with codec {state.get('codec')!r} block "
                f"{state.get('block_size')}, this one uses {self.codec!r} block {self.block_size}")
        for key, calls in self._carriers().items():
            residuals = {int(i): r for i, r in state.get(key, {}).items()}
            if any(i >= len(calls) for i in residuals):
                raise ValueError(f"checkpoint has {key} for units {sorted(residuals)}, this "
                                 f"model has {len(calls)} FSDP2 units that keep them")
            for i, c in enumerate(calls):
                r = residuals.get(i)
                c.residual = (None if r is None
                              else r.detach().clone().to(torch.float32).contiguous())
        if self.stepped:
            saved = state.get("optimizers", [])
            if len(saved) != len(self.optimizers):
                raise ValueError(f"checkpoint has {len(saved)} unit optimizers, this model "
                                 f"steps {len(self.optimizers)}")
            for optimizer, s in zip(self.optimizers, saved):
                optimizer.load_state_dict(s)


def compress_fsdp(module: torch.nn.Module, codec: str | None = "int8", *,
                  gather_codec: str | None = None, block_size: int = 0,
                  error_feedback: bool = True, overlap: bool = False,
                  replicate_group: dist.ProcessGroup | None = None,
                  step_in_forward: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]
                  | None = None) -> FSDPCompression:
    """Compresses the collectives of every FSDP2 unit in `module` (fully_shard applied to it
    and its submodules): gradients reduce-scattered with `codec` across nodes, with error
    feedback (a residual per unit) unless ``error_feedback=False``, and, with `gather_codec`,
    parameters all-gathered quantized by it. On a group within one node everything stays
    lossless. With ``overlap``, what ``overlap_fsdp`` does as well.

    HSDP with error feedback: shard `module` within each node (fully_shard on a 1-D mesh of
    the node's ranks, e.g. ``mesh["shard"]`` of a ("replicate", "shard") mesh) and pass the
    group that joins a rank to its replicas on the other nodes (``mesh.get_group("replicate")``)
    as `replicate_group`: each unit's reduce-scatter then stays inside the node (lossless) and
    its shard is averaged across the nodes by an all-reduce hook, compressed by `codec` with a
    residual per unit (``state_dict()["replica_residuals"]``), overlapped when ``overlap``.
    FSDP2's own HSDP (fully_shard on the 2-D mesh) all-reduces in place with no hook that could
    carry a residual: there the replicate group's own ``compression`` setting applies.

    HSDP with ``step_in_forward=make_optimizer`` (a function from a list of parameters to an
    optimizer, e.g. ``lambda ps: torch.optim.AdamW(ps, lr=1e-3)``): each unit gets its own
    optimizer, the backward only reduce-scatters each shard across the replicas, and the unit's
    next forward first all-gathers the averaged gradient and steps the unit
    (``_ReplicaStepInForward``): half the cross-node bytes move during the forward. Do not call
    an optimizer step or zero_grad yourself; ``comms.flush()`` steps what the last backward
    left (before saving or evaluating without a forward), and ``state_dict()`` holds the units'
    optimizer states with the residuals. Elementwise optimizers only (no clipping by the global
    gradient norm); not with ``overlap``. Every forward steps what the backward before it left:
    to accumulate micro-batches, call ``module.set_requires_gradient_sync(False)`` for all but
    the last one (FSDP2 then reduces nothing until the last backward).
    """
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not units:
        raise ValueError("compress_fsdp: no module has fully_shard applied")
    if _AllGather is object or not hasattr(units[0], "set_custom_reduce_scatter"):
        raise RuntimeError(f"compress_fsdp needs FSDP2's custom comms (torch 2.8 or later), "
                           f"this is torch {torch.__version__}")
    if replicate_group is not None:
        meshes = {getattr(p, "device_mesh", None) for p in module.parameters()}
        if any(m is None or m.ndim != 1 for m in meshes):
            raise ValueError("compress_fsdp(replicate_group=...) needs fully_shard on a 1-D "
                             "mesh of each node's ranks (mesh['shard']), not FSDP2's 2-D HSDP")
    on_cpu = all(p.device.type == "cpu" for p in module.parameters())
    if step_in_forward is not None:
        states = [u._get_fsdp_state() for u in units]
        if replicate_group is None or overlap or not on_cpu:
            raise ValueError("compress_fsdp(step_in_forward=...) needs a replicate_group (HSDP), "
                             "overlap=False and the module on CPU")
        if len({id(s) for s in states}) != len(states):
            raise ValueError("compress_fsdp(step_in_forward=...) needs one fully_shard call per "
                             "module: modules sharded together (fully_shard([a, b])) share "
                             "one all-reduce hook")
    in_flight = _InFlight() if overlap and on_cpu else None
    ag = CompressedAllGather(gather_codec, block_size=block_size) if gather_codec else None
    scatters: list[CompressedReduceScatter] = []
    all_reduces: list[_ReplicaAllReduce] = []
    stepped: list[_ReplicaStepInForward] = []
    for unit in units:
        rs: _UnitReduceScatter | None = None
        if codec and replicate_group is None:
            rs = CompressedReduceScatter(codec, block_size=block_size,
                                         error_feedback=error_feedback)
            scatters.append(rs)
        elif in_flight is not None or replicate_group is not None:
            rs = PlainReduceScatter()
        if rs is not None:
            rs.bind(unit, in_flight)
            unit.set_custom_reduce_scatter(rs)
        if replicate_group is not None and step_in_forward is not None:
            split = _ReplicaStepInForward(unit, replicate_group, codec, block_size,
                                          error_feedback, step_in_forward, stepped)
            unit.set_all_reduce_hook(split)
            stepped.append(split)
        elif replicate_group is not None and rs is not None:
            rs.then_all_reduce = True
            ar = _ReplicaAllReduce(replicate_group, rs, codec, block_size, error_feedback,
                                   in_flight)
            unit.set_all_reduce_hook(ar)
            all_reduces.append(ar)
        if ag is not None:
            unit.set_custom_all_gather(ag)
    comms = FSDPCompression(codec, gather_codec, block_size, scatters, ag, in_flight,
                            all_reduces, stepped)
    if in_flight is not None:
        comms.prefetch = _ForwardPrefetch(module, units)
    return comms


def overlap_fsdp(module: torch.nn.Module) -> FSDPCompression:
    """Overlaps FSDP2's collectives with compute on CPU, where FSDP2 runs them in place (its
    streams are CUDA's; on a GPU this does nothing, the streams overlap already), on any
    backend (Gloo as well):

    - each unit's gradient reduce-scatter returns at once where FSDP2 reads its result no
      sooner than the optimizer (``_UnitReduceScatter``), and ``backward()`` waits for all of
      them before it returns;
    - parameters are all-gathered one unit ahead: in forward, a unit's all-gather starts
      while the unit before it computes (the order is learned from the first forward, which
      runs as before); in backward, FSDP2's own prefetch of the unit below, asynchronous.

    Results are the same bits as without: the same calls, in the same order on every rank.
    Measured on the emulated 2x2 cluster (4 ranks on 2 cores, docs/usage.md): no
    faster there, its runs bound by the link or the shared cores; off unless asked for.
    """
    return compress_fsdp(module, None, overlap=True)


class _ForwardPrefetch:
    """Makes FSDP2's all-gathers of `units` asynchronous and has each unit prefetch the one
    that runs after it in forward, in the order the first forward ran them (one order on
    every rank: the calls must match)."""

    def __init__(self, root: torch.nn.Module, units: list[Any]) -> None:
        self.order: list[Any] = []
        self.hooks = [u.register_forward_pre_hook(self._ran) for u in units]
        self.hooks.append(root.register_forward_hook(self._learned))
        for unit in units:
            unit._set_unshard_async_op(True)

    def _ran(self, unit: Any, *_: Any) -> None:
        if all(u is not unit for u in self.order):
            self.order.append(unit)

    def _learned(self, *_: Any) -> None:
        for hook in self.hooks:
            hook.remove()
        for unit, following in zip(self.order, self.order[1:]):
            unit.set_modules_to_forward_prefetch([following])
