"""The MoE feed-forward against hand computations: a token-by-token reference (dropless and
under a capacity), the dropped copies of a small batch, the balancing loss against
transformers' own, the sigmoid router's bias update, the routing metrics, the parameter
table against the module, and the rules that refuse impossible combinations."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from conf.errors import ConfigError
from parallel.cost.params import parameter_shapes
from tests.support.specs import cpu_spec
from training.models.moe.model.moe_layer import (MoE, expert_capacity, sort_by_expert,
                                                 tokens_per_expert)
from training.models.moe.model import MoeTransformer
from training.router_losses import update_expert_biases
from training.routing_metrics import routing_fields

DIM = 16


def moe_model(*overrides: str):
    return cpu_spec("model=tiny_moe", "model.dim=16", "model.n_heads=2", "model.n_kv_heads=1",
                    "data=synthetic", *overrides).model


def built_moe(model, seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    layer = MoE(model)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape) * 0.5)
    layer.reset_stats()
    return layer


def swiglu(x, w1, w3, w2):
    return (F.silu(x @ w1.t()) * (x @ w3.t())) @ w2.t()


def reference(layer: MoE, x: torch.Tensor, capacity: int | None) -> torch.Tensor:
    """Token by token: each token's top-k experts in slot order, an expert refusing copies
    once it holds `capacity` (tokens in order, then slots)."""
    tokens = x.reshape(-1, x.shape[-1])
    _, weights, chosen = layer.route(layer.router(tokens).float())
    taken = [0] * layer.num_experts
    out = torch.zeros_like(tokens)
    for t in range(tokens.shape[0]):
        for slot in range(layer.top_k):
            e = int(chosen[t, slot])
            taken[e] += 1
            if capacity is not None and taken[e] > capacity:
                continue
            ex = layer.experts
            out[t] += weights[t, slot] * swiglu(tokens[t], ex.w1[e], ex.w3[e], ex.w2[e])
    if layer.shared_experts is not None:
        out += layer.shared_experts(tokens)
    return out.view_as(x)


@pytest.mark.parametrize("overrides", [
    (), ("model.moe.capacity_factor=0.75",), ("model.moe.renormalize=false",),
    ("model.moe.score=sigmoid", "model.moe.num_shared_experts=1", "model.moe.route_scale=2.5",
     "checkpoint.export_safetensors=false")])
def test_moe_forward_equals_a_token_by_token_reference(overrides):
    model = moe_model(*overrides)
    layer = built_moe(model)
    if layer.expert_bias is not None:
        layer.expert_bias.copy_(torch.tensor([0.3, -0.2, 0.0, 0.1]))
    x = torch.randn(2, 12, DIM)
    capacity = layer.capacity(24)
    torch.testing.assert_close(layer(x), reference(layer, x, capacity), atol=1e-5, rtol=1e-5)


def test_dropped_copies_equal_a_hand_count():
    """4 tokens, top-2 of 4 experts, capacity factor 1: each expert keeps
    ceil(1 x 4 x 2 / 4) = 2 copies. Expert 0 is chosen by tokens 0, 1, 2 (slot 0) and 3
    (slot 1): the copies of tokens 2 and 3 (flat indices 4 and 7) are dropped."""
    chosen = torch.tensor([[0, 1], [0, 2], [0, 1], [3, 0]])
    capacity = expert_capacity(1.0, tokens=4, top_k=2, num_experts=4)
    assert capacity == 2
    load = tokens_per_expert(chosen, num_experts=4)
    assert load.tolist() == [4, 2, 1, 1]
    order, counts = sort_by_expert(chosen, load=load, capacity=capacity)
    assert counts.tolist() == [2, 2, 1, 1]
    assert order.tolist() == [0, 2, 1, 5, 3, 6, 4, 7]  # kept by expert, then the dropped
    dropless_order, dropless_counts = sort_by_expert(chosen, load=load, capacity=None)
    assert dropless_counts.tolist() == [4, 2, 1, 1]
    assert dropless_order.tolist() == [0, 2, 4, 7, 1, 5, 3, 6]


def test_dropped_share_reaches_the_metrics():
    model = moe_model("model.moe.capacity_factor=0.5")
    layer = built_moe(model)
    x = torch.randn(1, 16, DIM)
    layer(x)
    _, _, chosen = layer.route(layer.router(x.reshape(-1, DIM)).float())
    load = torch.bincount(chosen.reshape(-1), minlength=4)
    capacity = expert_capacity(0.5, tokens=16, top_k=2, num_experts=4)
    dropped = int((load - capacity).clamp(min=0).sum())
    assert dropped > 0
    fields = routing_fields([_Holder(layer)])
    assert fields["moe_l0_dropped_frac"] == pytest.approx(dropped / 32)
    assert fields["moe_l0_load_max_mean"] == pytest.approx(float(load.max()) / 8)
    assert fields["moe_l0_max_expert_share"] == pytest.approx(float(load.max()) / 16)
    assert routing_fields([_Holder(layer)]) == {}  # read once: the buffers restart


class _Holder(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def moe_layers(self):
        return {0: self.layer}


def test_balancing_loss_equals_transformers():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    model = moe_model("model.moe.aux_loss_coef=1", "model.moe.z_loss_coef=0")
    layer = built_moe(model)
    x = torch.randn(2, 10, DIM)
    layer(x)
    logits = layer.router(x.reshape(-1, DIM))
    expected = load_balancing_loss_func((logits,), num_experts=4, top_k=2)
    torch.testing.assert_close(layer.router_losses, expected, atol=1e-6, rtol=1e-5)
    z_only = built_moe(moe_model("model.moe.aux_loss_coef=0", "model.moe.z_loss_coef=1"))
    z_only(x)
    z = torch.logsumexp(z_only.router(x.reshape(-1, DIM)), -1).pow(2).mean()
    torch.testing.assert_close(z_only.router_losses, z)


def test_sigmoid_bias_moves_load_toward_the_mean():
    model = moe_model("model.moe.score=sigmoid", "model.moe.bias_update_rate=0.01",
                      "checkpoint.export_safetensors=false")
    layer = built_moe(model)
    layer(torch.randn(2, 16, DIM))
    load = layer.load_since_step.clone()
    update_expert_biases([_Holder(layer)])
    expected = 0.01 * torch.sign(load.mean() - load)
    torch.testing.assert_close(layer.expert_bias, expected)
    assert layer.load_since_step.sum() == 0


@pytest.mark.parametrize("overrides", [(), (
    "model.moe.num_shared_experts=2", "model.moe.score=sigmoid", "model.moe.first_dense_layers=0",
    "model.head_dim=24", "model.attention_bias=true", "checkpoint.export_safetensors=false")])
def test_parameter_table_is_the_module(overrides):
    model = moe_model(*overrides)
    module = MoeTransformer(model)
    got = [(name, tuple(p.shape)) for name, p in module.named_parameters()]
    assert got == parameter_shapes(model)
    assert ("moe.expert_bias" in "".join(module.state_dict())) is (
        model.moe.score == "sigmoid")


@pytest.mark.parametrize(("overrides", "key"), [
    (("model.moe.top_k=5",), "model.moe.top_k"),
    (("model.moe.first_dense_layers=3",), "model.moe.first_dense_layers"),
    (("model.moe.capacity_factor=0",), "model.moe.capacity_factor"),
    (("model.family=llama",), "model.moe.num_experts"),
    (("model.moe.z_loss_coef=-0.01", "parallel=pp", "cluster.procs_per_node=2"),
     "model.moe.z_loss_coef"),
    (("model.moe.score=sigmoid",), "model.moe.score"),  # export as Qwen3-MoE impossible
    (("model.moe.top_k=1",), "model.moe.renormalize"),
])
def test_impossible_combinations_are_refused_with_a_fix(overrides, key):
    with pytest.raises(ConfigError) as err:
        moe_model(*overrides)
    problems = [p for p in err.value.problems if p.key == key]
    assert problems and all(p.fix for p in problems), err.value


def test_knobs_reach_the_spec():
    model = moe_model("model.moe.capacity_factor=1.25", "model.moe.seq_aux_loss=true")
    assert dataclasses.asdict(model.moe)["capacity_factor"] == 1.25
    assert model.moe.seq_aux_loss and model.is_moe_block(1) and not model.is_moe_block(0)
