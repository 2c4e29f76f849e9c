"""The Llama family (Llama 3 and Qwen2 dense): its torch-free facts as one `FAMILY`.

The module itself (RMSNorm, RoPE, grouped-query attention, SwiGLU) is model.py, imported only
when a model is built; the parameter table is shapes.py; Hugging Face names and config.json
read and write are hf.py. State-dict keys (see model.py):
  tok_embeddings.weight
  layers.{i}.attention_norm.weight
  layers.{i}.attention.{wq,wk,wv,wo}.weight
  layers.{i}.attention.{wq,wk,wv}.bias          (only with model.attention_bias, as Qwen2)
  layers.{i}.ffn_norm.weight
  layers.{i}.feed_forward.{w1,w2,w3}.weight     (w1 gate, w3 up, w2 down)
  norm.weight
  output.weight                                 (absent when embeddings are tied)
"""
from __future__ import annotations

from conf.choices import RecomputeTarget
from training.models.family import FsdpUnits, ModelFamily, RecomputeSubmodules, TpPlan
from training.models.llama import hf
from training.models.llama.shapes import (ATTENTION, ATTENTION_OUT, DOWN, EMBEDDING,
                                          FEED_FORWARD, FINAL_NORM, GATE_UP, HEAD, NORMS, QKV,
                                          parameter_shapes)


def _check(model, problems) -> None:
    """Refuse the knobs of other families (q/k norms and experts: model.family=moe)."""
    if model.qk_norm:
        problems.add("model.qk_norm", True, "is not computed by model.family=llama",
                     "use model.family=moe (Qwen3 attention), or model.qk_norm=false")


FAMILY = ModelFamily(
    name="llama",
    module_class="training.models.llama.model:Transformer",
    parameter_shapes=parameter_shapes,
    check=_check,
    embedding=EMBEDDING,
    head=HEAD,
    attention=ATTENTION,
    first_stage=(EMBEDDING,),
    last_stage=(FINAL_NORM, HEAD),
    tp=TpPlan(column=(*QKV, *GATE_UP), row=(ATTENTION_OUT, DOWN), embedding=EMBEDDING,
              head=HEAD, sequence_norms=NORMS, final_norm=FINAL_NORM,
              gathered_inputs=(ATTENTION, FEED_FORWARD)),
    # torchtitan's units: the embedding alone; the final norm with the head (tied: with the
    # embedding, one shared weight), never re-sharded after forward.
    fsdp_untied=FsdpUnits(resharded=(EMBEDDING,), gathered=(FINAL_NORM, HEAD)),
    fsdp_tied=FsdpUnits(resharded=(), gathered=(EMBEDDING, FINAL_NORM)),
    recompute={
        RecomputeTarget.block: RecomputeSubmodules(submodules=("",)),
        RecomputeTarget.ffn: RecomputeSubmodules(submodules=(FEED_FORWARD,)),
        RecomputeTarget.swiglu: RecomputeSubmodules(submodules=(FEED_FORWARD,), method="swiglu"),
        RecomputeTarget.attention: RecomputeSubmodules(submodules=(ATTENTION,),
                                                       method="core_attention"),
        RecomputeTarget.norm: RecomputeSubmodules(submodules=NORMS),
    },
    init_ones=("norm.weight",),
    residual_outputs=(f"{ATTENTION_OUT}.weight", f"{DOWN}.weight"),
    hf_architectures=(hf.LLAMA, hf.QWEN2),
    hf_names=hf.HF_NAMES,
    read_hf_config=hf.read_hf_config,
    hf_key=hf.hf_key,
    write_hf_config=hf.write_hf_config,
    hf_config_for_tokenizer=hf.config_for_tokenizer,
    hf_zero_tensors=hf.zero_tensors,
    fixed_matmul_order=True,
)
