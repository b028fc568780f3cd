"""nanoccl.hooks in one process: fusion's bookkeeping and its failure path (the DDP runs are
in test_compression.py)."""

from __future__ import annotations

import pytest
import torch

from nanoccl import hooks


class FailedWork:
    def __init__(self, exc: Exception) -> None:
        self.fut: torch.futures.Future = torch.futures.Future()
        self.fut.set_exception(exc)

    def get_future(self) -> torch.futures.Future:
        return self.fut


def test_a_failed_fused_allreduce_fails_every_held_bucket(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No held bucket is left pending (DDP would wait forever) or completed as if reduced."""
    monkeypatch.setattr(hooks, "_compressed",
                        lambda state, key, buf: FailedWork(RuntimeError("peer 3 is gone")))
    state = hooks.ErrorFeedbackState(codec="int8", fuse_bytes=1 << 20)
    futures = [torch.futures.Future() for _ in range(3)]
    state._held = [(i, torch.ones(8), f) for i, f in enumerate(futures)]
    hooks._flush(state)
    for fut in futures:
        assert fut.done()
        with pytest.raises(RuntimeError, match="peer 3 is gone"):
            fut.wait()
    assert state._held == [] and state.held_bytes == 0


def test_an_unfused_failure_is_handed_on() -> None:
    work = FailedWork(RuntimeError("timed out"))
    chained = work.get_future().then(hooks._value_then(torch.ones(2)))
    with pytest.raises(RuntimeError, match="timed out"):
        chained.wait()


@pytest.mark.parametrize("bad", [-1, "big", 1.5])
def test_fuse_bytes_is_checked(bad: object) -> None:
    with pytest.raises(ValueError, match="fuse_bytes"):
        hooks.ErrorFeedbackState(codec="int8", fuse_bytes=bad)  # type: ignore[arg-type]


class Bucket:
    """What the hook reads of a dist.GradBucket."""

    def __init__(self, index: int, buf: torch.Tensor, last: bool) -> None:
        self._index, self._buf, self._last = index, buf, last

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buf

    def is_last(self) -> bool:
        return self._last


def test_buckets_held_from_an_abandoned_pass_are_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A backward that raised after bucket 1 leaves buckets 0-1 held; the next pass's bucket 0
    must not be fused with them."""
    sent: list[int] = []

    class DoneWork:
        def get_future(self) -> torch.futures.Future:
            fut: torch.futures.Future = torch.futures.Future()
            fut.set_result(None)
            return fut

    def compressed(state: object, key: int, buf: torch.Tensor) -> DoneWork:
        sent.append(buf.numel())
        return DoneWork()

    monkeypatch.setattr(hooks, "_compressed", compressed)
    state = hooks.ErrorFeedbackState(codec="int8", fuse_bytes=1 << 20)
    old = [hooks.error_feedback_hook(state, Bucket(i, torch.ones(4), False)) for i in (0, 1)]
    assert sent == [] and len(state._held) == 2  # held, waiting for more
    new = [hooks.error_feedback_hook(state, Bucket(i, torch.ones(4), i == 2)) for i in range(3)]
    assert sent == [12]  # the new pass's three buckets, fused, and nothing of the old one
    for fut in old:
        with pytest.raises(RuntimeError, match="held buckets were dropped"):
            fut.wait()
    assert all(torch.equal(f.wait(), torch.ones(4)) for f in new)
