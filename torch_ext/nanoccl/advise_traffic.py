"""What the reference trainers send in one step, and what a model is to the advisor.

nanoccl-advise's traffic model (torch_ext/nanoccl/advise.py prices it): per strategy, the
calls one training step makes, as nanoccl.stats() counts them while the trainers
(trainers/strategies.py) run, and the bytes each call puts on each link class for the
algorithm nanoccl runs it with. tests/study/test_advise.py checks it against the bytes nanoccl
counts per op; results/advise/ against the study's runs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

from nanoccl.advise_models import (GPT_SHAPES, MODEL_NAMES, GPTShape, gpt_activation_bytes,
                                   gpt_parameters, resnet18_activation_bytes,
                                   resnet18_parameters, split_layers)
from nanoccl.tune import ddp_bucket_sizes


class AdviseError(ValueError):
    """The inputs cannot be advised on (a bad model spec, cluster, profile or time)."""


# ----------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class Stack:
    """How a training stack moves activations, where stacks differ: tensor parallelism's
    allreduces and the pipeline's sends. The default is the reference trainers' (fp32,
    trainers/strategies.py)."""

    name: str = "reference trainers"
    activation_bytes: int = 4  # an activation element on the wire: 4 fp32, 2 fp16/bf16
    # DTensor TP with q, k, v apart: the 2 row-wise projections' allreduces in forward, the 4
    # column-wise layers' input gradients in backward. Megatron-style fused qkv: 2 + 2.
    tp_allreduces_per_block: int = 6
    # GPT-2's token embedding and output head are one weight. A pipeline that keeps it tied
    # holds it on the first and the last stage and allreduces its gradient between the two
    # after the last backward (Megatron's embedding group, ColossalAI's shared parameters), in
    # fp32. The reference trainers untie it for the pipeline (trainers/strategies.py).
    pp_tied_embedding: bool = False


REFERENCE_STACK = Stack()
# The published nano-cluster study's TP runs (ColossalAI's HybridParallelPlugin, its default
# precision fp16, Megatron-style layers on Hugging Face's GPT-2 small): the network volume it
# reports per token matches this, not the reference trainers' traffic. A node's NIC counted
# both ways, as its DP rows show (2x1: 1.63 Gbit/s at 6.7k tokens/s is 30.4 KB a token; fp32
# gradients of 124.4 M parameters sent and received per 32768-token step, 30.3 KB); TP 2x1:
# 1.81 Gbit/s at 1.46k tokens/s, 155 KB a token; 4 fp16 allreduces of 768 a block over 12
# blocks, sent and received, 147 KB. PP: 2x1 1.39 Gbit/s at 7.94k tokens/s is 21.9 KB a token
# (2x2: 1.53 at 8.87k, 21.6 KB); the hidden states at the node boundary in fp16, 768 x 2 bytes
# each way, are 3.1 KB of it, and the tied embedding's gradient (50257 x 768, fp32) allreduced
# between the first and the last stage per 16 x 1024-token step is the other 18.8 KB (21.9 KB
# in all; fp16 gradients at batch 8 would give the same bytes a token).
# bench/advise_study.py compares the scaling factors.
STUDY_STACK = Stack("the published study's TP and PP (ColossalAI, fp16, fused qkv, tied "
                    "embedding)", activation_bytes=2, tp_allreduces_per_block=4,
                    pp_tied_embedding=True)


@dataclass
class ModelSpec:
    """What the traffic and memory models need of a model, in the trainers' terms."""

    name: str
    gpt: bool
    batch: int  # global batch (sequences or images)
    seq: int  # tokens a sequence (1 for images)
    params: int  # distinct parameters (tied weights once)
    grads: list[tuple[int, Any]]  # (bytes, dtype) per parameter, in the model's order
    units: list[int]  # FSDP2 units' parameters: the root's first, then each block's
    act_bytes_per_sample: float  # activations kept for backward, one sample
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    vocab: int = 0
    stage_params: Callable[[int], list[int]] | None = None  # PP: parameters per stage
    stack: Stack = REFERENCE_STACK

    def activation_count(self, elements: int) -> int:
        """float32 elements (what the predictor prices) as many bytes as `elements`
        activations take on the wire in this stack."""
        return -(-elements * self.stack.activation_bytes // 4)

    @property
    def per_sample(self) -> int:
        """Units of throughput a sample: tokens for GPT, 1 image."""
        return self.seq if self.gpt else 1


def model_spec(name: str, batch: int, seq: int | None = None, *,
               gpt_shape: GPTShape | None = None) -> ModelSpec:
    """A reference trainer's model (MODEL_NAMES, trainers/models.py), or a GPT of
    `gpt_shape`: its parameters and activations, from advise_models.py's shapes."""
    import torch

    if gpt_shape is None and name not in MODEL_NAMES:
        raise AdviseError(f"unknown model {name!r}: choose from {', '.join(MODEL_NAMES)} "
                          "or give it by hand (--params --layers --hidden)")
    if batch < 1:
        raise AdviseError(f"batch {batch}: must be >= 1")
    shape = gpt_shape or GPT_SHAPES.get(name)
    if shape is not None:
        seq = seq or shape.block_size
        if seq > shape.block_size or seq < 1:
            raise AdviseError(f"{name}: sequence length {seq} outside 1..{shape.block_size}")
        sizes, block_params = gpt_parameters(shape)
        act = gpt_activation_bytes(shape, seq)
    else:
        seq = 1
        sizes, block_params = resnet18_parameters()
        act = resnet18_activation_bytes()
    grads = [(4 * n, torch.float32) for n in sizes]
    params = sum(sizes)
    units = [params - sum(block_params)] + block_params
    spec = ModelSpec(name=name, gpt=shape is not None, batch=batch, seq=seq, params=params,
                     grads=grads, units=units, act_bytes_per_sample=act)
    if shape is not None:
        spec.layers, spec.hidden, spec.heads, spec.vocab = (
            shape.n_layer, shape.n_embd, shape.n_head, shape.vocab_size)
        embed = shape.vocab_size * shape.n_embd + shape.block_size * shape.n_embd
        head = 2 * shape.n_embd + shape.vocab_size * shape.n_embd  # untied for the pipeline
        per_block = block_params[0] if block_params else 0

        def stage_params(p: int) -> list[int]:
            return [len(r) * per_block + (embed if s == 0 else 0) + (head if s == p - 1 else 0)
                    for s, r in enumerate(split_layers(shape.n_layer, p))]

        spec.stage_params = stage_params
    return spec


def gpt_by_hand(params: int | None, layers: int, hidden: int, seq: int, batch: int,
                heads: int | None = None, vocab: int | None = None) -> ModelSpec:
    """A GPT-2-shaped model from its sizes; the vocabulary is what `params` leaves over."""
    if layers < 1 or hidden < 1 or seq < 1:
        raise AdviseError(f"layers {layers}, hidden {hidden}, seq {seq}: each must be >= 1")
    heads = heads or max(1, hidden // 64)
    if hidden % heads:
        raise AdviseError(f"hidden {hidden} does not split into {heads} heads")
    per_block = 12 * hidden * hidden + 13 * hidden
    fixed = layers * per_block + seq * hidden + 2 * hidden
    if vocab is None:
        if params is None:
            raise AdviseError("a model by hand needs --params or --vocab")
        vocab = (params - fixed) // hidden
        if vocab < 1:
            raise AdviseError(f"{params} parameters do not hold {layers} layers of hidden {hidden} "
                              f"(those alone take {fixed}): check --params/--layers/--hidden")
    shape = GPTShape(n_layer=layers, n_head=heads, n_embd=hidden, vocab_size=vocab,
                     block_size=seq)
    return model_spec(f"gpt({layers}x{hidden})", batch, seq, gpt_shape=shape)


@dataclass(frozen=True)
class Cluster:
    nodes: int
    per_node: int

    @property
    def world(self) -> int:
        return self.nodes * self.per_node

    def __str__(self) -> str:
        return f"{self.nodes}x{self.per_node}"


def parse_cluster(text: str) -> Cluster:
    parts = text.lower().split("x")
    try:
        nodes, per_node = (int(p) for p in parts)
    except ValueError:
        raise AdviseError(f"cluster {text!r}: give nodes x GPUs per node, e.g. 2x2") from None
    if nodes < 1 or per_node < 1 or nodes * per_node > 4096:
        raise AdviseError(f"cluster {text!r}: nodes and GPUs per node must be >= 1 (at most "
                          "4096 devices)")
    return Cluster(nodes, per_node)


@dataclass(frozen=True)
class Call:
    """One collective (or send) of a step: `count` float32 elements, as the trainer issues it."""

    op: str  # allreduce, reduce_scatter, allgather, broadcast, send
    count: int
    phase: str  # forward, backward, step
    # Compressed whatever its size: DDP's error-feedback hook, FSDP2's compress_fsdp, HSDP's
    # replicate group (the trainers' settings), not the group's compression_min_bytes.
    hook: bool = False
    # An allgather whose parts each owner encodes with this codec (nanoccl.all_gather_compressed,
    # the trainers' +qwz): the encoded bytes are gathered, inside nodes too. "" for none.
    quantized: str = ""
    root: int = 0  # broadcast: the owner's rank
    src: int = 0  # send: from this rank
    dst: int = 1  # send: to this rank
    # The process group it runs on: the whole world, one of HSDP's mesh groups: "shard" (a
    # node's ranks) or "replicate" (the ranks of the same local rank across nodes), or "ends"
    # (a pipeline's first and last stage: the first and the last rank).
    group: str = "world"


def tree_edges(n: int, root: int) -> list[tuple[int, int]]:
    """The binomial tree's edges (collectives/tree.cc): virtual rank v (v = rank - root mod n)
    gets the buffer from v less its lowest set bit."""
    return [(((v & (v - 1)) + root) % n, (v + root) % n) for v in range(1, n)]


def link_bytes(op: str, algorithm: str, nbytes: float, nodes: int, per_node: int,
               ratio: float = 1.0, root: int = 0) -> tuple[float, float]:
    """Bytes one call sends over all ranks, (intra-node, inter-node), by the algorithm nanoccl
    runs (collectives/*.cc); `nbytes` is the whole buffer (allreduce, broadcast), one rank's
    input (reduce_scatter) or the output (allgather); `ratio` shrinks the compressed inter
    leg. Even splits: the hierarchical rows' hand-over steps inside a node move nothing."""
    n, lr, nn = nodes * per_node, per_node, nodes
    if n < 2:
        return 0.0, 0.0
    node = [r // per_node for r in range(n)]

    def hops(pairs: list[tuple[int, int]]) -> tuple[float, float]:
        inter = sum(1 for a, b in pairs if node[a] != node[b])
        return (len(pairs) - inter) * nbytes, inter * nbytes

    if algorithm == "board":  # one node's shared memory: each rank's message read by the rest
        return (n - 1) * nbytes if op == "broadcast" else n * (n - 1) * nbytes, 0.0
    if op == "broadcast":
        if algorithm == "tree":
            return hops(tree_edges(n, root))
        if algorithm == "ring":  # a chain from the root through every rank
            return hops([((root + i) % n, (root + i + 1) % n) for i in range(n - 1)])
        if algorithm == "hierarchical":  # shards out, a chain of nodes a shard, node allgather
            return (lr - 1) / lr * nbytes + nn * (lr - 1) * nbytes, (nn - 1) * nbytes
    passes = {"allreduce": 2, "reduce_scatter": 1, "allgather": 1}.get(op)
    if passes is None or op == "allgather" and algorithm not in ("ring", "hierarchical"):
        raise AdviseError(f"no byte accounting for {op} over {algorithm}")
    if algorithm == "hierarchical":  # intra stage(s), each shard across nodes, codec there
        squeeze = ratio if op != "allgather" else 1.0
        return (n * passes * (lr - 1) / lr * nbytes,
                n * passes * (nn - 1) / nn * nbytes / lr * squeeze)
    if algorithm == "compressed":  # one rank a node: every segment to its owner, encoded
        return 0.0, n * passes * (n - 1) / n * nbytes * ratio
    if algorithm == "recursive_doubling":  # log2(n) exchanges of the whole buffer
        return hops([(0, 1 << d) for d in range(int(math.log2(n)))] * n)
    # A ring (or the tree row, priced like one) over node-ordered ranks: each rank sends
    # passes x (n - 1)/n of the buffer to its successor.
    per_rank = passes * (n - 1) / n * nbytes
    inter_edges = sum(1 for r in range(n) if node[r] != node[(r + 1) % n])
    return (n - inter_edges) * per_rank, inter_edges * per_rank


# ------------------------------------------------------------------- traffic per strategy
def ddp_buckets(spec: ModelSpec, cap_mb: float | None) -> list[tuple[Call, int]]:
    """DDP's gradient buckets (its own rule, nanoccl.tune.ddp_bucket_sizes) with the bytes of
    gradients backward has produced when each is ready. `cap_mb` None: DDP's default (25 MB,
    and 1 MiB for the first bucket, as DDP does only under its default)."""
    cap = int((25 if cap_mb is None else cap_mb) * (1 << 20))
    first = (1 << 20) if cap_mb is None else cap
    return [(Call("allreduce", max(1, nbytes // 4), "backward", hook=True), ready)
            for nbytes, _, ready in ddp_bucket_sizes(spec.grads, cap, first)]


def zero1_broadcasts(spec: ModelSpec, world: int) -> list[Call]:
    """ZeroRedundancyOptimizer after each step: every parameter broadcast by the rank that owns
    it; parameters go largest first to the rank holding the fewest (torch's partition)."""
    sizes = [0] * world
    calls_per_rank: list[list[Call]] = [[] for _ in range(world)]
    order = sorted(range(len(spec.grads)), key=lambda i: -spec.grads[i][0])
    for i in order:
        owner = min(range(world), key=lambda r: sizes[r])
        count = spec.grads[i][0] // 4
        sizes[owner] += count
        calls_per_rank[owner].append(Call("broadcast", count, "step", root=owner))
    return [c for rank_calls in calls_per_rank for c in rank_calls]


def fsdp_calls(spec: ModelSpec, stage: int, gather_codec: str = "", hpz: bool = False
               ) -> tuple[list[Call], list[Call], list[Call]]:
    """FSDP2 (fully_shard per block, then the root): forward allgathers, backward allgathers
    (ZeRO-3 only: parameters were resharded after forward) and backward reduce-scatters, which
    the trainers compress whatever their size (nanoccl.hooks.compress_fsdp: `hook`); with
    `gather_codec` (+qwz) the allgathers carry parameters encoded by it. `hpz` (zero3-hpz):
    resharded after forward over the node's ranks only, the backward's allgathers run within
    the node, of the decoded parameters (lossless there)."""
    forward = [Call("allgather", u, "forward", quantized=gather_codec) for u in spec.units]
    order = list(reversed(spec.units[1:])) + spec.units[:1]
    again = ([Call("allgather", u, "backward", group="shard") if hpz
              else Call("allgather", u, "backward", quantized=gather_codec) for u in order]
             if stage == 3 else [])
    reduce = [Call("reduce_scatter", u, "backward", hook=True) for u in order]
    return forward, again, reduce


def hsdp_calls(spec: ModelSpec, per_node: int) -> tuple[list[Call], list[Call], list[Call]]:
    """HSDP (FSDP2 over the mesh (nodes, ranks a node), reshard_after_forward=False): forward
    allgathers of each unit within a node, and in backward each unit's reduce-scatter within
    the node followed by the allreduce of the rank's shard (1 / per_node) across nodes, which
    the trainers' replicate group compresses whatever its size (min_bytes 0: `hook`)."""
    forward = [Call("allgather", u, "forward", group="shard") for u in spec.units]
    order = list(reversed(spec.units[1:])) + spec.units[:1]
    reduce = [Call("reduce_scatter", u, "backward", group="shard") for u in order]
    cross = [Call("allreduce", -(-u // per_node), "backward", group="replicate", hook=True)
             for u in order]
    return forward, reduce, cross


def diloco_calls(spec: ModelSpec, per_node: int, fragments: int
                 ) -> tuple[list[tuple[Call, int]], list[Call], list[Call]]:
    """DiLoCo (nanoccl.diloco, the trainers' diloco): DDP's buckets within the node every step
    (lossless; none with one rank a node), with the gradient bytes ready at each as
    ddp_buckets gives them, and for each fragment's outer step (fragments as
    nanoccl.diloco.split_fragments cuts the parameters) each local rank's slice of it across
    nodes (allreduce_compressed whatever its size: `hook`; the node's local ranks at once) and
    the node's allgather of the slices: one call a fragment in each list."""
    from nanoccl.diloco import split_fragments

    inner = ([(dataclasses.replace(c, group="shard"), ready)
              for c, ready in ddp_buckets(spec, None)] if per_node > 1 else [])
    sizes = [nbytes // 4 for nbytes, _ in spec.grads]
    frags = [sum(sizes[i] for i in idx) for idx in split_fragments(sizes, fragments)]
    cross = [Call("allreduce", -(-f // per_node), "step", group="replicate", hook=True)
             for f in frags]
    gather = [Call("allgather", f, "step", group="shard") for f in frags] if per_node > 1 else []
    return inner, cross, gather


def tp_calls(spec: ModelSpec) -> list[Call]:
    """DTensor TP per block: the row-wise attention and MLP projections' allreduce in forward,
    and in backward one allreduce of the input gradient of each column-wise layer (q, k, v,
    fc): 6 allreduces of the whole batch's activations a block (the stack's count)."""
    count = spec.activation_count(spec.batch * spec.seq * spec.hidden)
    forward, backward = Call("allreduce", count, "forward"), Call("allreduce", count, "backward")
    per_block = [forward] * 2 + [backward] * (spec.stack.tp_allreduces_per_block - 2)
    return per_block * spec.layers


def pp_tied_embedding_call(spec: ModelSpec) -> Call | None:
    """The tied embedding's gradient allreduce between the first and last stage (group
    "ends"), where the stack keeps GPT-2's embedding tied in its pipeline; else None."""
    if not (spec.stack.pp_tied_embedding and spec.gpt and spec.vocab and spec.hidden):
        return None
    return Call("allreduce", spec.vocab * spec.hidden, "step", group="ends")


def strategy_refusal(spec: ModelSpec, cluster: Cluster, strategy: str,
                     microbatches: int = 0) -> str | None:
    """Why the reference trainers cannot run `strategy` here (their StrategyError), or None."""
    n = cluster.world
    if n < 2:
        return "one device: no parallelism"
    if (strategy in ("dp", "zero1", "zero2", "zero3", "zero3-hpz", "hsdp", "diloco")
            and spec.batch % n):
        return f"global batch {spec.batch} does not split over {n} ranks"
    if strategy == "diloco" and cluster.nodes < 2:
        return "DiLoCo needs several nodes (on one node it is DP)"
    if strategy == "hsdp" and (cluster.nodes < 2 or cluster.per_node < 2):
        return ("HSDP needs several nodes of several ranks (on one node it is ZeRO-2, with one "
                "rank a node DP)")
    if strategy == "zero3-hpz" and (cluster.nodes < 2 or cluster.per_node < 2):
        return ("hpZ needs several nodes of several ranks (on one node it is ZeRO-3, with one "
                "rank a node ZeRO-2)")
    if strategy in ("tp", "pp") and not spec.gpt:
        return "implemented for the GPT models only"
    if strategy == "tp" and (spec.heads % n or (4 * spec.hidden) % n):
        return f"{spec.heads} heads do not split over {n} ranks"
    if strategy == "pp":
        if spec.layers < n:
            return f"{spec.layers} layers for {n} stages"
        if microbatches < 1 or spec.batch % microbatches:
            return f"global batch {spec.batch} does not split into {microbatches} microbatches"
    return None
