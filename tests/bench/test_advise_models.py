"""nanoccl/advise_models.py against the reference trainers' own modules.

The package does not import trainers/ (it is not installed with it), so the advisor keeps the
models' shapes as data and formulas. Here each number is measured on the trainers' modules,
built on the meta device: every parameter in order, each FSDP2 unit's parameters, the leaf
modules' outputs for one sample, the pipeline's split of the blocks.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from bench_helpers import REPO

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the tests sit above the trainers, which sit above nanoccl

import nanoccl.advise_models as advise_models  # noqa: E402
import nanoccl.advise_traffic as advise_traffic  # noqa: E402
import trainers.models as models  # noqa: E402
import trainers.strategies as strategies  # noqa: E402


def _leaf_output_bytes(model: torch.nn.Module, sample: torch.Tensor) -> int:
    total = [0]

    def hook(_m: Any, _i: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            total[0] += out.numel() * out.element_size()

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        model(sample)
    finally:
        for h in handles:
            h.remove()
    return total[0]


def _distinct(model: torch.nn.Module) -> list[int]:
    seen: set[int] = set()
    out = []
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p.numel())
    return out


def test_the_model_names_and_gpt_shapes_are_the_trainers() -> None:
    assert advise_models.MODEL_NAMES == models.MODEL_NAMES
    for name, cfg in models.GPT_CONFIGS.items():
        shape = advise_models.GPT_SHAPES[name]
        assert (shape.n_layer, shape.n_head, shape.n_embd, shape.vocab_size,
                shape.block_size) == (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size,
                                      cfg.block_size) and cfg.tie_weights, name


@pytest.mark.parametrize("name, seq", [("gpt2-nano", 32), ("gpt2-tiny", 64), ("gpt2-tiny", 17),
                                       ("gpt2-small", 1024), ("gpt2-xl", 256), ("resnet18", 1)])
def test_parameters_units_and_activations_match_the_trainers_modules(name: str, seq: int) -> None:
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = models.build_model(name, 0)
    spec = advise_traffic.model_spec(name, 4, seq if models.is_gpt(name) else None)
    assert [n // 4 for n, _ in spec.grads] == _distinct(model)
    if models.is_gpt(name):
        blocks = list(model.blocks)
        sample = torch.zeros((1, seq), dtype=torch.long, device="meta")
        residuals = 2 * model.cfg.n_layer * seq * model.cfg.n_embd * 4
    else:
        blocks = [m for m in model.modules() if isinstance(m, models.BasicBlock)]
        sample = torch.zeros((1, 3, 32, 32), device="meta")
        residuals = 0
    assert spec.units[1:] == [sum(p.numel() for p in b.parameters()) for b in blocks]
    assert sum(spec.units) == spec.params == models.count_params(model)
    assert spec.act_bytes_per_sample == _leaf_output_bytes(model, sample) + residuals


@pytest.mark.parametrize("layers", [1, 2, 4, 5, 12, 13, 48])
def test_pipeline_split_is_the_trainers(layers: int) -> None:
    for stages in range(1, min(layers, 8) + 1):
        assert advise_models.split_layers(layers, stages) == strategies.split_layers(layers,
                                                                                     stages)


def test_a_gpt_by_hand_is_the_trainers_gpt_of_that_config() -> None:
    spec = advise_traffic.gpt_by_hand(None, 3, 96, 48, 2, heads=3, vocab=300)
    cfg = models.GPTConfig(n_layer=3, n_head=3, n_embd=96, vocab_size=300, block_size=48)
    with torch.device("meta"):
        model = models.GPT(cfg)
    assert [n // 4 for n, _ in spec.grads] == _distinct(model)
    sample = torch.zeros((1, 48), dtype=torch.long, device="meta")
    assert spec.act_bytes_per_sample == _leaf_output_bytes(model, sample) + 2 * 3 * 48 * 96 * 4
