"""Activation bytes a mixture-of-experts feed-forward keeps for backward. Torch-free.

What the MoE family's module (training/models/moe/model/moe_layer.py, grouped_experts.py;
parallel/expert_parallel.py under ep) really saves, measured per storage on gloo ranks
(tests/distributed/test_activation_memory.py, `MOE_*`) for tiny_moe in fp32, under FSDP
mixed precision and under autocast. A block's attention half is the dense block's
(activations.block_bytes_per_token); these terms replace its SwiGLU MLP and the MLP norm
output's copies. Per token of the rank's micro-batch (T tokens, k = top_k, E experts, d =
dim, f = expert_ffn_dim; c the compute dtype, int64 indices 8 bytes), recompute none:

  router: its input (the MLP norm's output; under autocast the router's own compute-dtype
    cast), the fp32 logits (the z-loss's logsumexp keeps them) and the logsumexp, the
    softmax's output (E), the top-k indices (k, int64); renormalised top-k weights keep
    their sum and the weights (fp32) too; the weights cast to the experts' output dtype (k).
  dispatch: the copies' order (argsort) and their source rows (k each, int64), the copies
    put back in order (index_copy, k x d); under ep also the combine all-to-all's output
    (k x d), index_copy's source.
  experts, per copy RECEIVED (balanced dropless routing: k per token, whatever ep): the
    permuted token (its norm dtype; under autocast each of w1 and w3 casts it, or in bf16
    the grouped GEMM once, which also keeps its int32 group offsets per block), gate, silu,
    up and their product (4f), the local experts' joined output (d); under ep the local
    re-sort's index (int64).
  shared experts: a SwiGLU of num_shared x f over the tokens (its input is the router's).
  per micro-batch: the balancing loss's load share (E fp32; [B, E] per sequence), the
    z-loss's token count and the weighted router-loss scalar the module keeps (the latter
    under every policy).

selective ops keeps the matmul outputs instead: the router's logits (E, compute dtype), each
copy's gate, up and down outputs (2f + d) and the shared experts' (2 f_s + d). full / block
keep only the block input (the dense block's). Tensor parallelism does not split experts
or router (conf/rules/moe_rules.py): these terms are whole over tp.

Token counts per expert depend on routing: the plan takes a balanced load (every rank's
experts receive k copies per token of a micro-batch; dropless, so a capacity factor only
lowers what is kept), times parallel.ep_imbalance under ep when that is set: the busiest
rank's experts then receive ep_imbalance x T x k copies (the step time's convention,
moe_gemms.py). A rank's real bytes differ from the balanced plan by `expert_bytes_per_copy`
x (copies it received - T x k), the rule the distributed test checks with the measured
loads.
"""
from __future__ import annotations

from fractions import Fraction

from conf.schema import RecomputeMode, RecomputeTarget
from conf.spec import ModelSpec, RecomputeSpec

FP32 = 4
INDEX = 8
"""int64 routing indices."""
INT32 = 4
"""The grouped GEMM's int32 group offsets (one per local expert)."""


def is_moe_block(model: ModelSpec, layer: int) -> bool:
    return model.is_moe_block(layer)


def _keeps_what_none_keeps(recompute: RecomputeSpec, targets: set) -> bool:
    """Policies that leave the feed-forward as none has it (attention / norm targets)."""
    mode = RecomputeMode(recompute.mode)
    if mode is RecomputeMode.none or mode is RecomputeMode.offload:
        return True
    return mode is RecomputeMode.selective and not (
        {RecomputeTarget.block, RecomputeTarget.ops} & targets)


def _reruns_ops(recompute: RecomputeSpec, targets: set) -> bool:
    return (RecomputeMode(recompute.mode) is RecomputeMode.selective
            and RecomputeTarget.ops in targets and RecomputeTarget.block not in targets)


