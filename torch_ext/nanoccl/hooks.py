"""Communication hooks: DDP's compressed gradient allreduce with error feedback, and FSDP2's
compressed reduce-scatter and parameter all-gather (``compress_fsdp``).

::

    from nanoccl import hooks
    state = hooks.ErrorFeedbackState(codec="int8")
    ddp.register_comm_hook(state, hooks.error_feedback_hook)
    ...
    torch.save({"model": ddp.state_dict(), "ef": state.state_dict()}, path)  # per rank
    state.load_state_dict(torch.load(path)["ef"])                         # on restore

Each gradient bucket is averaged with ``nanoccl.allreduce_compressed``: lossless inside a
node, `codec` across nodes, the same bits on every rank. The state keeps one residual per
bucket (what this rank's encodings lost, in float32), folded into the bucket's next step, so
what compression drops is delayed, not lost (EF-SGD). The residuals differ per rank: save and
load them per rank, next to the optimizer state.

float32, bfloat16 and float16 buckets are compressed (the reduction in float32, the residual
float32 whatever the bucket's type). Buckets the codec cannot take (other types, or on a
device the backend has no compressed path for) are averaged losslessly with
``dist.all_reduce``.

Small buckets: each allreduce pays a fixed cost (round trips inside and across nodes, the
codec's set-up) that dominates below some size. With ``fuse_bytes=N`` the hook holds
consecutive buckets smaller than N and sends them as one compressed allreduce once they hold
N bytes (or at the step's last bucket), with one residual for the fused group;
``fuse_bytes="auto"`` takes N from the group's link profile (README "Tuning"): the size
below which the predicted fixed cost of a call is more than a tenth of its time.
"""

from typing import Any

import torch
import torch.distributed as dist

import nanoccl

__all__ = ["CompressedAllGather", "CompressedReduceScatter", "ErrorFeedbackState",
           "FSDPCompression", "auto_fuse_bytes", "compress_fsdp", "error_feedback_hook"]


