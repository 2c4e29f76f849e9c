"""The shipped mixture-of-experts shapes have their published total and active parameter
counts (model cards: Qwen3-30B-A3B 30.5B / 3.3B, Mixtral 8x7B 46.7B / 12.9B, DeepSeek-V3
671B / 37B), and the plan's FLOPs per token come from the active ones."""
from __future__ import annotations

import pytest

from conf.compose import compose_config
from conf.resolve import resolve
from parallel.cost.flops import flops_per_token, matmul_params
from parallel.cost.params import param_counts
from tests.config.test_shipped_configs import CPU, EXTRA_OVERRIDES

EXACT_TOTAL = {"qwen3_moe_30b_a3b": 30_532_122_624,   # Qwen3-30B-A3B safetensors
               "mixtral_8x7b": 46_702_792_704}        # Mixtral-8x7B-v0.1 safetensors
PUBLISHED = {"qwen3_moe_30b_a3b": (30.5, 3.3), "mixtral_8x7b": (46.7, 12.9),
             "deepseek_v3_671b": (671, 37)}
"""Billions, total and active per token, as the model cards round them."""
CARD_DIGIT = 0.06
"""The cards give one decimal, rounded (Mixtral 12.88 -> 12.9) or cut (Qwen3 3.353 -> 3.3)."""
MLA_APPROXIMATION = 0.005
"""DeepSeek-V3's attention is approximated (conf/model/deepseek_v3_671b.yaml): within 0.5%."""


def model_spec(name: str):
    return resolve(compose_config([f"model={name}", *EXTRA_OVERRIDES.get(name, [])]),
                   host=CPU).model


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_moe_shapes_have_their_published_counts(name):
    counts = param_counts(model_spec(name))
    total, active = PUBLISHED[name]
    if name in EXACT_TOTAL:
        assert counts.total == EXACT_TOTAL[name]
        assert abs(counts.total / 1e9 - total) < CARD_DIGIT
        assert abs(counts.active / 1e9 - active) < CARD_DIGIT
    else:
        assert counts.total / 1e9 == pytest.approx(total, rel=MLA_APPROXIMATION)
        assert round(counts.active / 1e9) == active


def test_flops_per_token_count_active_parameters():
    model = model_spec("mixtral_8x7b")
    counts = param_counts(model)
    assert matmul_params(model) == counts.active - counts.embedding
    expert = 3 * 4096 * 14336
    assert counts.total - counts.active == 32 * 6 * expert  # 6 of 8 experts idle per token
    assert flops_per_token(model, 4096) == 6 * matmul_params(model) + 32 * 12 * 4096 * 4096
