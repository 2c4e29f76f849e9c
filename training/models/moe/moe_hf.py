"""The MoE families as Hugging Face sees them: Qwen3-MoE and Mixtral names, config.json read
and write, and what the export cannot express. Torch-free.

Our stacked expert weights [E, ...] are E per-expert tensors there ("{e}" in a name, see
training/models/hf_names.py). Qwen3-MoE: softmax router, top-k renormalised when
norm_topk_prob, q/k norms, head_dim apart from hidden_size, dense blocks listed in
mlp_only_layers. Mixtral: softmax router, top-k always renormalised, no q/k norms.
transformers trains with the balancing loss only when output_router_logits is true: the
import sets model.moe.aux_loss_coef to router_aux_loss_coef then, else 0.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from conf.choices import RouterScore
from training.models.config_json import ConfigFields
from training.models.llama import hf as llama_hf

if TYPE_CHECKING:
    from conf.spec import ModelSpec

QWEN3_MOE, MIXTRAL = "Qwen3MoeForCausalLM", "MixtralForCausalLM"
_ATTENTION = {name: hf for name, hf in llama_hf.HF_NAMES.items()
              if ".feed_forward." not in name}
_DENSE_MLP = {name: hf for name, hf in llama_hf.HF_NAMES.items() if ".feed_forward." in name}

QWEN3_NAMES: dict[str, str] = {
    **_ATTENTION, **_DENSE_MLP,
    "layers.{i}.attention.q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "layers.{i}.attention.k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "layers.{i}.moe.router.weight": "model.layers.{i}.mlp.gate.weight",
    "layers.{i}.moe.experts.w1": "model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
    "layers.{i}.moe.experts.w3": "model.layers.{i}.mlp.experts.{e}.up_proj.weight",
    "layers.{i}.moe.experts.w2": "model.layers.{i}.mlp.experts.{e}.down_proj.weight",
    "layers.{i}.moe.shared_experts.w1.weight": "model.layers.{i}.mlp.shared_experts.gate_proj.weight",
    "layers.{i}.moe.shared_experts.w3.weight": "model.layers.{i}.mlp.shared_experts.up_proj.weight",
    "layers.{i}.moe.shared_experts.w2.weight": "model.layers.{i}.mlp.shared_experts.down_proj.weight",
}
"""Our name -> Qwen3-MoE's (shared experts: DeepSeek-V3's names, for checkpoints only)."""

MIXTRAL_NAMES: dict[str, str] = {
    **_ATTENTION,
    "layers.{i}.moe.router.weight": "model.layers.{i}.block_sparse_moe.gate.weight",
    "layers.{i}.moe.experts.w1": "model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight",
    "layers.{i}.moe.experts.w3": "model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight",
    "layers.{i}.moe.experts.w2": "model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight",
}

_MOE_KEYS = {"num_experts": "num_experts", "top_k": "num_experts_per_tok",
             "expert_ffn_dim": "moe_intermediate_size", "renormalize": "norm_topk_prob",
             "first_dense_layers": "mlp_only_layers", "aux_loss_coef": "router_aux_loss_coef"}


def hf_key(name: str) -> str:
    keys = {"qk_norm": "architectures", "head_dim": "head_dim",
            **{f"moe.{k}": v for k, v in _MOE_KEYS.items()}}
    return keys.get(name, llama_hf.hf_key(name))


def read_qwen3_config(hf: dict) -> tuple[dict[str, object], list[str]]:
    knobs, refusals = _dense_knobs(hf)
    fields = ConfigFields(hf, refusals=refusals)
    n_layers = knobs["n_layers"]
    dense = fields.get("mlp_only_layers", [])
    first_dense = len(dense) if isinstance(dense, list) else 0
    if not isinstance(dense, list) or dense != list(range(first_dense)):
        fields.refuse("mlp_only_layers", dense, "must be the first blocks (0, 1, ...)")
    if fields.get("decoder_sparse_step", 1) != 1:
        fields.refuse("decoder_sparse_step", fields.get("decoder_sparse_step"),
                      "is not modelled (every block after the dense ones has experts)")
    experts_key = "num_experts" if "num_experts" in hf else "num_local_experts"  # transformers 5
    moe = {"num_experts": fields.size(experts_key),
           "top_k": fields.size("num_experts_per_tok"),
           "expert_ffn_dim": fields.size("moe_intermediate_size"),
           "renormalize": fields.flag("norm_topk_prob", False),
           "first_dense_layers": min(first_dense, n_layers - 1)}
    knobs.update(qk_norm=True, head_dim=fields.size("head_dim", knobs["dim"] // knobs["n_heads"]),
                 moe=_with_losses(moe, fields))
    return knobs, fields.refusals


def read_mixtral_config(hf: dict) -> tuple[dict[str, object], list[str]]:
    knobs, refusals = _dense_knobs(hf)
    fields = ConfigFields(hf, refusals=refusals)
    if fields.number("router_jitter_noise", 0.0, positive=False) != 0:
        fields.refuse("router_jitter_noise", fields.get("router_jitter_noise"),
                      "is not modelled (deterministic routing)")
    moe = {"num_experts": fields.size("num_local_experts"),
           "top_k": fields.size("num_experts_per_tok"), "renormalize": True,
           "expert_ffn_dim": knobs["ffn_dim"], "first_dense_layers": 0}
    knobs.update(moe=_with_losses(moe, fields))
    return knobs, fields.refusals


def _dense_knobs(hf: dict) -> tuple[dict[str, object], list[str]]:
    """The attention, norm, RoPE and vocabulary knobs, read as the Llama family reads them
    (head_dim apart from hidden_size is allowed here)."""
    config = {key: value for key, value in hf.items()
              if key not in ("head_dim", "use_sliding_window", "intermediate_size")}
    config.setdefault("intermediate_size", hf.get("intermediate_size", 1))
    config["architectures"] = [llama_hf.LLAMA]
    knobs, refusals = llama_hf.read_hf_config(config)
    if hf.get("use_sliding_window"):
        refusals.append("use_sliding_window=true: is not modelled (full causal attention only)")
    if hf.get("attention_bias"):
        refusals.append("attention_bias=true: is not modelled by the MoE families")
    knobs["attention_bias"] = False
    return knobs, refusals


def _with_losses(moe: dict, fields: ConfigFields) -> dict:
    coef = fields.number("router_aux_loss_coef", 0.001, positive=False)
    trains_with_it = fields.flag("output_router_logits", False)
    return {**moe, "score": "softmax", "aux_loss_coef": coef if trains_with_it else 0.0,
            "z_loss_coef": 0.0, "num_shared_experts": 0, "capacity_factor": None}


def export_refusals(model: ModelSpec, *, family: str) -> list[tuple[str, object, str]]:
    """(key, value, why) for each setting the family's Hugging Face class cannot express."""
    moe, out = model.moe, []
    if moe.score is not RouterScore.softmax:
        out.append(("model.moe.score", moe.score.value, "a sigmoid router is not computed"))
    if moe.num_shared_experts:
        out.append(("model.moe.num_shared_experts", moe.num_shared_experts,
                    "shared experts are not computed"))
    if moe.route_scale != 1:
        out.append(("model.moe.route_scale", moe.route_scale, "is not computed"))
    if model.attention_bias:
        out.append(("model.attention_bias", True, "q/k/v biases are not computed"))
    if family == "mixtral":
        out += [(f"model.{key}", value, "is not computed by Mixtral") for key, value, bad in (
            ("qk_norm", model.qk_norm, model.qk_norm),
            ("moe.first_dense_layers", moe.first_dense_layers, moe.first_dense_layers > 0),
            ("moe.renormalize", moe.renormalize, not moe.renormalize),
            ("moe.expert_ffn_dim", model.expert_ffn_dim, model.expert_ffn_dim != model.ffn_dim))
            if bad]
    elif not model.qk_norm:
        out.append(("model.qk_norm", False, "Qwen3-MoE always has q/k norms"))
    return out


