"""Which weights tensor parallelism splits, and along which dim. Torch-free.

One table, read by both `parallel/tensor_parallel.py` (which applies it with DTensor) and the
cost model (`parallel/cost/params.py`, which counts the tp-local shapes), so the two cannot
drift. Megatron pairs: column-parallel weights split their output features (dim 0 of an
`nn.Linear` weight), row-parallel ones their input features (dim 1); the embedding is split by
vocabulary rows (dim 0) and the output head by vocabulary columns (dim 0 of its weight).
A column-parallel layer's bias (q/k/v with model.attention_bias) is split along dim 0 with its
output features; a row-parallel layer's bias would be whole on every rank (added once, after
the reduction). Everything else (the norms) is replicated.
"""
from __future__ import annotations

BLOCK_COLUMN_PARALLEL = ("attention.wq", "attention.wk", "attention.wv",
                         "feed_forward.w1", "feed_forward.w3")
"""Module paths inside a block (`layers.<i>.`) that are column-parallel."""
BLOCK_ROW_PARALLEL = ("attention.wo", "feed_forward.w2")
"""Module paths inside a block that are row-parallel (partial sums reduced)."""
VOCAB_PARALLEL_EMBEDDING = "tok_embeddings"
"""The token embedding: vocabulary rows split over tp."""
VOCAB_PARALLEL_HEAD = "output"
"""The output head: vocabulary columns (the logits) split over tp."""

_SPLIT_DIM = {**{path: 0 for path in BLOCK_COLUMN_PARALLEL},
              **{path: 1 for path in BLOCK_ROW_PARALLEL}}
_ROOT_SPLIT_DIM = {VOCAB_PARALLEL_EMBEDDING: 0, VOCAB_PARALLEL_HEAD: 0}


def tp_split_dim(param_name: str) -> int | None:
    """The dim of parameter `param_name` (as `Transformer.named_parameters()` names it) that
    tensor parallelism splits, or None when every tp rank holds it whole."""
    parts = param_name.split(".")
    if parts[0] == "layers":
        dim = _SPLIT_DIM.get(".".join(parts[2:-1]))
        if parts[-1] == "bias":
            return 0 if dim == 0 else None
        return dim
    return _ROOT_SPLIT_DIM.get(".".join(parts[:-1]))