def expert_bytes_per_copy(model: ModelSpec, *, recompute: RecomputeSpec, targets: set,
                          dtypes, ep: int) -> Fraction:
    """Bytes kept per token copy a rank's experts receive (module docstring); `targets`:
    activations.selective_targets(recompute), `dtypes`: activations.ActivationDtypes."""
    d, f, c = model.dim, model.expert_ffn_dim, dtypes.compute
    if _reruns_ops(recompute, targets):
        return Fraction(c * (2 * f + d))
    if not _keeps_what_none_keeps(recompute, targets):
        return Fraction(0)
    casts = 1 if dtypes.grouped_experts else 2  # the grouped GEMM casts once, w1 and w3 each
    permuted = (casts * c if dtypes.autocast else dtypes.residual) * d
    return Fraction(permuted + 4 * c * f + c * d + (INDEX if ep > 1 else 0))


def moe_bytes_per_token(model: ModelSpec, *, recompute: RecomputeSpec, targets: set,
                        dtypes, ep: int, ep_imbalance: float = 1.0) -> Fraction:
    """Bytes one MoE feed-forward keeps per token of the rank's micro-batch, its MLP norm
    output's copies included; under ep its experts receive `ep_imbalance` x the balanced
    load's token copies (the busiest rank; module docstring)."""
    moe, d, c = model.moe, model.dim, dtypes.compute
    k, experts = moe.top_k, moe.num_experts
    shared_f = moe.num_shared_experts * model.expert_ffn_dim
    copies = k * (Fraction(ep_imbalance) if ep > 1 else 1)
    received = copies * expert_bytes_per_copy(model, recompute=recompute, targets=targets,
                                              dtypes=dtypes, ep=ep)
    if _reruns_ops(recompute, targets):
        return c * experts + received + (c * (2 * shared_f + d) if shared_f else 0)
    if not _keeps_what_none_keeps(recompute, targets):
        return Fraction(0)
    router_input = (c if dtypes.autocast else dtypes.residual) * d
    scores = FP32 * experts if moe.score.value == "softmax" else FP32 * experts + FP32
    router = router_input + FP32 * experts + FP32 + scores + INDEX * k + c * k
    if moe.renormalize:
        router += FP32 * k + FP32
    dispatch = 2 * INDEX * k + c * k * d * (2 if ep > 1 else 1)
    shared = 4 * c * shared_f + (2 * c * d if dtypes.autocast else 0) if shared_f else 0
    return Fraction(router + dispatch + shared) + received


def moe_bytes_per_micro_batch(model: ModelSpec, *, recompute: RecomputeSpec, targets: set,
                              micro_batch: int, dtypes, ep: int) -> int:
    """The balancing loss's saved load share and the z-loss's token count (recompute none
    and module targets: moe_layer.router_loss_terms), the grouped GEMM's group offsets, and
    the router-loss scalar the module holds (every policy)."""
    if not _keeps_what_none_keeps(recompute, targets):
        return FP32
    rows = micro_batch if model.moe.seq_aux_loss else 1
    offsets = INT32 * (model.moe.num_experts // max(ep, 1)) if dtypes.grouped_experts else 0
    return FP32 * rows * model.moe.num_experts + 2 * FP32 + offsets


def qk_norm_bytes_per_token(model: ModelSpec, *, dtypes) -> Fraction:
    """model.qk_norm: each of the q and k norms keeps its fp32 input (the projection's
    output, or its upcast), an rsqrt per head and its normalised value in the compute dtype
    (the projection's), per token, whole over tp (÷ tp by the caller)."""
    if not model.qk_norm:
        return Fraction(0)
    rows = (model.n_heads + model.n_kv_heads) * model.head_dim
    return Fraction((FP32 + dtypes.compute) * rows + FP32 * (model.n_heads + model.n_kv_heads))


def qk_norm_fp32_attention_inputs(model: ModelSpec, *, dtypes) -> int:
    """model.qk_norm under autocast: the fp32 norm weights leave q and k in fp32, so a
    checkpointed attention core (selective attention) keeps them in fp32, not SDPA's
    compute-dtype casts: the bytes more per token (÷ tp by the caller)."""
    if not (model.qk_norm and dtypes.autocast):
        return 0
    return (FP32 - dtypes.compute) * (model.n_heads + model.n_kv_heads) * model.head_dim
