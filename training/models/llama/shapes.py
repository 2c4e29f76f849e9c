"""The Llama family's parameter table: every parameter's name and shape. Torch-free.

The one source of the model's parameters: the count, the FLOPs and the memory per rank derive
from it (parallel/cost/params.py), and tests check it against the built module.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conf.spec import ModelSpec

EMBEDDING = "tok_embeddings"
FINAL_NORM = "norm"
HEAD = "output"
ATTENTION = "attention"
FEED_FORWARD = "feed_forward"
NORMS = ("attention_norm", "ffn_norm")
QKV = ("attention.wq", "attention.wk", "attention.wv")
GATE_UP = ("feed_forward.w1", "feed_forward.w3")
ATTENTION_OUT = "attention.wo"
DOWN = "feed_forward.w2"


def parameter_shapes(model: ModelSpec) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every parameter, in `Transformer.parameters()` order."""
    d, f, hd = model.dim, model.ffn_dim, model.head_dim
    q, kv = model.n_heads * hd, model.n_kv_heads * hd
    block = [("attention_norm", (d,)), ("attention.wq", (q, d)), ("attention.wk", (kv, d)),
             ("attention.wv", (kv, d)), ("attention.wo", (d, q)), ("ffn_norm", (d,)),
             ("feed_forward.w1", (f, d)), ("feed_forward.w3", (f, d)),
             ("feed_forward.w2", (d, f))]
    biases = {"attention.wq": (q,), "attention.wk": (kv,), "attention.wv": (kv,)}
    shapes = [(f"{EMBEDDING}.weight", (model.vocab_size, d))]
    for i in range(model.n_layers):
        for name, shape in block:
            shapes.append((f"layers.{i}.{name}.weight", shape))
            if model.attention_bias and name in biases:  # Qwen2: q/k/v biases
                shapes.append((f"layers.{i}.{name}.bias", biases[name]))
    shapes.append((f"{FINAL_NORM}.weight", (d,)))
    if not model.tie_embeddings:
        shapes.append((f"{HEAD}.weight", (model.vocab_size, d)))
    return tuple(shapes)
