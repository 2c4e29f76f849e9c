"""The mixture-of-experts family (Qwen3-MoE, DeepSeek-V3-style blocks; Mixtral's Hugging
Face names are training/models/moe/mixtral_family.py): its torch-free facts as one `FAMILY`.

The module is the package model/ (attention from the Llama family, MoE feed-forward moe_layer.py,
experts grouped_experts.py), imported only when a model is built; the parameter table and
active parameters are moe_shapes.py; Hugging Face names and config.json moe_hf.py.
State-dict keys (block i):
  layers.{i}.attention.{wq,wk,wv,wo}.weight, attention.{q_norm,k_norm}.weight (qk_norm)
  layers.{i}.feed_forward.{w1,w2,w3}.weight     (blocks before moe.first_dense_layers)
  layers.{i}.moe.router.weight                  [E, dim]
  layers.{i}.moe.experts.{w1,w3}                [E, expert_ffn, dim]   (gate, up)
  layers.{i}.moe.experts.w2                     [E, dim, expert_ffn]   (down)
  layers.{i}.moe.shared_experts.{w1,w3,w2}.weight  (moe.num_shared_experts > 0)
  layers.{i}.moe.expert_bias                    [E] buffer (score=sigmoid)
"""
from __future__ import annotations

from conf.choices import RecomputeTarget
from training.models.family import FsdpUnits, ModelFamily, RecomputeSubmodules, TpPlan
from training.models.llama.shapes import ATTENTION_OUT, DOWN, GATE_UP, QKV
from training.models.moe import moe_hf
from training.models.moe.moe_shapes import (ATTENTION, EMBEDDING, FEED_FORWARD, FINAL_NORM,
                                            HEAD, MOE, NORMS, QK_NORMS, active_share,
                                            parameter_shapes)


def _check(model, problems) -> None:
    """Every ModelConfig knob is computed here (model.moe.num_experts=0: every block dense)."""


def moe_family(*, name: str, architecture: str, hf_names: dict, read, write) -> ModelFamily:
    return ModelFamily(
        name=name,
        module_class="training.models.moe.model:MoeTransformer",
        parameter_shapes=parameter_shapes,
        active_share=active_share,
        check=_check,
        embedding=EMBEDDING,
        head=HEAD,
        attention=ATTENTION,
        first_stage=(EMBEDDING,),
        last_stage=(FINAL_NORM, HEAD),
        # Router and experts are whole on every tp rank (expert-tensor-parallel degree 1).
        tp=TpPlan(column=(*QKV, *GATE_UP), row=(ATTENTION_OUT, DOWN), embedding=EMBEDDING,
                  head=HEAD, sequence_norms=NORMS, final_norm=FINAL_NORM,
                  gathered_inputs=(ATTENTION, FEED_FORWARD), head_norms=QK_NORMS,
                  token_local=(MOE,)),
        fsdp_untied=FsdpUnits(resharded=(EMBEDDING,), gathered=(FINAL_NORM, HEAD)),
        fsdp_tied=FsdpUnits(resharded=(), gathered=(EMBEDDING, FINAL_NORM)),
        recompute={
            RecomputeTarget.block: RecomputeSubmodules(submodules=("",)),
            RecomputeTarget.attention: RecomputeSubmodules(submodules=(ATTENTION,),
                                                           method="core_attention"),
            RecomputeTarget.norm: RecomputeSubmodules(submodules=NORMS),
        },
        init_ones=("norm.weight",),
        residual_outputs=(f"{ATTENTION_OUT}.weight", f"{DOWN}.weight", "moe.experts.w2",
                          "moe.shared_experts.w2.weight"),
        hf_architectures=(architecture,),
        hf_names=hf_names,
        read_hf_config=read,
        hf_key=moe_hf.hf_key,
        write_hf_config=write,
        experts="moe.experts",
        routed_experts=lambda model: model.moe.num_experts,
        routed_per_token=lambda model: model.moe.top_k if model.moe.num_experts else 0,
    )


FAMILY = moe_family(name="moe", architecture=moe_hf.QWEN3_MOE, hf_names=moe_hf.QWEN3_NAMES,
                    read=moe_hf.read_qwen3_config, write=moe_hf.write_qwen3_config)
