"""nanoccl: a torch.distributed backend for nano-clusters.

``import nanoccl`` registers the backend ``"nanoccl"`` (devices cpu and cuda) with
torch.distributed; then::

    dist.init_process_group("nanoccl", timeout=timedelta(seconds=60))
    dist.init_process_group("cpu:nanoccl,cuda:nccl")          # per device
    dist.init_process_group("nanoccl", pg_options=nanoccl.Options(nsocks=4))
    sub = dist.new_group([0, 1], backend="nanoccl")
    nanoccl.stats()                                            # bytes moved, per link class
    pg = nanoccl.new_process_group(store, rank, size)          # a group of one's own (torchft)

Every nanoccl setting is an environment variable ``NANOCCL_<NAME>``; ``nanoccl.Options`` sets
the same names in lower case for one group, over the environment. The process group's timeout
is the deadline of every call.

torch is not a dependency of the package on purpose (pip must never pull a torch): the
extension is built against the torch already in the environment and works with that torch only.

Types (importable from here, typed for checkers; shown as fields, not as dict subclasses):

``ProcessGroupNanoccl``
    The c10d Backend behind a group (``get_backend(group)``): ``stats()``, ``link_profile()``
    and the compressed calls below; everything else is torch.distributed's Backend API.
``Stats`` (what ``stats()`` returns)
    rank, size, node, calls, bytes_sent, bytes_received: this rank's totals;
    per_peer: a list of ``PeerStats``; per_op, per_link ("intra-node", "inter-node"),
    per_transport ("tcp", "shm", ...) and per_rail ("eth0", ...): ``ByteCounts`` by name;
    per_algorithm: calls per plan the planner chose ("allreduce/ring");
    calls_with_kept_buffers: failed calls whose tensors stay alive until the group is
    destroyed (an abort could not end every transfer on them);
    modelled: ``ModelledCalls`` per "op/algorithm[/codec]" the cost model predicted.
``PeerStats``
    rank, node, link ("self", "intra-node", "inter-node"), bytes_sent, bytes_received,
    messages_sent, messages_received.
``ByteCounts``
    bytes_sent, bytes_received.
``ModelledCalls``
    calls, predicted_s, measured_s (seconds summed over the calls).
"""

from __future__ import annotations

import datetime
import os
from typing import Any, TypedDict, Union

import torch
import torch.distributed as dist

if not dist.is_available():  # pragma: no cover - torch builds without distributed
    raise ImportError("nanoccl needs torch.distributed, which this torch build lacks")

# libfabric as Debian builds it links the PSM providers' libinfinipath, whose constructor, run
# when the extension loads, catches SIGTERM, SIGSEGV, SIGBUS, SIGILL and SIGABRT to write a
# "<exe>.80s-<pid>,vm.btr" backtrace file into the working directory; its SIGTERM handler then
# crashed the process (signal 11 or 6 instead of 15: a worker torchrun stops, for instance),
# and Python's and torch's own handling of those signals was no longer theirs. Its own switch
# turns that off; it must be set before the library loads. A value set by the user stays.
os.environ.setdefault("IPATH_NO_BACKTRACE", "1")

from nanoccl import _C  # noqa: E402  (after torch: the extension links against it)

# What help(nanoccl) shows in full; the types (ByteCounts, ModelledCalls, PeerStats, Stats,
# ProcessGroupNanoccl) are described in the module docstring instead of as classes, which
# would list every inherited dict or Backend method.
__all__ = [
    "BACKEND_NAME",
    "all_gather_compressed",
    "allreduce_compressed",
    "Options",
    "get_backend",
    "link_profile",
    "new_process_group",
    "reduce_scatter_compressed",
    "stats",
]

__version__ = "0.1.0"

BACKEND_NAME = "nanoccl"
ProcessGroupNanoccl = _C.ProcessGroupNanoccl

SettingValue = Union[str, int, float, bool]

# The types the *_compressed calls below encode (anything else goes lossless in the hooks).
_COMPRESSIBLE = (torch.float32, torch.bfloat16, torch.float16)


def _normalize(name: str) -> str:
    name = name.strip()
    if name.upper().startswith("NANOCCL_"):
        name = name[len("NANOCCL_") :]
    return name.lower()


def _to_text(value: SettingValue) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


