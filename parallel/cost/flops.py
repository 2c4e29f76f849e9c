"""Training FLOPs per token. Torch-free: the plan, the sweep preview and the MFU metric use it."""
from __future__ import annotations

from conf.spec import ModelSpec
from parallel.cost.params import param_counts

FLOPS_CONVENTION = "6N + 12*L*H*Q*T (PaLM / torchtitan; N = parameters without token embeddings)"


def flops_per_token(model: ModelSpec, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward), FLOPS_CONVENTION."""
    n = param_counts(model).non_embedding
    return 6 * n + 12 * model.n_layers * model.n_heads * model.head_dim * seq_len
