"""DDP communication hooks: compressed gradient allreduce with error feedback.

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

Buckets the codec cannot take (not float32, or on a device the backend has no compressed
path for) are averaged losslessly with ``dist.all_reduce``.
"""

from typing import Any

import torch
import torch.distributed as dist

import nanoccl

__all__ = ["ErrorFeedbackState", "error_feedback_hook"]


class ErrorFeedbackState:
    """The hook's state: the codec, and one residual per DDP bucket index."""

    def __init__(
        self,
        codec: str = "int8",
        *,
        block_size: int = 0,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.codec = codec
        self.block_size = block_size
        self.process_group = process_group
        self.residuals: dict[int, torch.Tensor] = {}
        self.resets = 0  # residuals dropped because their bucket changed size

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


def error_feedback_hook(
    state: ErrorFeedbackState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Averages `bucket` over the group, compressed across nodes with error feedback.

    (No ``from __future__ import annotations`` in this module: DDP checks this function's
    annotations against dist.GradBucket and torch.futures.Future[torch.Tensor] as objects.)
    """
    group = state.process_group
    buf = bucket.buffer()
    if buf.dtype != torch.float32 or buf.device.type != "cpu":
        world = dist.get_world_size(group)
        buf.div_(world)
        work = dist.all_reduce(buf, group=group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])
    residual = state.residual_for(bucket.index(), buf)
    work = nanoccl.allreduce_compressed(
        buf,
        residual,
        codec=state.codec,
        block_size=state.block_size,
        op=dist.ReduceOp.AVG,
        group=group,
        async_op=True,
    )
    assert work is not None
    return work.get_future().then(lambda fut: buf)