class Options:
    """Per-group nanoccl settings, passed as ``pg_options`` to init_process_group / new_group.

    The names are those of the ``NANOCCL_*`` environment variables in lower case
    (``nsocks`` is ``NANOCCL_NSOCKS``); values are checked at once, by the same code the
    backend applies them with, and a bad one raises ValueError. Settings not given keep the
    environment's value, else the default (``Options.defaults()``). The group's timeout is
    init_process_group's ``timeout``; ``timeout_ms`` only serves plain C++ users.

    ``compression`` ("none", "fp16", "bf16", "int8", "int4") compresses the inter-node leg of
    float32 SUM/AVG all_reduce and reduce_scatter of at least ``min_bytes`` bytes
    (``compression_min_bytes``, default 1 MiB); everything else stays lossless. Every rank
    ends with the same result. For error feedback use :mod:`nanoccl.hooks` or
    :func:`allreduce_compressed`.

    ``transport`` picks the transport between nodes from the transport table ("auto": tcp;
    "tcp"; "fabric" where built); ``intra_transport`` the one within a node ("auto": shared
    memory). An unknown name, or one this build left out, raises ValueError listing the choices.

    ``secret_file`` names a file only the job's user can read holding the job secret (see the
    docs/networking.md, "Security"): nothing secret then goes into the store. ``encrypt=True``
    encrypts every byte on TCP connections (AES-256-GCM, keys per connection). Both must be
    the same on every rank.
    """

    # torch's Backend.Options carry the group's timeout here, and DeviceMesh reads it from the
    # options a mesh dimension is given (init_device_mesh(backend_override=...): device_mesh.py
    # `pg_options._timeout`), which without it raised AttributeError. None: the timeout
    # new_group gives a group; set a datetime.timedelta to pick another.
    _timeout: datetime.timedelta | None = None

    def __init__(
        self,
        *,
        socket_ifname: str | None = None,
        tcp_engine: str | None = None,
        nsocks: int | None = None,
        stripe_min_bytes: int | None = None,
        algo: str | None = None,
        chunk_bytes: int | None = None,
        small_message_bytes: int | None = None,
        spin_us: int | None = None,
        connect_timeout_ms: int | None = None,
        node_id: str | None = None,
        transport: str | None = None,
        intra_transport: str | None = None,
        compression: str | None = None,
        min_bytes: int | None = None,
        compression_block: int | None = None,
        secret_file: str | None = None,
        encrypt: bool | None = None,
        **more: SettingValue,
    ) -> None:
        self._settings: dict[str, str] = {}
        named: dict[str, SettingValue | None] = {
            "socket_ifname": socket_ifname,
            "tcp_engine": tcp_engine,
            "nsocks": nsocks,
            "stripe_min_bytes": stripe_min_bytes,
            "algo": algo,
            "chunk_bytes": chunk_bytes,
            "small_message_bytes": small_message_bytes,
            "spin_us": spin_us,
            "connect_timeout_ms": connect_timeout_ms,
            "node_id": node_id,
            "transport": transport,
            "intra_transport": intra_transport,
            "compression": compression,
            "compression_min_bytes": min_bytes,
            "compression_block": compression_block,
            "secret_file": secret_file,
            "encrypt": encrypt,
        }
        for name, value in {**named, **more}.items():
            if value is not None:
                self.set(name, value)

    def set(self, name: str, value: SettingValue) -> Options:
        """Sets one setting (validated now); returns self."""
        text = _to_text(value)
        _C.check_setting(name, text)  # ValueError naming the setting and what it accepts
        self._settings[_normalize(name)] = text
        return self

    @property
    def settings(self) -> dict[str, str]:
        """The settings given to this object, as the backend receives them."""
        return dict(self._settings)

    @staticmethod
    def defaults() -> dict[str, str]:
        """Every setting and its default (the table in common/config.cc)."""
        return dict(_C.default_settings())

    def __getattr__(self, name: str) -> str:
        settings = self.__dict__.get("_settings", {})
        if name in settings:
            return settings[name]
        raise AttributeError(f"nanoccl.Options has no setting {name!r} set")

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={'(set)' if k == 'secret' else v!r}"
                          for k, v in self._settings.items())
        return f"nanoccl.Options({inner})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Options) and other._settings == self._settings

    __hash__ = None  # type: ignore[assignment]  # mutable


def _backend(store: dist.Store, rank: int, size: int, timeout: Any, group_id: str,
             global_ranks: list[int], options: Any, what: str) -> ProcessGroupNanoccl:
    if options is None:
        options = Options()
    elif not isinstance(options, Options):
        raise TypeError(f"{what}=nanoccl.Options(...), got {type(options)!r}")
    if isinstance(timeout, datetime.timedelta):
        timeout_ms = int(timeout.total_seconds() * 1000)
    else:
        timeout_ms = int(float(timeout) * 1000)
    return _C.create_backend(store, rank, size, max(1, timeout_ms), group_id, global_ranks,
                             options.settings)


def _create(dist_opts: Any, options: Any) -> ProcessGroupNanoccl:
    """torch's creator for the backend (Backend.register_backend(extended_api=True))."""
    return _backend(dist_opts.store, dist_opts.group_rank, dist_opts.group_size,
                    dist_opts.timeout, dist_opts.group_id or "",
                    [int(r) for r in dist_opts.global_ranks_in_group], options,
                    "the nanoccl backend takes pg_options")


