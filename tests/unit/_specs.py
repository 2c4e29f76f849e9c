"""Tiny model shapes for fast CPU tests."""
from __future__ import annotations

from conf.spec import ModelSpec


def tiny_model_spec(**overrides) -> ModelSpec:
    """2 layers, dim 64, 4 query heads sharing 2 key/value heads, byte vocabulary."""
    fields = dict(
        name="tiny", n_layers=2, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=128,
        vocab_size=256, max_seq_len=128, rope_theta=10000.0, tie_embeddings=False,
        norm_eps=1e-5, init_std=0.02,
    )
    fields.update(overrides)
    return ModelSpec(**fields)
