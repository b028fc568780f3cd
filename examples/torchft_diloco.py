"""torchft's DiLoCo over nanoccl: two replica groups average their outer gradients with nanoccl.

    python examples/torchft_diloco.py [--steps 40] [--sync-every 10] [--fragments 2]

torchft (pip install torchft) runs fault-tolerant DiLoCo over process groups it builds and
rebuilds itself at every quorum (``ProcessGroupWrapper._create_pg``); ``ProcessGroupNanoccl``
below makes those groups nanoccl groups (``nanoccl.new_process_group``), so the outer gradients
cross the replica groups' link through nanoccl. The run starts torchft's lighthouse and two
replica groups of one process each on this machine (loopback), trains a small regression model
with AdamW inside and Nesterov SGD outside (streaming, with --fragments > 1), and checks that
after the last synchronisation both replicas hold the same parameters and that nanoccl carried
the allreduces. Prints one line per replica and "torchft_diloco: OK" (exit 0), or says what
failed (exit 1).

nanoccl's own DiLoCo (``nanoccl.diloco``) adds what torchft's leaves out on such clusters: DP
inside a node, int4/int8 outer gradients with error feedback on the slow link only, and the
cost model's advice; torchft's brings replica groups that may fail and rejoin.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import nanoccl

TIMEOUT = datetime.timedelta(seconds=30)


def make_pg_class() -> type:
    from torchft.process_group import ProcessGroupWrapper

    class ProcessGroupNanoccl(ProcessGroupWrapper):
        """A torchft process group whose groups are nanoccl's."""

        def _create_pg(self, store: dist.Store, rank: int, world_size: int) -> dist.ProcessGroup:
            return nanoccl.new_process_group(store, rank, world_size, self._timeout)

        def getBackendName(self) -> str:
            return "torchft-nanoccl"

    return ProcessGroupNanoccl


def replica(replica_id: int, lighthouse: str, a: argparse.Namespace, out: mp.Queue) -> None:
    from torchft.local_sgd import DiLoCo
    from torchft.manager import Manager

    torch.manual_seed(0)  # the same initial model in both replicas
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(a.fragments)])
    fragments = list(model)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    outer = [torch.optim.SGD(f.parameters(), lr=0.7, momentum=0.9, nesterov=True)
             for f in fragments]
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False, timeout=TIMEOUT)
    pg = make_pg_class()(timeout=TIMEOUT)
    manager = Manager(
        pg=pg, min_replica_size=2, use_async_quorum=False,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]),
                                    inner.load_state_dict(sd["inner"])),
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
        replica_id=f"replica{replica_id}", store_addr="127.0.0.1", store_port=store.port,
        rank=0, world_size=1, lighthouse_addr=lighthouse, port=0,
        timeout=TIMEOUT, quorum_timeout=TIMEOUT, connect_timeout=TIMEOUT)
    # Each replica its own data: a noisy linear map, the same one in both.
    g = torch.Generator().manual_seed(100 + replica_id)
    target = torch.randn(16, 16, generator=torch.Generator().manual_seed(7))
    losses = []
    try:
        with DiLoCo(manager, fragments, inner, outer, sync_every=a.sync_every,
                    fragment_sync_delay=1 if a.fragments > 1 else 0):
            for _ in range(a.steps):
                x = torch.randn(64, 16, generator=g)
                loss = nn.functional.mse_loss(model(x), x @ target)
                inner.zero_grad()
                loss.backward()
                inner.step()
                losses.append(loss.item())
        backend = pg._pg._get_backend(torch.device("cpu"))
        out.put((replica_id, manager.current_step(), losses[0], losses[-1],
                 backend.stats()["calls"], pg.getBackendName(),
                 torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()))
    finally:
        manager.shutdown(wait=False)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40, help="inner steps per replica")
    p.add_argument("--sync-every", type=int, default=10, help="H: inner steps per outer step")
    p.add_argument("--fragments", type=int, default=2, help="streaming fragments (1: plain)")
    a = p.parse_args()
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's quorum log: lines per step
    try:
        from torchft._torchft import LighthouseServer
    except ImportError:
        print("torchft_diloco: torchft is not installed (pip install torchft)", file=sys.stderr)
        return 2
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=replica, args=(r, lighthouse.address(), a, out))
             for r in range(2)]
    for proc in procs:
        proc.start()
    results = {}
    try:
        for _ in procs:
            rid, *rest = out.get(timeout=120)
            results[rid] = rest
    except Exception as e:  # a replica died or hung: say so, exit 1
        print(f"torchft_diloco: FAILED: {len(results)} of 2 replicas reported ({e!r})")
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    lighthouse.shutdown()
    if len(results) != 2:
        return 1
    problems = []
    for rid, (steps, first, last, calls, name, _) in sorted(results.items()):
        print(f"replica {rid}: {steps} outer steps over {name}, loss {first:.3f} -> {last:.3f}, "
              f"{calls} nanoccl allreduces")
        if calls == 0:
            problems.append(f"replica {rid}: nanoccl carried no call")
        if not last < first:
            problems.append(f"replica {rid}: the loss did not fall")
    diff = (torch.tensor(results[0][-1]) - torch.tensor(results[1][-1])).abs().max().item()
    print(f"largest parameter difference between the replicas: {diff:.2e}")
    if diff > 1e-6 and a.steps % a.sync_every == 0 and a.fragments == 1:
        problems.append("the replicas disagree after the last synchronisation")
    for problem in problems:
        print(f"torchft_diloco: FAILED: {problem}")
    if not problems:
        print("torchft_diloco: OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
