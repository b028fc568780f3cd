"""Backend selection by flag: gloo | nccl | nanoccl | nanoccl+<codec>[+qwz|+qwz4].

``nanoccl+int8`` means the nanoccl backend with ``nanoccl.Options(compression="int8")`` and, per
strategy (trainers/strategies.py), the gradients compressed with that codec whatever their
size: DDP through nanoccl.hooks' error-feedback hook, FSDP2 (zero2, zero3) through
nanoccl.hooks.compress_fsdp's reduce-scatter, HSDP through its replicate group. ``+qwz`` adds
ZeRO++'s quantized weights to FSDP2 (zero2, zero3): parameters all-gathered as int8 across
nodes (nanoccl.all_gather_compressed); ``+qwz4`` as int4 (half the bytes; 15 levels a block of
64 against int8's 255 a block of 256).
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]


class BackendUnavailable(RuntimeError):
    """The requested backend (or codec) cannot be used here."""


@dataclass(frozen=True)
class BackendSpec:
    text: str  # as given, e.g. "nanoccl+int8"
    name: str  # the torch.distributed backend name
    codec: str | None = None
    gather_codec: str | None = None  # +qwz / +qwz4: parameters all-gathered as int8 / int4

    @property
    def is_nanoccl(self) -> bool:
        return self.name == "nanoccl"


def parse_backend(text: str) -> BackendSpec:
    value = text.strip().lower()
    name, _, codec = value.partition("+")
    if name not in ("gloo", "nccl", "nanoccl"):
        raise ValueError(f"unknown backend {text!r}: gloo, nccl, nanoccl or nanoccl+<codec>")
    if codec and name != "nanoccl":
        raise ValueError(f"{text!r}: only nanoccl takes a codec (nanoccl+int8, ...)")
    if "+" in value and not codec:
        raise ValueError(f"{text!r}: give a codec after '+', e.g. nanoccl+int8")
    codec, _, extra = codec.partition("+")
    gather = {"": None, "qwz": "int8", "qwz4": "int4"}
    if extra not in gather or (extra and not codec):
        raise ValueError(f"{text!r}: after the codec only '+qwz' (int8 parameter all-gather "
                         "for zero2/zero3) or '+qwz4' (int4), e.g. nanoccl+int4+qwz")
    return BackendSpec(value, name, codec or None, gather[extra])


def import_nanoccl() -> Any:
    """The nanoccl package (installed, else the source tree's torch_ext/)."""
    try:
        import nanoccl
    except ImportError:
        sys.path.append(str(REPO / "torch_ext"))
        try:
            import nanoccl
        except Exception as exc:
            raise BackendUnavailable(f"import nanoccl failed: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise BackendUnavailable(f"import nanoccl failed: {type(exc).__name__}: {exc}") from exc
    if "nanoccl" not in dist.Backend.backend_list:
        raise BackendUnavailable("nanoccl imported but registered no 'nanoccl' backend")
    return nanoccl


def compression_setting(nanoccl: Any) -> str | None:
    """The name of nanoccl's codec setting, or None where it has none yet."""
    defaults = nanoccl.Options.defaults()
    for name in ("compression", "codec"):
        if name in defaults:
            return name
    return None


def pg_options(spec: BackendSpec, tuning: str | None = None) -> Any:
    """The pg_options for init_process_group (None for the stock backends, and for nanoccl
    with neither a codec nor a `tuning` mode: its defaults and NANOCCL_* settings apply)."""
    if not spec.is_nanoccl:
        return None
    nanoccl = import_nanoccl()
    if spec.codec is None and tuning is None:
        return None
    options: dict[str, str] = {}
    if tuning is not None:
        options["tuning"] = tuning
    if spec.codec is not None:
        setting = compression_setting(nanoccl)
        if setting is None:
            raise BackendUnavailable(
                f"backend {spec.text!r}: nanoccl has no compression option yet "
                "(nanoccl.Options.defaults() lists no 'compression'); codecs are not available")
        options[setting] = spec.codec
    try:
        return nanoccl.Options(**options)
    except ValueError as exc:
        raise BackendUnavailable(f"backend {spec.text!r}: {exc}") from exc


def check_available(spec: BackendSpec) -> None:
    """Raises BackendUnavailable unless `spec` can be initialised here (no group is made)."""
    if spec.name == "nccl":
        import torch

        if not (torch.cuda.is_available() and dist.is_nccl_available()):
            raise BackendUnavailable("backend 'nccl' needs CUDA GPUs and a torch built with NCCL")
    pg_options(spec)


def init(spec: BackendSpec, timeout_s: float, standalone: bool = False,
         tuning: str | None = None) -> None:
    """init_process_group under torchrun (env://); a one-rank group on a HashStore without
    it, or when `standalone`. `tuning`: nanoccl's link-profile mode (NANOCCL_TUNING) for
    the group, None for the settings' own."""
    options = pg_options(spec, tuning)
    timeout = datetime.timedelta(seconds=timeout_s)
    kwargs: dict[str, Any] = {"backend": spec.name, "timeout": timeout}
    if options is not None:
        kwargs["pg_options"] = options
    if not standalone and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(**kwargs)
    else:
        dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, **kwargs)
    # Groups made later without a timeout of their own (new_group(), the DeviceMesh FSDP2
    # builds for zero3-hpz's post-forward shards) take torch's default, 30 minutes: a dead
    # peer there would be reported that late. They take the run's instead.
    dist.distributed_c10d.default_pg_timeout = timeout


def nanoccl_stats(spec: BackendSpec, groups: Sequence[Any] = (None,)) -> dict[str, int] | None:
    """Bytes this rank moved through nanoccl so far (totals and per link class), summed over
    `groups` (None: the default group; each group counted once): a strategy on a DeviceMesh
    (hsdp) runs its collectives on the mesh's sub-groups, whose counts the default group's
    stats do not hold."""
    if not spec.is_nanoccl:
        return None
    try:
        nanoccl = import_nanoccl()
        default = dist.distributed_c10d._get_default_group()
        seen: set[str] = set()
        per_group = []
        for group in groups:
            group = default if group is None else group
            if group.group_name in seen:
                continue
            seen.add(group.group_name)
            try:
                per_group.append(nanoccl.stats(group))
            except ValueError:  # a group on another backend
                continue
    except Exception:  # the stats API is optional to the study
        return None
    counts: dict[str, int] = {}
    for stats in per_group:
        for key, value in _counts(stats).items():
            counts[key] = counts.get(key, 0) + value
    return counts if per_group else None


def _counts(stats: Any) -> dict[str, int]:
    per_link = stats.get("per_link", {})
    counts = {
        "sent": int(stats.get("bytes_sent", 0)),
        "received": int(stats.get("bytes_received", 0)),
        "inter_sent": int(per_link.get("inter-node", {}).get("bytes_sent", 0)),
        "inter_received": int(per_link.get("inter-node", {}).get("bytes_received", 0)),
        "intra_sent": int(per_link.get("intra-node", {}).get("bytes_sent", 0)),
        "calls": int(stats.get("calls", 0)),
    }
    # Bytes sent per op ("sent_allreduce", "sent_send/recv", ...): what nanoccl-advise's
    # traffic model of each strategy is checked against (tests/study/test_advise.py).
    for op, moved in stats.get("per_op", {}).items():
        counts[f"sent_{op}"] = int(moved.get("bytes_sent", 0))
    return counts
