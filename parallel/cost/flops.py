"""Training FLOPs per token. Torch-free: the plan, the sweep preview and the MFU metric use it."""
from __future__ import annotations

from conf.spec import ModelSpec
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


def matmul_params(model: ModelSpec) -> int:
    """N of 6N: every parameter but the token embedding (a lookup, no matmul), plus the output
    head's vocab x dim matmul, which runs whether or not its weight is the embedding's."""
    counts = param_counts(model)
    head = model.vocab_size * model.dim if model.tie_embeddings else 0
    return counts.non_embedding + head


def flops_per_token(model: ModelSpec, seq_len: int, *, attention: str = "full") -> int:
    """Training FLOPs per token (forward + backward): FLOPS_CONVENTION, or with
    attention="causal" CAUSAL_CONVENTION."""
    per_layer = ATTENTION_TERMS[attention] * model.n_heads * model.head_dim * seq_len
    return 6 * matmul_params(model) + model.n_layers * per_layer


def flops_convention(attention: str = "full") -> str:
    return FLOPS_CONVENTION if attention == "full" else CAUSAL_CONVENTION
