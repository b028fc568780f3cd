"""nanoccl-tune and nanoccl.link_profile() (docs/tuning.md): ranks as processes on loopback,
two emulated nodes (NANOCCL_NODE_ID per rank)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from job_runner import free_port

TUNE = [sys.executable, "-m", "nanoccl.tune"]


def run_ranks(argv: list[str], node_ids: list[str], timeout: float = 120.0,
              env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess[str]]:
    """argv on len(node_ids) rank processes (env:// rendezvous); rank r on node node_ids[r]."""
    port = free_port()
    procs = []
    for rank, node in enumerate(node_ids):
        rank_env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                        RANK=str(rank), WORLD_SIZE=str(len(node_ids)), NANOCCL_NODE_ID=node,
                        NANOCCL_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                        **(env or {}))
        procs.append(subprocess.Popen(argv, env=rank_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out.append(subprocess.CompletedProcess(argv, p.returncode, stdout, stderr))
    return out


@pytest.mark.timeout(180)
def test_nanoccl_tune_measures_saves_and_shows(tmp_path: Path) -> None:
    path = tmp_path / "profile.txt"
    results = run_ranks([*TUNE, "--file", str(path)], ["a", "a", "b", "b"])
    for r in results:
        assert r.returncode == 0, r.stdout + r.stderr
    table = results[0].stdout
    assert "# link profile: 2x2 (nodes x ranks per node) over tcp" in table, table
    assert f"# saved to {path} by rank 0" in table
    for row in ("inter-node", "intra-node", "float32 reduce", "int8", "bf16"):
        assert row in table, table
    assert results[1].stdout == ""  # only rank 0 prints
    text = path.read_text()
    assert "shape 2x2" in text and "inter alpha_us" in text and "intra alpha_us" in text

    shown = subprocess.run([*TUNE, "--show", "--file", str(path)], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    # The same table, read back from the file.
    assert shown.stdout.splitlines()[:-1] == table.splitlines()[:-1]
    assert shown.stdout.splitlines()[-1] == f"# from {path}"

    # A group with NANOCCL_TUNING=cached takes that file as it is: no new measurement.
    probe = ("import datetime, torch.distributed as dist, nanoccl\n"
             "dist.init_process_group('nanoccl', timeout=datetime.timedelta(seconds=60))\n"
             "p = nanoccl.link_profile()\n"
             "print('PROFILE', p['measured'], p['shape'], p['inter']['alpha_us'] > 0)\n"
             "dist.destroy_process_group()\n")
    measured = [ln for ln in text.splitlines() if ln.startswith("measured ")][0].split()[1]
    cached = run_ranks([sys.executable, "-c", probe], ["a", "a", "b", "b"],
                       env={"NANOCCL_TUNING": "cached", "NANOCCL_TUNING_FILE": str(path)})
    for r in cached:
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"PROFILE {measured} 2x2 True" in r.stdout, r.stdout


@pytest.mark.timeout(60)
def test_show_says_what_is_wrong_with_the_file(tmp_path: Path) -> None:
    missing = subprocess.run([*TUNE, "--show", "--file", str(tmp_path / "none.txt")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1
    assert "no link profile at" in missing.stderr and "torchrun" in missing.stderr

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"version 1\nshape 2x2\n\x00\xffgarbage 3\n")
    broken = subprocess.run([*TUNE, "--show", "--file", str(bad)], capture_output=True,
                            text=True, timeout=60)
    assert broken.returncode == 1
    assert f"{bad}:3: unknown record" in broken.stderr, broken.stderr


@pytest.mark.timeout(60)
def test_tune_needs_several_ranks(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run([*TUNE, "--file", str(tmp_path / "p.txt")], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 2
    assert "run it with at least 2 ranks" in r.stderr
    assert not (tmp_path / "p.txt").exists()


SLOW_PROFILE = """version 1
shape 2x2
transport tcp
nsocks 2
measured 2026-11-24T00:00:00Z
inter alpha_us 60 pair_MBps 117 node_MBps 118
intra alpha_us 8 pair_MBps 4000 node_MBps 4000
reduce_MBps 8000
cpu_share 1
codec fp16 encode_MBps 6000 decode_MBps 6000 accumulate_MBps 5000
codec bf16 encode_MBps 6000 decode_MBps 6000 accumulate_MBps 5000
codec int8 encode_MBps 3000 decode_MBps 4000 accumulate_MBps 3500
codec int4 encode_MBps 2000 decode_MBps 3000 accumulate_MBps 2500
"""

BUCKETS = """
import datetime, json, torch, torch.distributed as dist, nanoccl
from nanoccl import hooks
from nanoccl.tune import ddp_bucket_cap_mb
dist.init_process_group('nanoccl', timeout=datetime.timedelta(seconds=60))
pg = nanoccl.get_backend()
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(12)])  # 48.05 MiB
plain = dist.new_group(backend='nanoccl',
                       pg_options=nanoccl.Options(compression='none', tuning='off'))
out = {
    'auto': list(pg.predict_allreduce(64 << 20, torch.float32)),
    'small': list(pg.predict_allreduce(1, torch.float32)),
    'bf16': list(pg.predict_allreduce(32 << 20, torch.bfloat16)),
    'comm_bound': ddp_bucket_cap_mb(model),
    'compute_bound': ddp_bucket_cap_mb(model, backward_seconds=30.0),
    'no_profile': nanoccl.get_backend(plain).predict_allreduce(1 << 20, torch.float32)[2],
    'fuse': hooks.auto_fuse_bytes(),
    'fuse_plain': hooks.auto_fuse_bytes(plain),
}
try:
    ddp_bucket_cap_mb(model, group=plain)
    out['refused'] = ''
except RuntimeError as exc:
    out['refused'] = str(exc)
print('RESULT', json.dumps(out))
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_predictions_and_the_ddp_bucket_follow_the_profile(tmp_path: Path) -> None:
    import json
    import math
    path = tmp_path / "slow.txt"
    path.write_text(SLOW_PROFILE)
    results = run_ranks([sys.executable, "-c", BUCKETS], ["a", "a", "b", "b"],
                        env={"NANOCCL_COMPRESSION": "auto", "NANOCCL_TUNING_FILE": str(path)})
    outs = []
    for r in results:
        assert r.returncode == 0, r.stdout + r.stderr
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][0]
        outs.append(json.loads(line[len("RESULT "):]))
    assert all(o == outs[0] for o in outs), outs  # every rank, the same answers
    o = outs[0]
    assert o["auto"][:2] == ["hierarchical", "int8"] and o["auto"][2] > 0
    assert o["auto"][3] in (256 << 10, 1 << 20, 4 << 20)  # the compressed exchange's chunk
    assert o["small"][:2] == ["recursive_doubling", "none"] and o["small"][3] == 0
    assert o["bf16"][1] == "int8"
    # Communication-bound: the fewest buckets, so the smallest candidate that holds all
    # 48.05 MiB of gradients; compute-bound (30 s of backward): the smallest candidate, whose
    # allreduce ends soonest after backward.
    assert o["comm_bound"] == 50
    assert o["compute_bound"] == 1
    assert math.isinf(o["no_profile"])
    # Fusion threshold from the profile: a size where a call's fixed cost is at most a tenth.
    assert o["fuse"] in [1 << k for k in range(14, 27)] and o["fuse_plain"] == 0
    assert "needs a link profile" in o["refused"]


# Two nodes of one rank, codecs far slower than the link: the owner's turn is long, so the
# model cuts each segment in small chunks (the flat compressed row: one round, no blocks).
SLOW_CODEC_PROFILE = """version 1
shape 2x1
transport tcp
nsocks 2
measured 2026-11-24T00:00:00Z
inter alpha_us 60 pair_MBps 117 node_MBps 117
intra none
reduce_MBps 8000
cpu_share 1
codec int8 encode_MBps 300 decode_MBps 300 accumulate_MBps 300
"""

CHUNKED = """
import datetime, json, torch, torch.distributed as dist, nanoccl
dist.init_process_group('nanoccl', timeout=datetime.timedelta(seconds=60))
x = torch.arange(1 << 20, dtype=torch.float32).sin()  # 4 MB
out = {'chunk': nanoccl.get_backend().predict_allreduce(x.numel(), torch.float32)[3]}
for chunk in (None, 262144, 1048576):
    g = None if chunk is None else dist.new_group(
        backend='nanoccl', pg_options=nanoccl.Options(chunk_bytes=chunk))
    y = x.clone()
    before = nanoccl.stats(g)['bytes_sent']
    dist.all_reduce(y, group=g)
    out[str(chunk)] = [nanoccl.stats(g)['bytes_sent'] - before, float((y - 2 * x).abs().max())]
print('RESULT', json.dumps(out))
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_the_planned_chunk_is_the_one_the_exchange_runs(tmp_path: Path) -> None:
    """The chunk the model picks reaches compressed.cc: the planned group sends what a group
    forced to that chunk sends (every chunk is a stream with a header of its own, so other
    chunks send other byte counts), with a correct result."""
    import json
    path = tmp_path / "slow_codec.txt"
    path.write_text(SLOW_CODEC_PROFILE)
    results = run_ranks([sys.executable, "-c", CHUNKED], ["a", "b"],
                        env={"NANOCCL_COMPRESSION": "int8", "NANOCCL_TUNING": "cached",
                             "NANOCCL_TUNING_FILE": str(path)})
    for r in results:
        assert r.returncode == 0, r.stdout + r.stderr
    o = json.loads([ln for ln in results[0].stdout.splitlines()
                    if ln.startswith("RESULT ")][0][len("RESULT "):])
    assert o["chunk"] == 262144, o
    assert o["None"][0] == o["262144"][0] != o["1048576"][0], o
    for key in ("None", "262144", "1048576"):
        assert o[key][1] < 0.05, o  # int8 of sums in [-2, 2]: within ~2/127 per element


@pytest.mark.parametrize("layout", ["one dtype", "two dtypes", "large layers"])
def test_ddp_bucket_sizes_are_ddps_own(layout: str) -> None:
    """ddp_bucket_sizes builds the buckets the reducer builds (one open bucket per dtype, a
    first-bucket cap), compared with torch's own assignment function."""
    import random

    import torch
    import torch.distributed as dist
    from nanoccl.tune import ddp_bucket_sizes

    rng = random.Random(layout)
    dtypes = [torch.float32] + ([torch.bfloat16] if layout == "two dtypes" else [])
    scale = 4 << 20 if layout == "large layers" else 300_000
    tensors = [torch.empty(rng.randint(1, scale), dtype=rng.choice(dtypes)) for _ in range(40)]
    grads = [(t.numel() * t.element_size(), t.dtype) for t in tensors]
    for cap_mb in (0.5, 1, 5, 25):
        cap = int(cap_mb * (1 << 20))
        for first in (dist._DEFAULT_FIRST_BUCKET_BYTES, cap):
            mine = ddp_bucket_sizes(grads, cap, first)
            order = list(reversed(range(len(tensors))))
            buckets, _ = dist._compute_bucket_assignment_by_size(
                [tensors[i] for i in order], [first, cap], [False] * len(tensors), order)
            theirs = [(sum(grads[i][0] for i in b), tensors[b[0]].dtype) for b in buckets]
            assert sorted(((n, d) for n, d, _ in mine), key=str) == sorted(theirs, key=str)
            assert sum(n for n, _, _ in mine) == sum(n for n, _ in grads)
            ready = [r for _, _, r in mine]
            assert ready == sorted(ready) and ready[-1] == sum(n for n, _ in grads)


@pytest.mark.parametrize("cap_mb", [None, 0.5, 2, 25])
def test_ddp_bucket_sizes_match_a_real_ddp(cap_mb: float | None) -> None:
    """The buckets a DDP module really hands its comm hook after its rebuild, in order: with
    bucket_cap_mb left at its default the first bucket is capped at 1 MiB, with an explicit
    cap it is not (torch's BucketCapacityConfig)."""
    import torch
    import torch.distributed as dist
    from nanoccl.tune import ddp_bucket_sizes
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(384, 384) for _ in range(12)])
        kwargs = {} if cap_mb is None else {"bucket_cap_mb": cap_mb}
        ddp = DistributedDataParallel(model, **kwargs)
        seen: list[list[int]] = []

        def record(_, bucket):  # type: ignore[no-untyped-def]  # (DDP checks real annotations)
            seen[-1].append(bucket.buffer().numel() * bucket.buffer().element_size())
            fut: torch.futures.Future = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        ddp.register_comm_hook(None, record)
        for _ in range(3):  # DDP rebuilds its buckets after the first step
            seen.append([])
            ddp(torch.randn(4, 384)).sum().backward()
        grads = [(p.numel() * p.element_size(), p.dtype) for p in model.parameters()]
        cap = int((25 if cap_mb is None else cap_mb) * (1 << 20))
        first = dist._DEFAULT_FIRST_BUCKET_BYTES if cap_mb is None else cap
        assert seen[-1] == [n for n, _, _ in ddp_bucket_sizes(grads, cap, first)]
    finally:
        dist.destroy_process_group()


def test_ddp_step_time_follows_the_buckets() -> None:
    from nanoccl.tune import ddp_step_seconds

    # No backward time: the allreduces back to back.
    assert ddp_step_seconds([1.0, 2.0], [10, 40], 40, 0.0) == pytest.approx(3.0)
    # Bucket 0 ready at 1 s (a quarter of 4 s), bucket 1 at 4 s: the first one's second of
    # communication hides under backward, the last one's follows it.
    assert ddp_step_seconds([1.0, 2.0], [10, 40], 40, 4.0) == pytest.approx(6.0)
    # Communication longer than backward: the queue, not backward, decides.
    assert ddp_step_seconds([5.0, 5.0], [10, 20], 20, 2.0) == pytest.approx(11.0)


def test_measure_backward_seconds_leaves_the_model_as_it_was() -> None:
    import torch
    from nanoccl.tune import measure_backward_seconds

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64),
                                torch.nn.Dropout(0.5), torch.nn.Linear(64, 1))
    x = torch.randn(32, 64)
    stats = [b.clone() for b in model.buffers()]
    rng = torch.random.get_rng_state()
    seconds = measure_backward_seconds(model, lambda: model(x).square().mean(), repeats=2)
    assert 0 < seconds < 60
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(stats, model.buffers()))  # BatchNorm's stats
    assert torch.equal(rng, torch.random.get_rng_state())  # dropout drew from a fork
    with pytest.raises(ValueError, match="repeats"):
        measure_backward_seconds(model, lambda: model(x).sum(), repeats=0)
