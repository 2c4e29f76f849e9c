"""Which weights tensor parallelism splits, and along which dim. Torch-free.

The table is each model family's `TpPlan` (training/models/), read by both
`parallel/tensor_parallel.py` (which applies it with DTensor) and the cost model
(`parallel/cost/params.py`, which counts the tp-local shapes through `tp_split_dim`), so the two
cannot drift. Megatron pairs: column-parallel weights split their output features (dim 0 of an
`nn.Linear` weight), row-parallel ones their input features (dim 1); the embedding is split by
vocabulary rows (dim 0) and the output head by vocabulary columns (dim 0 of its weight).
A column-parallel layer's bias (q/k/v with model.attention_bias) is split along dim 0 with its
output features; a row-parallel layer's bias would be whole on every rank (added once, after
the reduction). Everything else (the norms) is replicated.
"""
from __future__ import annotations

from functools import lru_cache

from training.models import model_family
from training.models.family import block_path


@lru_cache(maxsize=64)
def _split_dims(family: str) -> tuple[dict[str, int], dict[str, int]]:
    """(block module path -> split dim, top-level module -> split dim) of `family`."""
    tp = model_family(family).tp
    block = {**{path: 0 for path in tp.column}, **{path: 1 for path in tp.row}}
    return block, {tp.embedding: 0, tp.head: 0}


@lru_cache(maxsize=8192)
def tp_split_dim(param_name: str, family: str) -> int | None:
    """The dim of parameter `param_name` (its state-dict name) of a `family` model that tensor
    parallelism splits, or None when every tp rank holds it whole."""
    block, root = _split_dims(family)
    inside = block_path(param_name)
    if inside is not None:
        module, _, kind = inside.rpartition(".")
        dim = block.get(module)
        if kind == "bias":
            return 0 if dim == 0 else None
        return dim
    return root.get(param_name.rpartition(".")[0])
