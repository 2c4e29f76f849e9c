"""The MoE family's parameter table and its active parameters per token. Torch-free.

Blocks are the Llama family's (attention, norms; q/k norms with model.qk_norm) with either a
dense `feed_forward` (blocks before moe.first_dense_layers) or `moe`: router [E, dim],
experts w1/w3 [E, ffn, dim] and w2 [E, dim, ffn], shared experts (a SwiGLU).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conf.spec import ModelSpec

EMBEDDING, FINAL_NORM, HEAD = "tok_embeddings", "norm", "output"
ATTENTION, FEED_FORWARD, MOE = "attention", "feed_forward", "moe"
NORMS = ("attention_norm", "ffn_norm")
QK_NORMS = ("attention.q_norm", "attention.k_norm")
ROUTER = "moe.router"
EXPERTS = "moe.experts"
SHARED = "moe.shared_experts"
EXPERT_WEIGHTS = ("moe.experts.w1", "moe.experts.w3", "moe.experts.w2")
"""The stacked routed-expert weights (block paths): a token uses top_k of their E rows."""


def attention_shapes(model: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    d, hd = model.dim, model.head_dim
    q, kv = model.n_heads * hd, model.n_kv_heads * hd
    shapes = []
    for name, rows in (("wq", q), ("wk", kv), ("wv", kv)):
        shapes.append((f"attention.{name}.weight", (rows, d)))
        if model.attention_bias:
            shapes.append((f"attention.{name}.bias", (rows,)))
    shapes.append(("attention.wo.weight", (d, q)))
    if model.qk_norm:
        shapes += [(f"{norm}.weight", (hd,)) for norm in QK_NORMS]
    return shapes


def swiglu_shapes(prefix: str, *, dim: int, ffn: int) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"{prefix}.w1.weight", (ffn, dim)), (f"{prefix}.w3.weight", (ffn, dim)),
            (f"{prefix}.w2.weight", (dim, ffn))]


def ffn_shapes(model: ModelSpec, index: int) -> list[tuple[str, tuple[int, ...]]]:
    d = model.dim
    if not model.is_moe_block(index):
        return swiglu_shapes(FEED_FORWARD, dim=d, ffn=model.ffn_dim)
    e, f = model.moe.num_experts, model.expert_ffn_dim
    shapes = [(f"{ROUTER}.weight", (e, d)), (f"{EXPERTS}.w1", (e, f, d)),
              (f"{EXPERTS}.w3", (e, f, d)), (f"{EXPERTS}.w2", (e, d, f))]
    if model.moe.num_shared_experts:
        shapes += swiglu_shapes(SHARED, dim=d, ffn=model.moe.num_shared_experts * f)
    return shapes


def parameter_shapes(model: ModelSpec) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every parameter, in `MoeTransformer.parameters()` order."""
    d = model.dim
    shapes = [(f"{EMBEDDING}.weight", (model.vocab_size, d))]
    for i in range(model.n_layers):
        block = [("attention_norm.weight", (d,)), *attention_shapes(model),
                 ("ffn_norm.weight", (d,)), *ffn_shapes(model, i)]
        shapes += [(f"layers.{i}.{name}", shape) for name, shape in block]
    shapes.append((f"{FINAL_NORM}.weight", (d,)))
    if not model.tie_embeddings:
        shapes.append((f"{HEAD}.weight", (model.vocab_size, d)))
    return tuple(shapes)


def active_share(model: ModelSpec, block_path: str | None) -> float:
    """The share of a parameter one token uses: top_k / num_experts for the routed experts'
    weights, 1 for everything else (embedding and head included)."""
    if block_path in EXPERT_WEIGHTS:
        return model.moe.top_k / model.moe.num_experts
    return 1.0
