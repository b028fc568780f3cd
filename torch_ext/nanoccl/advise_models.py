"""The reference trainers' models as the advisor counts them: each parameter's size in the
order ``model.parameters()`` yields them, the parameters of each FSDP2 unit, the activations
backward keeps for one sample, and how the pipeline splits the blocks.

The reference trainers (trainers/models.py, trainers/strategies.py) are not part of the
package, and the package imports nothing from them: their shapes are written down here as
data and formulas, and tests/bench/test_advise_models.py checks every number against the
trainers' own modules, so that the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTShape:
    """trainers/models.py's GPTConfig: GPT-2 with q, k and v as three Linear layers, pre-LN
    blocks, the LM head tied to the token embedding."""

    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int = 50257
    block_size: int = 1024


GPT_SHAPES: dict[str, GPTShape] = {
    "gpt2-tiny": GPTShape(4, 4, 128, 512, 64),
    "gpt2-nano": GPTShape(2, 2, 64, 256, 32),
    "gpt2-mini": GPTShape(6, 8, 256, 2048, 128),
    "gpt2-small": GPTShape(12, 12, 768),
    "gpt2-medium": GPTShape(24, 16, 1024),
    "gpt2-large": GPTShape(36, 20, 1280),
    "gpt2-xl": GPTShape(48, 25, 1600),
}
MODEL_NAMES = sorted(GPT_SHAPES) + ["resnet18"]


def gpt_block_parameters(e: int) -> list[int]:
    """One block's parameters in order: ln_1, q, k, v, the attention's output projection,
    ln_2, the MLP's two layers (weights, then biases where they have one)."""
    linear = [e * e, e]
    return [e, e, *linear, *linear, *linear, *linear, e, e, 4 * e * e, 4 * e, 4 * e * e, e]


def gpt_parameters(shape: GPTShape) -> tuple[list[int], list[int]]:
    """(every parameter's elements in the model's order, each block's parameters): token and
    position embedding, the blocks, the final LayerNorm; the LM head is the token embedding."""
    e = shape.n_embd
    block = gpt_block_parameters(e)
    sizes = [shape.vocab_size * e, shape.block_size * e]
    for _ in range(shape.n_layer):
        sizes += block
    sizes += [e, e]
    return sizes, [sum(block)] * shape.n_layer


def gpt_activation_bytes(shape: GPTShape, seq: int) -> float:
    """fp32 bytes backward keeps for one sequence of `seq` tokens: every leaf module's output
    (the two embeddings; per block the two LayerNorms, q, k, v, both projections and the MLP's
    4x-wide layer; the final LayerNorm; the logits) and each block's two residual sums."""
    te = seq * shape.n_embd
    per_block = 2 * te + 3 * te + te + 4 * te + te + 2 * te  # leaves, then the residual sums
    return 4.0 * (2 * te + shape.n_layer * per_block + te + seq * shape.vocab_size)


# ResNet-18 for 32x32 images (trainers/models.py ResNet18): a 3x3 stem of 64 channels, four
# stages of two BasicBlocks at 64, 128, 256 and 512 channels (the first block of stages 2-4
# strides 2 and projects its shortcut with a 1x1 convolution), a linear classifier of 10.
_RESNET_STAGES = (64, 128, 256, 512)
_RESNET_CLASSES = 10


def resnet18_parameters() -> tuple[list[int], list[int]]:
    """(every parameter's elements in the model's order, each BasicBlock's parameters)."""
    sizes = [3 * 64 * 9, 64, 64]  # stem convolution, its BatchNorm
    blocks = []
    c_in = 64
    for planes in _RESNET_STAGES:
        for first in (True, False):
            block = [c_in * planes * 9, planes, planes, planes * planes * 9, planes, planes]
            if first and c_in != planes:
                block += [c_in * planes, planes, planes]
            sizes += block
            blocks.append(sum(block))
            c_in = planes
    sizes += [c_in * _RESNET_CLASSES, _RESNET_CLASSES]
    return sizes, blocks


def resnet18_activation_bytes() -> float:
    """fp32 bytes of the leaf modules' outputs for one 32x32 image: the stem's convolution,
    BatchNorm and ReLU; per block its two convolutions and BatchNorms and the shortcut (the
    input itself, or a convolution and a BatchNorm); the logits."""
    side = 32
    total = 3 * 64 * side * side
    c_in = 64
    for stage, planes in enumerate(_RESNET_STAGES):
        if stage:
            side //= 2
        for first in (True, False):
            fmap = planes * side * side
            total += 4 * fmap + (2 * fmap if first and c_in != planes else fmap)
            c_in = planes
    return 4.0 * (total + _RESNET_CLASSES)


def split_layers(n_layer: int, stages: int) -> list[range]:
    """The blocks of each pipeline stage, as the trainers split them: as even as possible,
    with the blocks left over going to the middle stages first (the first stage also runs the
    embedding, the last the LM head)."""
    base, extra = divmod(n_layer, stages)
    middle_first = [s for s in range(stages) if s not in (0, stages - 1)]
    ends = [s for s in range(stages) if s in (0, stages - 1)]
    more = set((middle_first + ends)[:extra])
    out, start = [], 0
    for s in range(stages):
        n = base + (s in more)
        out.append(range(start, start + n))
        start += n
    return out
