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


# ---- FSDP2 overlap: the reduce-scatters left in flight, waited for at the end of backward ----


class SlowWork:
    """A reduce-scatter in flight: wait() writes the result (or raises)."""

    def __init__(self, output: torch.Tensor, error: str | None = None) -> None:
        self.output, self.error, self.waited = output, error, False

    def wait(self) -> bool:
        self.waited = True
        if self.error:
            raise RuntimeError(self.error)
        self.output.fill_(7.0)
        return True


class FakeUnitReduceScatter(hooks._UnitReduceScatter):
    def __init__(self, errors: list[str | None]) -> None:
        super().__init__()
        self.errors, self.works, self.async_flags = errors, [], []
        self.in_flight = hooks._InFlight()

    def overlappable(self, output: torch.Tensor, input: torch.Tensor, op: object) -> bool:
        return True  # what FSDP2 would allow: tested through FSDP2 in test_compression.py

    def launch(self, output: torch.Tensor, input: torch.Tensor, group: object, op: object,
               async_op: bool) -> SlowWork | None:
        self.async_flags.append(async_op)
        n = len(self.works)
        work = SlowWork(output, self.errors[n] if n < len(self.errors) else None)
        self.works.append(work)
        if async_op:
            return work
        work.wait()
        return None


def backward_calling(rs: FakeUnitReduceScatter, calls: int) -> list[torch.Tensor]:
    """Runs a backward pass whose gradient hook makes `calls` reduce-scatters (as FSDP2's
    post-backward does), and returns their outputs."""
    outputs = [torch.zeros(4) for _ in range(calls)]

    class Unit(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
            for out in outputs:
                rs(out, torch.ones(8), None, torch.distributed.ReduceOp.AVG)
                assert torch.equal(out, torch.zeros(4))  # returned before the result arrived
            return grad * 2

    x = torch.ones(3, requires_grad=True)
    Unit.apply(x).sum().backward()
    return outputs


def test_overlapped_reduce_scatters_have_arrived_when_backward_returns() -> None:
    rs = FakeUnitReduceScatter([])
    outputs = backward_calling(rs, 3)
    assert rs.async_flags == [True, True, True] and rs.in_flight.overlapped == 3
    assert all(w.waited for w in rs.works) and all(torch.equal(o, torch.full((4,), 7.0))
                                                    for o in outputs)
    assert rs.in_flight.calls == [] and not rs.in_flight.armed
    # The next backward arms the wait again.
    outputs = backward_calling(rs, 1)
    assert torch.equal(outputs[0], torch.full((4,), 7.0)) and rs.in_flight.overlapped == 4


def test_a_failed_overlapped_reduce_scatter_fails_the_backward() -> None:
    """Its error comes out of backward(), after every other call of the pass was waited for;
    the next pass starts clean."""
    rs = FakeUnitReduceScatter([None, "peer 2 is gone"])
    with pytest.raises(RuntimeError, match="peer 2 is gone"):
        backward_calling(rs, 3)
    assert all(w.waited for w in rs.works)
    assert rs.in_flight.calls == [] and not rs.in_flight.armed
    outputs = backward_calling(rs, 1)
    assert torch.equal(outputs[0], torch.full((4,), 7.0))


def test_outside_a_backward_a_reduce_scatter_runs_in_place() -> None:
    """Nothing would wait for it at the end of a backward pass that is not running."""
    rs = FakeUnitReduceScatter([])
    out = torch.zeros(4)
    assert rs(out, torch.ones(8), None, torch.distributed.ReduceOp.AVG) is None
    assert rs.async_flags == [False] and torch.equal(out, torch.full((4,), 7.0))
    assert rs.in_flight.overlapped == 0
