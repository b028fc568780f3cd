"""Communication hooks: DDP's compressed gradient allreduce with error feedback, and FSDP2's
compressed reduce-scatter and parameter all-gather (``compress_fsdp``, from fsdp_hooks.py).

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
float32 whatever the bucket's type; a CUDA bucket's residual in pinned host memory, where
nanoccl encodes what crosses nodes). Buckets the codec cannot take (other types, or on a
device other than CPU and CUDA) are averaged losslessly with ``dist.all_reduce``.

Small buckets: each allreduce pays a fixed cost (round trips inside and across nodes, the
codec's set-up) that dominates below some size. With ``fuse_bytes=N`` the hook holds
consecutive buckets smaller than N and sends them as one compressed allreduce once they hold
N bytes (or at the step's last bucket), with one residual for the fused group;
``fuse_bytes="auto"`` takes N from the group's link profile (docs/tuning.md): the size
below which the predicted fixed cost of a call is more than a tenth of its time.
"""

from typing import Any

import torch
import torch.distributed as dist

import nanoccl
from nanoccl import _COMPRESSIBLE
# FSDP2's (fsdp_hooks.py), importable from here as before; the private ones for the tests.
from nanoccl.fsdp_hooks import (CompressedAllGather, CompressedReduceScatter,  # noqa: F401
                                FSDPCompression, PlainReduceScatter, _InFlight,
                                _UnitReduceScatter, compress_fsdp, overlap_fsdp)

__all__ = ["CompressedAllGather", "CompressedReduceScatter", "ErrorFeedbackState",
           "FSDPCompression", "PlainReduceScatter", "auto_fuse_bytes", "compress_fsdp",
           "error_feedback_hook", "overlap_fsdp"]


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
        # A CUDA bucket's residual is host memory: nanoccl encodes the staged host copy of
        # what crosses nodes (pinned, so the group's copies of it are fast).
        on = torch.device("cpu") if like.is_cuda else like.device
        r = self.residuals.get(index)
        if r is None or r.shape != like.shape or r.device != on:
            if r is not None:
                self.resets += 1
            r = torch.zeros(like.shape, dtype=torch.float32, device=on,
                            pin_memory=like.is_cuda)
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
    if buf.dtype not in _COMPRESSIBLE or buf.device.type not in ("cpu", "cuda"):
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
