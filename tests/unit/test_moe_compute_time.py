"""The step-time model's compute of mixture-of-experts blocks (parallel/cost/moe_gemms.py):
the GEMMs' FLOPs equal the active parameters' (counted independently by parallel.cost.params),
the busiest ep rank's expert GEMMs grow by the imbalance factor, and a dense model keeps the
dense GEMMs."""
from __future__ import annotations

from functools import cache

import pytest

from parallel.cost.matmul_rate import Gemm, MatmulRate, block_gemms
from parallel.cost.moe_gemms import block_kinds, ffn_forward_flops_per_token, moe_ffn_gemms
from parallel.cost.params import param_counts
from parallel.cost.step_time import compute_terms, hardware_of
from parallel.cost.plan import make_plan
from tests.support.specs import cpu_spec

spec = cache(cpu_spec)
TINY_MOE = ("model=tiny_moe", "data=synthetic", "training.seq_len=32")
SHIPPED = ("qwen3_moe_30b_a3b", "mixtral_8x7b", "deepseek_v3_671b", "tiny_moe")


def _feed_forward_active(model) -> float:
    """Active feed-forward parameters per block, averaged: the active total less the
    attention, norms, embedding and head (counted by params.py from the real shapes)."""
    counts = param_counts(model)
    q, kv = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    attention = model.dim * (2 * q + 2 * kv)
    rest = counts.active - model.n_layers * attention
    head_and_embedding = model.vocab_size * model.dim * (1 if model.tie_embeddings else 2)
    norms = model.n_layers * 2 * model.dim + model.dim
    qk_norms = model.n_layers * 2 * model.head_dim if getattr(model, "qk_norm", False) else 0
    return (rest - head_and_embedding - norms - qk_norms) / model.n_layers


@pytest.mark.parametrize("name", SHIPPED)
def test_feed_forward_flops_are_twice_the_active_parameters(name):
    """2 FLOPs per active weight per token: the router, top_k experts, the shared ones."""
    model = spec(f"model={name}", "data=synthetic", "training.seq_len=32",
                 "checkpoint.export_safetensors=false").model
    expected = 2 * _feed_forward_active(model)
    assert ffn_forward_flops_per_token(model) == pytest.approx(expected, rel=2e-3)


def test_one_process_runs_every_copy_once_and_ep_ranks_their_share_times_the_imbalance():
    model = spec(*TINY_MOE).model
    moe, tokens = model.moe, 4096
    one = moe_ffn_gemms(model, tokens=tokens, ep=1, fp8=False, ep_imbalance=1.7)
    routed = sum(g.flops for g in one[1:4])
    assert routed == pytest.approx(2 * 3 * model.dim * model.expert_ffn_dim * moe.top_k * tokens)
    assert {g.groups for g in one[1:4]} == {moe.num_experts}
    two = moe_ffn_gemms(model, tokens=tokens, ep=2, fp8=False, ep_imbalance=1.0)
    assert {g.groups for g in two[1:4]} == {moe.num_experts // 2}
    assert sum(g.flops for g in two[1:4]) == pytest.approx(routed, rel=1e-3)
    skewed = moe_ffn_gemms(model, tokens=tokens, ep=2, fp8=False, ep_imbalance=1.5)
    assert sum(g.flops for g in skewed[1:4]) == pytest.approx(1.5 * routed, rel=1e-3)
    assert all(not g.fp8 for g in moe_ffn_gemms(model, tokens=tokens, ep=1, fp8=True,
                                                ep_imbalance=1.0)[:4])


def test_a_dense_model_keeps_its_block_gemms():
    s = spec("model=tiny", "data=synthetic", "training.seq_len=32")
    kinds = block_kinds(s.model, s.parallel, tokens=64, fp8=False, ep_imbalance=3.0)
    assert kinds == ((block_gemms(s.model, tokens=64, tp=1, fp8=False), 1.0),)


def test_dense_layers_before_the_first_moe_layer_are_their_own_kind():
    s = spec(*TINY_MOE, "model.moe.first_dense_layers=1")
    (dense, dense_share), (moe, moe_share) = block_kinds(s.model, s.parallel, tokens=64,
                                                         fp8=False, ep_imbalance=1.0)
    assert dense_share == pytest.approx(1 / s.model.n_layers)
    assert moe_share == pytest.approx(1 - dense_share)
    assert dense == block_gemms(s.model, tokens=64, tp=1, fp8=False)
    assert len(moe) == 4 + 4  # q, k, v, o; router, w1, w3, w2


def test_a_grouped_gemm_pays_one_knee_and_moves_every_experts_weights():
    rate = MatmulRate(flops=1e12, fp8_flops=0.0, hbm_bytes_s=1e9, knee_s=1e-3)
    one = Gemm(8, 64, 64)
    grouped = Gemm(8, 64, 64, False, 4)
    assert grouped.flops == 4 * one.flops
    # memory-bound here: four experts' weights and rows move, the three knees are paid once
    assert rate.seconds(grouped, operand_bytes=2) - 3e-3 == pytest.approx(
        4 * (rate.seconds(one, operand_bytes=2) - 3e-3))


def test_the_step_time_grows_with_the_imbalance_of_an_ep_layout():
    overrides = (*TINY_MOE, "parallel=ep", "cluster.procs_per_node=2")
    computes = []
    for factor in ("1.0", "2.0"):
        s = cpu_spec(*overrides, f"parallel.ep_imbalance={factor}")
        computes.append(compute_terms(s, make_plan(s), hardware_of(s)).scaled_s)
    assert computes[1] > computes[0] * 1.05


def test_a_compiled_moe_block_is_credited_its_norms_only():
    """compile's measured saving of a dense block (silu(gate) of the SwiGLU, each norm's
    upcast) is not the experts': an MoE block keeps its eager bytes less the norms'."""
    from parallel.cost.activations import (ActivationDtypes, ActivationSplit,
                                           block_bytes_per_token, compiled_savings)

    s = spec(*TINY_MOE)
    dtypes = ActivationDtypes.uniform(4)
    eager, compiled = (ActivationSplit(), ActivationSplit(compiled=True))
    kept = {split.compiled: {moe: block_bytes_per_token(s.model, recompute=s.recompute,
                                                        device_type="cpu", dtypes=dtypes,
                                                        split=split, moe=moe)
                             for moe in (False, True)}
            for split in (eager, compiled)}
    dense_saving = sum(compiled_savings(s.model, dtypes=dtypes, split=compiled).values())
    norms = compiled_savings(s.model, dtypes=dtypes, split=compiled, moe=True)
    assert kept[False][False] - kept[True][False] == dense_saving
    assert kept[False][True] - kept[True][True] == sum(norms.values()) < dense_saving
