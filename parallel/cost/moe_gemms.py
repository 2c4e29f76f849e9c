"""The GEMMs of a block's feed-forward by kind of block, for the step-time model: the dense
SwiGLU (matmul_rate.mlp_gemms) or a mixture-of-experts layer (training/models/moe/model/
moe_layer.py). Torch-free.

A mixture-of-experts feed-forward over one pass's `tokens` on one rank runs

- the router: [tokens, dim] x [dim, num_experts], in the compute dtype;
- the routed experts: the rank holds num_experts / ep of them and runs every token copy
  routed to them: tokens x top_k copies on average (each of the ep ranks sends its
  tokens x top_k / ep to each), times the load-imbalance factor on the busiest rank when
  ep > 1 (`parallel.ep_imbalance`, or what `plan --calibrate` fitted: the step waits for the
  slowest rank); each expert's SwiGLU is three GEMMs over its share of the copies, run as one
  grouped call per weight (torch._grouped_mm on GPU: `Gemm.groups`, one knee). They stay in
  the compute dtype under fp8 (torchao converts nn.Linear; the experts are grouped weights);
- the shared experts: one SwiGLU of num_shared_experts x expert_ffn_dim over every token (fp8
  under precision=fp8: they are nn.Linear).

Under tensor parallelism the router and experts are replicated over tp (expert-tensor-parallel
1): each tp rank routes its sequence shard's tokens under sequence parallel, all of the pass's
tokens without it. A capacity factor's drops are not subtracted (dropless is the default;
with a capacity the estimate is an upper bound)."""
from __future__ import annotations

from conf.spec import ModelSpec, ParallelSpec
from parallel.cost.matmul_rate import Gemm, attention_projections, mlp_gemms


def block_kinds(model: ModelSpec, parallel: ParallelSpec, *, tokens: int, fp8: bool,
                ep_imbalance: float) -> tuple[tuple[tuple[Gemm, ...], float], ...]:
    """(the GEMMs of one block pass in call order, the share of the model's blocks of that
    kind) for each kind of block: dense blocks, then mixture-of-experts blocks."""
    tp = parallel.tp
    attention = attention_projections(model, tokens=tokens, tp=tp, fp8=fp8)
    n_moe = sum(model.is_moe_block(i) for i in range(model.n_layers))
    kinds = []
    if n_moe < model.n_layers:
        kinds.append((attention + mlp_gemms(model, tokens=tokens, tp=tp, fp8=fp8),
                      (model.n_layers - n_moe) / model.n_layers))
    if n_moe:
        local = tokens // tp if parallel.sequence_parallel and tp > 1 else tokens
        kinds.append((attention + moe_ffn_gemms(model, tokens=max(1, local), ep=parallel.ep,
                                                fp8=fp8, ep_imbalance=ep_imbalance),
                      n_moe / model.n_layers))
    return tuple(kinds)


def moe_ffn_gemms(model: ModelSpec, *, tokens: int, ep: int, fp8: bool,
                  ep_imbalance: float) -> tuple[Gemm, ...]:
    """Router, routed experts (grouped) and shared experts of one pass (module docstring)."""
    moe, d, f = model.moe, model.dim, model.expert_ffn_dim
    local = max(1, moe.num_experts // max(ep, 1))
    copies = tokens * moe.top_k * (ep_imbalance if ep > 1 else 1.0)
    rows = max(1, round(copies / local))
    gemms = (Gemm(tokens, moe.num_experts, d, False),
             Gemm(rows, f, d, False, local), Gemm(rows, f, d, False, local),
             Gemm(rows, d, f, False, local))
    if moe.num_shared_experts:
        shared = moe.num_shared_experts * f
        gemms += (Gemm(tokens, shared, d, fp8), Gemm(tokens, shared, d, fp8),
                  Gemm(tokens, d, shared, fp8))
    return gemms


def ffn_forward_flops_per_token(model: ModelSpec) -> float:
    """Forward matmul FLOPs per token of a block's feed-forward, averaged over the blocks:
    the dense SwiGLU, or the router + top_k routed experts + the shared experts."""
    d = model.dim
    dense = 2 * 3 * d * model.ffn_dim
    if not model.moe.enabled:
        return float(dense)
    moe, f = model.moe, model.expert_ffn_dim
    routed = 2 * (d * moe.num_experts + 3 * d * f * (moe.top_k + moe.num_shared_experts))
    n_moe = sum(model.is_moe_block(i) for i in range(model.n_layers))
    return (dense * (model.n_layers - n_moe) + routed * n_moe) / model.n_layers


__all__ = ["block_kinds", "ffn_forward_flops_per_token", "moe_ffn_gemms"]