def new_process_group(store: dist.Store, rank: int, world_size: int,
                      timeout: datetime.timedelta = datetime.timedelta(minutes=10),
                      options: Options | None = None) -> dist.ProcessGroup:
    """A process group of `world_size` ranks run by nanoccl (cpu and cuda), set up over `store`
    without init_process_group: for frameworks that build and rebuild their own groups, such
    as torchft (``ProcessGroupWrapper._create_pg``; examples/torchft_diloco.py). Every rank
    calls it with the same store (a fresh prefix per group). The group is not registered with
    torch.distributed: call its methods, or pass it where a framework takes a group.
    """
    backend = _backend(store, rank, world_size, timeout, "", list(range(world_size)), options,
                       "new_process_group takes options")
    pg = dist.ProcessGroup(store, rank, world_size)
    custom = dist.ProcessGroup.BackendType.CUSTOM
    pg._set_default_backend(custom)
    for device in ("cpu", "cuda"):
        pg._register_backend(torch.device(device), custom, backend)
    return pg


def _register() -> None:
    dist.Backend.register_backend(
        BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"]
    )


_register()


def get_backend(group: dist.ProcessGroup | None = None) -> ProcessGroupNanoccl:
    """The nanoccl backend object of `group` (default: the default group).

    Raises ValueError if `group` runs no nanoccl backend on any device.
    """
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("this rank is not a member of the group")
    for device_type in group._device_types:
        try:
            backend = group._get_backend(torch.device(device_type))
        except RuntimeError:
            continue
        if isinstance(backend, ProcessGroupNanoccl):
            return backend
    raise ValueError(f"group {group.group_name!r} has no nanoccl backend")


class ByteCounts(TypedDict):
    bytes_sent: int
    bytes_received: int


class PeerStats(TypedDict):
    rank: int
    node: str
    link: str  # "self", "intra-node" or "inter-node"
    bytes_sent: int
    bytes_received: int
    messages_sent: int
    messages_received: int


class ModelledCalls(TypedDict):
    calls: int
    predicted_s: float
    measured_s: float


class Stats(TypedDict):
    rank: int
    size: int
    node: str
    calls: int
    bytes_sent: int
    bytes_received: int
    per_peer: list[PeerStats]
    per_op: dict[str, ByteCounts]
    per_link: dict[str, ByteCounts]  # "intra-node", "inter-node"
    per_algorithm: dict[str, int]  # calls per algorithm the planner chose: "allreduce/ring"
    per_transport: dict[str, ByteCounts]  # "tcp", "shm": what each transport carried
    per_rail: dict[str, ByteCounts]  # "eth0", "eth1": what tcp carried over each interface
    # failed calls whose tensors are kept alive until the group is destroyed: aborting the
    # transports did not end every transfer on them (a stuck progress thread or provider)
    calls_with_kept_buffers: int
    # calls the cost model predicted (a link profile is in force, docs/tuning.md), per
    # "op/algorithm" or "op/algorithm/codec": calls, predicted_s and measured_s (summed)
    modelled: dict[str, ModelledCalls]


def stats(group: dist.ProcessGroup | None = None) -> Stats:
    """Payload bytes this rank moved in `group` since it was created.

    Totals, per peer (with the peer's node and link class), per op, per link class
    ("intra-node", "inter-node"), per transport ("tcp", "shm": collectives between ranks of
    one node go through shared memory unless NANOCCL_INTRA_TRANSPORT=tcp, point-to-point and
    inter-node traffic over TCP), per network interface TCP used ("eth0", "eth1": one a rail,
    docs/networking.md "Several NICs a node") and calls per algorithm. A rank's node is NANOCCL_NODE_ID
    (or Options(node_id=...)) if set, else torchrun's GROUP_RANK, else its host name and
    network namespace; ranks with the same node id are one node. Local: no communication.
    """
    result: Stats = get_backend(group).stats()
    return result


def link_profile(group: dist.ProcessGroup | None = None) -> dict[str, Any] | None:
    """The link profile `group` agreed on when it was created (docs/tuning.md).

    None under NANOCCL_TUNING=off (the default; NANOCCL_COMPRESSION=auto turns it into
    cached) and on a one-rank group. Otherwise a dict:
    shape ("2x2": nodes x ranks per node), transport, nsocks, measured (UTC time), "inter" and
    "intra" (alpha_us: one-way latency of a small message; pair_MBps: one rank pair;
    node_MBps: every local rank of a node at once; one_socket_MBps: the same over one
    connection a peer, or None where not measured; None where the topology has no such link),
    reduce_MBps (float32 sum, one core), cpu_share (the share of a core each rank counts on:
    the host's cores over its ranks, at most 1), codecs ({name: encode/decode/accumulate_MBps}, per
    byte of float32 input) and text (the profile file's text). Rates are in 10^6 bytes/s.
    Every rank of the group holds rank 0's profile. Local: no communication.
    """
    result: dict[str, Any] | None = get_backend(group).link_profile()
    return result


