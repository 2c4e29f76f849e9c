"""A test-only model family that proves the seam (training/models/): a GPT-2-style decoder with
LayerNorm (with biases), one fused q/k/v projection laid out per head, a GELU MLP and no
position embedding (causal attention alone orders the tokens). Torch-free: the module is
model.py. Selected by its import path, `model.family=tests.support.toy_family` (the one
registration line: training/models/__init__.py takes a family's import path as its name).

Parameter names:
  wte.weight
  layers.{i}.ln_1.{weight,bias}
  layers.{i}.attn.c_attn.{weight,bias}     [n_heads * 3 * head_dim, dim]: per head q, k, v
  layers.{i}.attn.c_proj.{weight,bias}
  layers.{i}.ln_2.{weight,bias}
  layers.{i}.mlp.c_fc.{weight,bias}
  layers.{i}.mlp.c_proj.{weight,bias}
  ln_f.{weight,bias}
  lm_head.weight                            (absent when embeddings are tied)
"""
from __future__ import annotations

from conf.choices import RecomputeTarget
from training.models.family import FsdpUnits, ModelFamily, RecomputeSubmodules, TpPlan

NAME = "tests.support.toy_family"
"""This family's `model.family` value."""
_NORMS = ("ln_1", "ln_2")


def parameter_shapes(model) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every parameter, in `ToyGPT.parameters()` order."""
    d, f = model.dim, model.ffn_dim
    block = [("ln_1.weight", (d,)), ("ln_1.bias", (d,)),
             ("attn.c_attn.weight", (3 * d, d)), ("attn.c_attn.bias", (3 * d,)),
             ("attn.c_proj.weight", (d, d)), ("attn.c_proj.bias", (d,)),
             ("ln_2.weight", (d,)), ("ln_2.bias", (d,)),
             ("mlp.c_fc.weight", (f, d)), ("mlp.c_fc.bias", (f,)),
             ("mlp.c_proj.weight", (d, f)), ("mlp.c_proj.bias", (d,))]
    shapes = [("wte.weight", (model.vocab_size, d))]
    shapes += [(f"layers.{i}.{name}", shape) for i in range(model.n_layers)
               for name, shape in block]
    shapes += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    if not model.tie_embeddings:
        shapes.append(("lm_head.weight", (model.vocab_size, d)))
    return tuple(shapes)


def check(model, problems) -> None:
    """The knobs this family does not compute (grouped-query attention, Qwen2 biases, RoPE)."""
    if model.n_kv_heads != model.n_heads:
        problems.add("model.n_kv_heads", model.n_kv_heads, "the toy family has one fused q/k/v "
                     "projection: as many kv heads as heads", "set model.n_kv_heads=-1")
    if model.attention_bias:
        problems.add("model.attention_bias", True, "is Qwen2's knob (the toy family always has "
                     "biases)", "leave model.attention_bias=false")
    if model.rope_scaling != "none":
        problems.add("model.rope_scaling", model.rope_scaling, "the toy family has no RoPE",
                     "leave model.rope_scaling=none")


def _no_hf(*_args):
    raise NotImplementedError("the toy family has no Hugging Face class")


FAMILY = ModelFamily(
    name="toy",
    module_class="tests.support.toy_family.model:ToyGPT",
    parameter_shapes=parameter_shapes,
    check=check,
    embedding="wte",
    head="lm_head",
    attention="attn",
    first_stage=("wte",),
    last_stage=("ln_f", "lm_head"),
    tp=TpPlan(column=("attn.c_attn", "mlp.c_fc"), row=("attn.c_proj", "mlp.c_proj"),
              embedding="wte", head="lm_head", sequence_norms=_NORMS, final_norm="ln_f",
              gathered_inputs=("attn", "mlp")),
    fsdp_untied=FsdpUnits(resharded=("wte",), gathered=("ln_f", "lm_head")),
    fsdp_tied=FsdpUnits(resharded=(), gathered=("wte", "ln_f")),
    recompute={
        RecomputeTarget.block: RecomputeSubmodules(submodules=("",)),
        RecomputeTarget.ffn: RecomputeSubmodules(submodules=("mlp",)),
        RecomputeTarget.attention: RecomputeSubmodules(submodules=("attn",),
                                                       method="core_attention"),
        RecomputeTarget.norm: RecomputeSubmodules(submodules=_NORMS),
    },
    init_ones=("ln_1.weight", "ln_2.weight", "ln_f.weight"),
    residual_outputs=("c_proj.weight",),
    hf_architectures=(),
    hf_names={},
    read_hf_config=_no_hf,
    hf_key=lambda name: name,
    write_hf_config=_no_hf,
)