def write_qwen3_config(model: ModelSpec, dtype_name: str) -> dict:
    config = _dense_config(model, dtype_name)
    moe = model.moe
    return {**config, "architectures": [QWEN3_MOE], "model_type": "qwen3_moe",
            "head_dim": model.head_dim, "num_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k, "moe_intermediate_size": model.expert_ffn_dim,
            "norm_topk_prob": moe.renormalize, "decoder_sparse_step": 1,
            "mlp_only_layers": list(range(moe.first_dense_layers)),
            "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
            **_loss_config(model)}


def write_mixtral_config(model: ModelSpec, dtype_name: str) -> dict:
    config = _dense_config(model, dtype_name)
    return {**config, "architectures": [MIXTRAL], "model_type": "mixtral",
            "num_local_experts": model.moe.num_experts,
            "num_experts_per_tok": model.moe.top_k, "router_jitter_noise": 0.0,
            "sliding_window": None, **_loss_config(model)}


def _dense_config(model: ModelSpec, dtype_name: str) -> dict:
    config = llama_hf.write_hf_config(model, dtype_name)
    for key in ("attention_bias", "mlp_bias"):
        config.pop(key, None)
    return config


def _loss_config(model: ModelSpec) -> dict:
    coef = model.moe.aux_loss_coef
    return {"router_aux_loss_coef": coef or 0.001, "output_router_logits": coef > 0}
