"""How a step's compute and calls overlap, for nanoccl-advise (advise.py): FSDP2's step with
its allgathers prefetched and reduce-scatters after each unit's backward (fsdp_step), and a
pipeline's step simulated microbatch by microbatch in GPipe or 1F1B order (pipeline_step).
DDP's buckets against backward are nanoccl.tune.ddp_step_seconds."""

from __future__ import annotations

from nanoccl.advise_traffic import AdviseError

FORWARD_SHARE = 1.0 / 3.0  # of a device's compute; backward takes the rest


def fsdp_step(forward_s: float, backward_s: float, shares: list[float],
              gathers: list[float], again: list[float], reduces: list[float]) -> float:
    """One FSDP2 step, its calls on one queue in the order they are issued: forward's
    allgathers ahead of the compute (a unit waits for its own); in backward, ZeRO-3's
    allgather of the next unit when a unit starts (prefetch) and a unit's reduce-scatter when
    its backward ends. `shares`: each unit's part of the compute, in forward order; backward
    runs the units in reverse (the lists `again` and `reduces` are in backward order)."""
    comm = t = 0.0
    for share, ag in zip(shares, gathers):
        comm += ag
        t = max(t, comm) + forward_s * share
    back = list(reversed(shares[1:])) + shares[:1]
    ready = [0.0] * len(back)
    if again:
        comm = max(comm, t) + again[0]
        ready[0] = comm
    for i, share in enumerate(back):
        start = max(t, ready[i])
        if again and i + 1 < len(back):
            comm = max(comm, start) + again[i + 1]
            ready[i + 1] = comm
        t = start + backward_s * share
        comm = max(comm, t) + reduces[i]
    return max(t, comm)


def pipeline_step(stages: int, microbatches: int, schedule: str, slot_s: float,
                  sends: list[float]) -> float:
    """A pipeline step, simulated: stage s runs its forwards (F) and backwards (B) in the
    schedule's order (GPipe: all F then all B; 1F1B: min(m, p - s) F first, then B and F in
    turn); an F needs the activation from stage s - 1, a B the gradient from stage s + 1; each
    boundary's link carries one message at a time in each direction (`sends[b]` seconds for
    boundary b, either way). `slot_s`: one microbatch's F + B on one stage."""
    p, m = stages, microbatches
    f_s, b_s = slot_s * FORWARD_SHARE, slot_s * (1 - FORWARD_SHARE)
    orders = []
    for s in range(p):
        if schedule == "gpipe":
            orders.append([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
            continue
        warm = min(m, p - s)
        order = [("F", i) for i in range(warm)]
        nb, nf = 0, warm
        while nb < m:
            order.append(("B", nb))
            nb += 1
            if nf < m:
                order.append(("F", nf))
                nf += 1
        orders.append(order)
    arrive: dict[tuple[str, int, int], float] = {}  # (kind, stage, mb) -> input ready
    link_free = {(b, d): 0.0 for b in range(p - 1) for d in ("fwd", "bwd")}
    clock = [0.0] * p
    pos = [0] * p
    while any(pos[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, i = orders[s][pos[s]]
                need = None
                if kind == "F" and s > 0:
                    need = arrive.get(("F", s, i))
                elif kind == "B" and s < p - 1:
                    need = arrive.get(("B", s, i))
                if (kind == "F" and s > 0 or kind == "B" and s < p - 1) and need is None:
                    break
                start = max(clock[s], need or 0.0)
                clock[s] = start + (f_s if kind == "F" else b_s)
                if kind == "F" and s < p - 1:
                    key = (s, "fwd")
                    go = max(clock[s], link_free[key])
                    link_free[key] = go + sends[s]
                    arrive[("F", s + 1, i)] = go + sends[s]
                elif kind == "B" and s > 0:
                    key = (s - 1, "bwd")
                    go = max(clock[s], link_free[key])
                    link_free[key] = go + sends[s - 1]
                    arrive[("B", s - 1, i)] = go + sends[s - 1]
                pos[s] += 1
                progressed = True
        if not progressed:
            raise AdviseError(f"pipeline schedule {schedule} deadlocked (p={p}, m={m})")
    return max(clock)