class ErrorFeedbackState:
    """The hook's state: the codec, and one residual per DDP bucket index."""

    def __init__(
        self,
        codec: str = "int8",
        *,
        block_size: int = 0,
        process_group: dist.ProcessGroup | None = None,
        fuse_bytes: int | str = 0,
    ) -> None:
        self.codec = codec
        self.block_size = block_size
        self.process_group = process_group
        if fuse_bytes != "auto" and not (isinstance(fuse_bytes, int) and fuse_bytes >= 0):
            raise ValueError(f"fuse_bytes must be a size >= 0 or 'auto', got {fuse_bytes!r}")
        self.fuse_bytes = fuse_bytes  # "auto": resolved at the first bucket
        # One residual per bucket index; a fused group's under its first bucket's index.
        self.residuals: dict[int, torch.Tensor] = {}
        self.resets = 0  # residuals dropped because their bucket changed size
        self.calls = 0  # compressed allreduces sent (fewer than buckets when fused)
        self._held: list[tuple[int, torch.Tensor, torch.futures.Future[torch.Tensor]]] = []

    @property
    def held_bytes(self) -> int:
        """Bytes of the buckets held for fusion, not sent yet."""
        return sum(b.numel() * b.element_size() for _, b, _ in self._held)

    def fuse_limit(self) -> int:
        """The fusion threshold in bytes (0: no fusion); "auto" is resolved from the group's
        link profile once (0 without a profile)."""
        if self.fuse_bytes == "auto":
            self.fuse_bytes = auto_fuse_bytes(self.process_group, self.codec)
        return int(self.fuse_bytes)

    def residual_for(self, index: int, like: torch.Tensor) -> torch.Tensor:
        """Bucket `index`'s residual, zeros when new or when the bucket changed shape.

        DDP rebuilds its buckets once, after the first step, in the order gradients became
        ready; a residual whose bucket changed cannot be mapped onto the new one and starts
        over (counted in ``resets``).
        """
        r = self.residuals.get(index)
        if r is None or r.shape != like.shape or r.device != like.device:
            if r is not None:
                self.resets += 1
            r = torch.zeros_like(like, dtype=torch.float32, memory_format=torch.contiguous_format)
            self.residuals[index] = r
        return r

    def state_dict(self) -> dict[str, Any]:
        return {
            "codec": self.codec,
            "block_size": self.block_size,
            "residuals": {i: r.detach().clone() for i, r in self.residuals.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("codec") != self.codec or int(state.get("block_size", 0)) != self.block_size:
            raise ValueError(
                f"checkpoint was written with codec {state.get('codec')!r} block "
                f"{state.get('block_size')}, this state uses {self.codec!r} block {self.block_size}"
            )
        self.residuals = {int(i): r.detach().clone() for i, r in state["residuals"].items()}


_COMPRESSIBLE = (torch.float32, torch.bfloat16, torch.float16)

# Sizes "auto" chooses the fusion threshold from, and the share of a call its fixed cost may
# take in a bucket that is sent on its own.
_FUSE_CANDIDATES = tuple(1 << k for k in range(14, 27))  # 16 KiB .. 64 MiB
_FIXED_COST_SHARE = 0.1


def auto_fuse_bytes(group: dist.ProcessGroup | None = None, codec: str = "int8") -> int:
    """The smallest candidate size whose allreduce compressed with `codec` (as the hook sends
    it) spends at most a tenth of its predicted time on the fixed cost of a call (the
    prediction for one element); 0 when the group has no link profile. The same on every rank
    (one profile, one model)."""
    backend = nanoccl.get_backend(group)
    if backend.link_profile() is None:
        return 0

    def predict(count: int) -> float:
        return backend.predict_allreduce(count, torch.float32, codec)[2]

    fixed = predict(1)
    for size in _FUSE_CANDIDATES:
        if fixed <= _FIXED_COST_SHARE * predict(size // 4):
            return size
    return _FUSE_CANDIDATES[-1]


def _compressed(state: ErrorFeedbackState, key: int, buf: torch.Tensor) -> dist.Work:
    work = nanoccl.allreduce_compressed(
        buf,
        state.residual_for(key, buf),
        codec=state.codec,
        block_size=state.block_size,
        op=dist.ReduceOp.AVG,
        group=state.process_group,
        async_op=True,
    )
    assert work is not None
    state.calls += 1
    return work


def _flush(state: ErrorFeedbackState) -> None:
    """Sends the held buckets as one compressed allreduce; their futures complete with it (or
    fail with its error: DDP then raises, never steps on unreduced gradients)."""
    held, state._held = state._held, []
    if not held:
        return
    flat = held[0][1] if len(held) == 1 else torch.cat([buf.reshape(-1) for _, buf, _ in held])
    work = _compressed(state, held[0][0], flat)

    def scatter(done: torch.futures.Future) -> None:
        try:
            done.value()  # raises the allreduce's error
            if len(held) > 1:
                offset = 0
                for _, buf, _ in held:
                    n = buf.numel()
                    buf.reshape(-1).copy_(flat[offset:offset + n])
                    offset += n
        except Exception as exc:  # noqa: BLE001 - handed on to every held bucket's future
            for _, _, fut in held:
                fut.set_exception(exc)
            return
        for _, buf, fut in held:
            fut.set_result(buf)

    work.get_future().then(scatter)


def _drop_stale(state: ErrorFeedbackState) -> None:
    """Buckets held from a backward pass that never reached its last bucket (it raised): a new
    pass has begun (the bucket index went back), so they are failed, never sent with it, which
    would fuse another pass's gradients and could differ between ranks."""
    stale, state._held = state._held, []
    why = RuntimeError("nanoccl.hooks: a backward pass ended before its last gradient bucket; "
                       "its held buckets were dropped")
    for _, _, fut in stale:
        if not fut.done():
            fut.set_exception(why)


def _value_then(buf: torch.Tensor) -> Any:
    """A `then` callback that hands on the work's error, else returns `buf`."""
    def done(fut: torch.futures.Future) -> torch.Tensor:
        fut.value()  # raises the allreduce's error
        return buf
    return done


def error_feedback_hook(
    state: ErrorFeedbackState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Averages `bucket` over the group, compressed across nodes with error feedback.

    (No ``from __future__ import annotations`` in this module: DDP checks this function's
    annotations against dist.GradBucket and torch.futures.Future[torch.Tensor] as objects.)
    """
    group = state.process_group
    buf = bucket.buffer()
    if buf.dtype not in _COMPRESSIBLE or buf.device.type != "cpu":
        _flush(state)  # held buckets go first: DDP's buckets are reduced in order
        world = dist.get_world_size(group)
        buf.div_(world)
        work = dist.all_reduce(buf, group=group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])
    if state._held and bucket.index() <= state._held[-1][0]:
        _drop_stale(state)
    limit = state.fuse_limit()
    nbytes = buf.numel() * buf.element_size()
    if limit > 0 and nbytes < limit:
        if state._held and state._held[0][1].dtype != buf.dtype:
            _flush(state)  # one fused call holds one type
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        state._held.append((bucket.index(), buf, fut))
        if state.held_bytes >= limit or bucket.is_last():
            _flush(state)
        return fut
    _flush(state)  # a large bucket goes on its own, after the small ones held before it
    work = _compressed(state, bucket.index(), buf)
    return work.get_future().then(_value_then(buf))


# ---- FSDP2 -------------------------------------------------------------------------------------
#
# FSDP2 (torch.distributed.fsdp.fully_shard) lets a module replace its reduce-scatter of
# gradients and its all-gather of parameters (FSDPModule.set_custom_reduce_scatter /
# set_custom_all_gather, torch 2.8 and later). Its calls are one flat buffer per module per
# step, often below a group's compression_min_bytes: these compress them whatever their size.

try:
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGather
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatter
except ImportError:  # a torch without FSDP2's custom comms: compress_fsdp says so
    _AllGather = _ReduceScatter = object  # type: ignore[assignment,misc]


class _HostBuffers:
    """FSDP2 comms allocate their buffers themselves: plain tensors, as FSDP2's default."""

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class CompressedReduceScatter(_HostBuffers, _ReduceScatter):  # type: ignore[misc,valid-type]
    """One FSDP2 unit's gradient reduce-scatter with its inter-node leg compressed by `codec`
    (``nanoccl.reduce_scatter_compressed``): float32, bfloat16 and float16 gradients, SUM, AVG
    or PREMUL_SUM as FSDP2 sends them; other types and devices go lossless.

    With ``error_feedback`` it keeps the unit's residual (float32, the size of the unit's
    unsharded gradients: what this rank's encodings lost, added back next step); a unit whose
    gradient size changes starts over (``resets``).
    """

    def __init__(self, codec: str = "int8", *, block_size: int = 0,
                 error_feedback: bool = True) -> None:
        self.codec, self.block_size, self.error_feedback = codec, block_size, error_feedback
        self.residual: torch.Tensor | None = None
        self.resets = 0
        self.calls = 0  # compressed reduce-scatters sent

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: Any, async_op: bool = False) -> Any:
        if input_tensor.dtype not in _COMPRESSIBLE or input_tensor.device.type != "cpu":
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                              async_op=async_op)
        residual = None
        if self.error_feedback:
            if self.residual is None or self.residual.numel() != input_tensor.numel():
                if self.residual is not None:
                    self.resets += 1
                self.residual = torch.zeros(input_tensor.numel(), dtype=torch.float32)
            residual = self.residual
        self.calls += 1
        return nanoccl.reduce_scatter_compressed(output_tensor, input_tensor, residual,
                                                 codec=self.codec, block_size=self.block_size,
                                                 op=op, group=group, async_op=async_op)


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
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group,
                                               async_op=async_op)
        self.calls += 1
        return nanoccl.all_gather_compressed(output_tensor, input_tensor, codec=self.codec,
                                             block_size=self.block_size, group=group,
                                             async_op=async_op)


class FSDPCompression:
    """What ``compress_fsdp`` installed: one reduce-scatter per FSDP2 unit (in module order,
    each with its residual) and the shared all-gather (or None). ``state_dict()`` holds the
    residuals: save and load it per rank, next to the optimizer state (they differ per rank)."""

    def __init__(self, codec: str | None, gather_codec: str | None, block_size: int,
                 reduce_scatters: list[CompressedReduceScatter],
                 all_gather: CompressedAllGather | None) -> None:
        self.codec, self.gather_codec, self.block_size = codec, gather_codec, block_size
        self.reduce_scatters, self.all_gather = reduce_scatters, all_gather

    @property
    def reduce_scatter_calls(self) -> int:
        return sum(rs.calls for rs in self.reduce_scatters)

    @property
    def all_gather_calls(self) -> int:
        return self.all_gather.calls if self.all_gather is not None else 0

    def state_dict(self) -> dict[str, Any]:
        return {"codec": self.codec, "block_size": self.block_size,
                "residuals": {i: rs.residual.detach().clone()
                              for i, rs in enumerate(self.reduce_scatters)
                              if rs.residual is not None}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("codec") != self.codec or int(state.get("block_size", 0)) != self.block_size:
            raise ValueError(
                f"checkpoint was written with codec {state.get('codec')!r} block "
                f"{state.get('block_size')}, this one uses {self.codec!r} block {self.block_size}")
        residuals = {int(i): r for i, r in state["residuals"].items()}
        if any(i >= len(self.reduce_scatters) for i in residuals):
            raise ValueError(f"checkpoint has residuals for units {sorted(residuals)}, this "
                             f"model has {len(self.reduce_scatters)} FSDP2 units")
        for i, rs in enumerate(self.reduce_scatters):
            r = residuals.get(i)
            rs.residual = None if r is None else r.detach().clone().to(torch.float32).contiguous()


def compress_fsdp(module: torch.nn.Module, codec: str | None = "int8", *,
                  gather_codec: str | None = None, block_size: int = 0,
                  error_feedback: bool = True) -> FSDPCompression:
    """Compresses the collectives of every FSDP2 unit in `module` (fully_shard applied to it
    and its submodules): gradients reduce-scattered with `codec` across nodes, with error
    feedback (a residual per unit) unless ``error_feedback=False``, and, with `gather_codec`,
    parameters all-gathered quantized by it. On a group within one node everything stays
    lossless.

    HSDP (a 2-D mesh) is not handled here: its cross-node traffic is an all-reduce on the
    replicate group, compressed by that group's own ``compression`` setting (without error
    feedback: FSDP2 gives that all-reduce no hook that could carry a residual).
    """
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not units:
        raise ValueError("compress_fsdp: no module has fully_shard applied")
    if _AllGather is object or not hasattr(units[0], "set_custom_reduce_scatter"):
        raise RuntimeError(f"compress_fsdp needs FSDP2's custom comms (torch 2.8 or later), "
                           f"this is torch {torch.__version__}")
    ag = CompressedAllGather(gather_codec, block_size=block_size) if gather_codec else None
    scatters = []
    for unit in units:
        if codec:
            rs = CompressedReduceScatter(codec, block_size=block_size,
                                         error_feedback=error_feedback)
            unit.set_custom_reduce_scatter(rs)
            scatters.append(rs)
        if ag is not None:
            unit.set_custom_all_gather(ag)
    return FSDPCompression(codec, gather_codec, block_size, scatters, ag)
