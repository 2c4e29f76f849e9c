"""A test-only mixture-of-experts family, the smallest that keeps the MoE module contract
expert parallelism reads (parallel/expert_parallel.py): the toy family's GPT-2 blocks
(tests/support/toy_family) with the MLP replaced by `moe`: a bias-free `router` (softmax
top-2 of 4 experts, renormalised, dropless) and `experts`, a GroupedExperts (w1 gate, w3 up
[E, ffn, dim], w2 down [E, dim, ffn], SwiGLU) called on the token copies sorted by expert.
Its auxiliary loss is the router z-loss (a sum over tokens, so every data split of a batch
gives the same total), added to the loss sum. Torch-free: the module is model.py.

Parameter names: the toy family's, with `layers.{i}.mlp.*` replaced by
  layers.{i}.moe.router.weight     [E, dim]
  layers.{i}.moe.experts.w1        [E, ffn, dim]   (and w3)
  layers.{i}.moe.experts.w2        [E, dim, ffn]
"""
from __future__ import annotations

import dataclasses

from conf.choices import RecomputeTarget
from tests.support.toy_family import FAMILY as DENSE
from tests.support.toy_family import check
from training.models.family import ModelFamily, RecomputeSubmodules, TpPlan

NAME = "tests.support.toy_moe_family"
"""This family's `model.family` value."""
N_EXPERTS, TOP_K = 4, 2
Z_LOSS = 1e-2
"""The router z-loss coefficient."""


def parameter_shapes(model) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every parameter, in `ToyMoE.parameters()` order."""
    d, f, e = model.dim, model.ffn_dim, N_EXPERTS
    block = [("ln_1.weight", (d,)), ("ln_1.bias", (d,)),
             ("attn.c_attn.weight", (3 * d, d)), ("attn.c_attn.bias", (3 * d,)),
             ("attn.c_proj.weight", (d, d)), ("attn.c_proj.bias", (d,)),
             ("ln_2.weight", (d,)), ("ln_2.bias", (d,)),
             ("moe.router.weight", (e, d)),
             ("moe.experts.w1", (e, f, d)), ("moe.experts.w2", (e, d, f)),
             ("moe.experts.w3", (e, f, d))]
    shapes = [("wte.weight", (model.vocab_size, d))]
    shapes += [(f"layers.{i}.{name}", shape) for i in range(model.n_layers)
               for name, shape in block]
    shapes += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    if not model.tie_embeddings:
        shapes.append(("lm_head.weight", (model.vocab_size, d)))
    return tuple(shapes)


FAMILY = dataclasses.replace(
    DENSE,
    name="toy_moe",
    module_class="tests.support.toy_moe_family.model:ToyMoE",
    parameter_shapes=parameter_shapes,
    check=check,
    tp=TpPlan(column=("attn.c_attn",), row=("attn.c_proj",), embedding="wte",
              head="lm_head", sequence_norms=("ln_1", "ln_2"), final_norm="ln_f",
              gathered_inputs=("attn",)),
    recompute={
        RecomputeTarget.block: RecomputeSubmodules(submodules=("",)),
        RecomputeTarget.norm: RecomputeSubmodules(submodules=("ln_1", "ln_2")),
    },
    residual_outputs=("c_proj.weight", "experts.w2"),
    experts="moe.experts",
    routed_experts=lambda model: N_EXPERTS,
    routed_per_token=lambda model: TOP_K,
)
assert isinstance(FAMILY, ModelFamily)
