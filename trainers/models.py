"""Reference models of the study, in plain torch.nn.

- ``resnet18``: ResNet-18 for 32x32 inputs (CIFAR-10 shapes: 3x3 stem, no max-pool).
- ``gpt2-*``: the GPT-2 family (small 124M, medium 355M, large 774M, xl 1.5B) plus small
  configurations that train in seconds on a CPU.

The GPT-2 attention keeps q, k and v as three Linear layers instead of GPT-2's fused
``c_attn``: a column-wise split of a fused weight would hand each tensor-parallel rank a
slice of q only, while three layers split per head (same parameters, same FLOPs).
Dropout is left out so that every run is deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int = 50257
    block_size: int = 1024
    tie_weights: bool = True

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


GPT_CONFIGS: dict[str, GPTConfig] = {
    # Trains in seconds on one CPU core; the study's default.
    "gpt2-tiny": GPTConfig(n_layer=4, n_head=4, n_embd=128, vocab_size=512, block_size=64),
    # Two layers for unit tests.
    "gpt2-nano": GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=256, block_size=32),
    "gpt2-mini": GPTConfig(n_layer=6, n_head=8, n_embd=256, vocab_size=2048, block_size=128),
    "gpt2-small": GPTConfig(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600),
}

MODEL_NAMES = sorted(GPT_CONFIGS) + ["resnet18"]


def is_gpt(name: str) -> bool:
    return name in GPT_CONFIGS


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds n_head / tp of them.
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, -1)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPTEmbedding(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.wte(idx) + self.wpe(pos)


class GPTHead(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


class GPT(nn.Module):
    """GPT-2: token + position embedding, n_layer pre-LN blocks, final LN, LM head."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = GPTEmbedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.head = GPTHead(cfg)
        if cfg.tie_weights:
            self.head.lm_head.weight = self.embed.wte.weight
        self.apply(_init_gpt_weights)
        # GPT-2's scaled init of the residual projections.
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _init_gpt_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


def gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


# ------------------------------------------------------------------------------- ResNet-18
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 (11.2 M parameters) for 32x32 images: 3x3 stem, stages 64-128-256-512."""

    def __init__(self, num_classes: int = 10, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, stride=1, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        layers: list[nn.Module] = []
        in_planes = width
        for i, blocks in enumerate((2, 2, 2, 2)):
            planes = width * 2 ** i
            for j in range(blocks):
                stride = 2 if (i > 0 and j == 0) else 1
                layers.append(BasicBlock(in_planes, planes, stride))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.stem(x))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)


# --------------------------------------------------------------------------------- helpers
def build_model(name: str, seed: int, *, tie_weights: bool | None = None,
                num_classes: int = 10) -> nn.Module:
    """The model `name` with weights drawn from `seed` (identical on every rank)."""
    torch.manual_seed(seed)
    if name == "resnet18":
        return ResNet18(num_classes=num_classes)
    cfg = gpt_config(name)
    if tie_weights is not None:
        cfg = replace(cfg, tie_weights=tie_weights)
    return GPT(cfg)


def gpt_config(name: str) -> GPTConfig:
    try:
        return GPT_CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODEL_NAMES)}") from None


def count_params(model: nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def gpt_flops_per_token(cfg: GPTConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 x (non-embedding params + LM head) + attention (PaLM's)."""
    per_layer = 12 * cfg.n_embd ** 2
    dense = cfg.n_layer * per_layer + cfg.n_embd * cfg.vocab_size
    attention = 12 * cfg.n_layer * cfg.n_embd * seq_len
    return 6.0 * dense + attention
