"""Training FLOPs per token. Torch-free: the plan, the sweep preview and the MFU metric use it."""
from __future__ import annotations

from conf.spec import ModelSpec, RunSpec
from parallel.cost.params import param_counts

ATTENTION_TERMS = {"full": 12, "causal": 6}
"""Attention-score FLOPs per token per layer, in units of H*Q*T: `full` counts the whole T x T
score and value matmuls (PaLM, torchtitan, Megatron; the default MFU convention); `causal`
counts only the lower triangle a causal kernel computes (FlashAttention's convention)."""

FLOPS_CONVENTION = ("6N + 12*L*H*Q*T (PaLM / torchtitan; N = parameters without token "
                    "embeddings, the output head counted even when tied to them; attention "
                    "term full, not halved for the causal mask)")
CAUSAL_CONVENTION = ("6N + 6*L*H*Q*T (N as PaLM's, the output head counted even when tied; "
                     "attention term halved for the causal mask, as FlashAttention counts)")

DOCUMENT_MASK_CONVENTION = (
    "; data.document_mask: the attention term still counts the whole seq_len window (the "
    "dense causal convention, comparable across runs), not the per-document attention the "
    "masked kernels compute, so MFU overstates the FLOPs done by up to the attention term's "
    "{share:.1%} of the total (all of it only for one-token documents)")
"""Appended to the convention of a run with data.document_mask (`run_flops_convention`)."""


def matmul_params(model: ModelSpec) -> int:
    """N of 6N: every parameter a token uses but the token embedding (a lookup, no matmul),
    plus the output head's vocab x dim matmul, which runs whether or not its weight is the
    embedding's. With experts: the active parameters (MOE_CONVENTION)."""
    counts = param_counts(model)
    head = model.vocab_size * model.dim if model.tie_embeddings else 0
    return counts.active - counts.embedding + head


def flops_per_token(model: ModelSpec, seq_len: int, *, attention: str = "full") -> int:
    """Training FLOPs per token (forward + backward): FLOPS_CONVENTION, or with
    attention="causal" CAUSAL_CONVENTION."""
    per_layer = ATTENTION_TERMS[attention] * model.n_heads * model.head_dim * seq_len
    return 6 * matmul_params(model) + model.n_layers * per_layer


def flops_convention(attention: str = "full") -> str:
    return FLOPS_CONVENTION if attention == "full" else CAUSAL_CONVENTION


def attention_share(model: ModelSpec, seq_len: int, *, attention: str = "full") -> float:
    """The attention-score term's share of `flops_per_token`."""
    term = model.n_layers * ATTENTION_TERMS[attention] * model.n_heads * model.head_dim * seq_len
    return term / flops_per_token(model, seq_len, attention=attention)


MOE_CONVENTION = ("; mixture of experts: N counts the active parameters, each routed expert "
                  "weight x top_k/num_experts (MFU on active parameters; capacity drops and "
                  "router scores not counted)")
"""Appended to the convention of a model with experts (`run_flops_convention`)."""


def run_flops_convention(spec: RunSpec, attention: str = "full") -> str:
    """The convention of `spec`'s FLOPs per token (plan, MFU log, summary.json): under
    data.document_mask, `flops_per_token` is unchanged (the window's dense causal count) and
    the convention says so, with the most it can overstate (DOCUMENT_MASK_CONVENTION)."""
    convention = flops_convention(attention)
    if spec.model.moe.enabled:
        convention += MOE_CONVENTION
    if not spec.data.document_mask:
        return convention
    share = attention_share(spec.model, spec.training.seq_len, attention=attention)
    return convention + DOCUMENT_MASK_CONVENTION.format(share=share)