def _finish(work: dist.Work, async_op: bool) -> dist.Work | None:
    """The work itself when `async_op`, else waited on (its error raised here)."""
    if async_op:
        return work
    work.wait()
    return None


def allreduce_compressed(
    tensor: torch.Tensor,
    residual: torch.Tensor | None = None,
    *,
    codec: str = "int8",
    block_size: int = 0,
    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
) -> dist.Work | None:
    """all_reduce of a float32, float16 or bfloat16 `tensor` in place with its inter-node leg
    compressed by `codec`.

    Like ``dist.all_reduce`` (SUM or AVG), whatever the group's ``compression`` setting and
    the tensor's size; every rank ends with the same bits. float16/bfloat16 tensors are reduced
    in float32 and rounded back once. `residual` is this rank's error feedback: a float32
    tensor (whatever the tensor's dtype) shaped like `tensor`, zeros at first, that the caller keeps
    and passes again with the next call of the same shape (what this rank's encodings lose is
    added back next time); for a CUDA tensor the residual is a CPU tensor (host memory, pinned
    for speed: nanoccl encodes a host copy of what crosses nodes). ``block_size`` is int8/int4's
    elements per scale (0: the group's
    ``compression_block``, else 256 for int8 and 64 for int4). A group on one node runs it
    lossless and leaves the residual alone. Every rank must pass the same codec and block size.
    """
    if residual is not None:
        if residual.shape != tensor.shape:
            raise ValueError(
                f"residual shape {tuple(residual.shape)} differs from the tensor's "
                f"{tuple(tensor.shape)}"
            )
        if not residual.is_contiguous():
            raise ValueError("the residual must be contiguous (it is updated in place)")
    work = get_backend(group).allreduce_compressed(
        tensor, residual, codec, int(block_size), dist.ReduceOp(op)
    )
    return _finish(work, async_op)


def reduce_scatter_compressed(
    output: torch.Tensor,
    input: torch.Tensor,
    residual: torch.Tensor | None = None,
    *,
    codec: str = "int8",
    block_size: int = 0,
    op: dist.ReduceOp | dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
) -> dist.Work | None:
    """``dist.reduce_scatter_tensor`` of float32, float16 or bfloat16 with its inter-node leg
    compressed by `codec`, whatever the group's ``compression`` setting and the size.

    `input` holds group-size x ``output.numel()`` elements; SUM, AVG or PREMUL_SUM (what FSDP2
    sends). float16/bfloat16 cross nodes in float32 and are rounded back once. Lossless inside
    a node and on a group within one node (the residual then untouched).

    `residual` is this rank's error feedback: a float32 tensor with as many elements as
    `input`, zeros at first, passed again with every call of this size on this group. It is
    laid out as the algorithm encodes (each rank encodes its node's partial sums of the parts
    it carries across nodes), not as `input`: keep it, save it, restore it; do not index it.
    """
    if residual is not None and not residual.is_contiguous():
        raise ValueError("the residual must be contiguous (it is updated in place)")
    rop = op if isinstance(op, dist.ReduceOp) else dist.ReduceOp(op)  # PREMUL_SUM(f) is one
    work = get_backend(group).reduce_scatter_compressed(output, input, residual, codec,
                                                        int(block_size), rop)
    return _finish(work, async_op)


def all_gather_compressed(
    output: torch.Tensor,
    input: torch.Tensor,
    *,
    codec: str = "int8",
    block_size: int = 0,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
) -> dist.Work | None:
    """``dist.all_gather_into_tensor`` of float32, float16 or bfloat16 values quantized by
    `codec` (ZeRO++'s qwZ: parameters gathered as int8 across nodes; the shard each rank keeps
    is untouched).

    Each rank encodes its `input` once; the encoded bytes are gathered and every rank, the
    owner too, decodes every part into `output`, so all ranks hold the same bits, each part
    within the codec's bound of its owner's input. A group within one node (or codec "none")
    gathers losslessly. Only for values that tolerate the codec's error: weights for a forward
    pass, not optimizer state or indices.
    """
    work = get_backend(group).allgather_compressed(output, input, codec, int(block_size))
    return _finish(work, async_op)


def __getattr__(name: str) -> Any:
    """``nanoccl.diloco`` (DiLoCo across nodes) without an import at the package's load: the
    module imports the package, which therefore does not import it back (no import cycle)."""
    if name == "diloco":
        import importlib

        return importlib.import_module("nanoccl.diloco")
    raise AttributeError(f"module 'nanoccl' has no attribute {name!r}")
