"""The Llama family as Hugging Face sees it: parameter names, and config.json read and write.
Torch-free.

`LlamaForCausalLM` (RoPE scaling none or llama3), or `Qwen2ForCausalLM` when the model has q/k/v
biases (no sliding window). Our RoPE uses Hugging Face's rotate_half layout, so q/k weights need
no permutation: the names below are the only translation (training/export.py writes through
them, training/hf_import.py reads through them in reverse). Anything our module would compute
differently from a config.json is a refusal, never a silent approximation.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conf.spec import ModelSpec

LLAMA, QWEN2 = "LlamaForCausalLM", "Qwen2ForCausalLM"
ROPE_TYPES = ("default", "llama3")

HF_NAMES: dict[str, str] = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "layers.{i}.attention_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "layers.{i}.attention.wq.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "layers.{i}.attention.wk.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "layers.{i}.attention.wv.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "layers.{i}.attention.wq.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "layers.{i}.attention.wk.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "layers.{i}.attention.wv.bias": "model.layers.{i}.self_attn.v_proj.bias",
    "layers.{i}.attention.wo.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "layers.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "layers.{i}.feed_forward.w1.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "layers.{i}.feed_forward.w3.weight": "model.layers.{i}.mlp.up_proj.weight",
    "layers.{i}.feed_forward.w2.weight": "model.layers.{i}.mlp.down_proj.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
"""Our state-dict name -> Hugging Face Llama name; "{i}" is the block index."""

_HF_KEYS = {"n_layers": "num_hidden_layers", "dim": "hidden_size",
            "n_heads": "num_attention_heads", "ffn_dim": "intermediate_size",
            "vocab_size": "vocab_size", "max_seq_len": "max_position_embeddings"}
_LLAMA3_KEYS = {"rope_scaling_factor": "factor", "rope_low_freq_factor": "low_freq_factor",
                "rope_high_freq_factor": "high_freq_factor",
                "rope_original_max_seq_len": "original_max_position_embeddings"}


def hf_key(name: str) -> str:
    """The config.json key a knob comes from, for messages."""
    keys = {**_HF_KEYS, **{k: f"rope_scaling.{v}" for k, v in _LLAMA3_KEYS.items()},
            "n_kv_heads": "num_key_value_heads", "norm_eps": "rms_norm_eps",
            "tie_embeddings": "tie_word_embeddings", "rope_theta": "rope_theta",
            "rope_scaling": "rope_scaling.rope_type", "attention_bias": "architectures"}
    return keys.get(name, name)


def read_hf_config(hf: dict) -> tuple[dict[str, object], list[str]]:
    """config.json (a class this family computes) -> (ModelConfig knobs, refusals)."""
    arch = (hf.get("architectures") or ["?"])[0]
    knobs: dict[str, object] = {name: int(hf[hf_key]) for name, hf_key in _HF_KEYS.items()}
    knobs["n_kv_heads"] = int(hf.get("num_key_value_heads") or knobs["n_heads"])
    knobs["norm_eps"] = float(hf.get("rms_norm_eps", 1e-6))
    knobs["tie_embeddings"] = bool(hf.get("tie_word_embeddings", False))
    knobs["init_std"] = float(hf.get("initializer_range", 0.02))
    knobs["attention_bias"] = arch == QWEN2
    refusals = _unmodelled(hf, arch, knobs)
    rope, rope_refusals = _rope(hf)
    return {**knobs, **rope}, refusals + rope_refusals


def _unmodelled(hf: dict, arch: str, knobs: dict) -> list[str]:
    """The config.json settings our module does not compute."""
    out = []
    if hf.get("hidden_act", "silu") != "silu":
        out.append(f"hidden_act={hf['hidden_act']} is not modelled (SwiGLU uses silu)")
    if arch == LLAMA and hf.get("attention_bias"):
        out.append("attention_bias=true (Llama: also an o_proj bias) is not modelled")
    if hf.get("mlp_bias"):
        out.append("mlp_bias=true is not modelled")
    if hf.get("use_sliding_window"):
        out.append("use_sliding_window=true is not modelled (full causal attention only)")
    head_dim = hf.get("head_dim")
    if head_dim is not None and knobs["n_heads"] and head_dim * knobs["n_heads"] != knobs["dim"]:
        out.append(f"head_dim={head_dim} != hidden_size/num_attention_heads is not modelled")
    return out


def _rope(hf: dict) -> tuple[dict[str, object], list[str]]:
    """RoPE knobs from `rope_scaling` (transformers < 5) or `rope_parameters` (>= 5)."""
    params = dict(hf.get("rope_parameters") or {})
    params.update(hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        return {}, [f"rope_type={rope_type} is not modelled (supported: {', '.join(ROPE_TYPES)})"]
    if rope_type == "default":
        return {"rope_theta": theta, "rope_scaling": "none"}, []
    knobs: dict[str, object] = {"rope_theta": theta, "rope_scaling": "llama3"}
    for name, hf_key in _LLAMA3_KEYS.items():
        knobs[name] = float(params[hf_key])
    knobs["rope_original_max_seq_len"] = int(knobs["rope_original_max_seq_len"])
    return knobs, []


def write_hf_config(model: ModelSpec, dtype_name: str) -> dict:
    """The config.json of a `LlamaForCausalLM` (or `Qwen2ForCausalLM`, with q/k/v biases) with
    this shape; what `read_hf_config` reads back as the same knobs."""
    rope = {"rope_type": "default"}
    if model.llama3_rope is not None:
        scaling = model.llama3_rope
        rope = {"rope_type": "llama3", "factor": scaling.factor,
                "low_freq_factor": scaling.low_freq_factor,
                "high_freq_factor": scaling.high_freq_factor,
                "original_max_position_embeddings": scaling.original_max_seq_len}
    return {
        **_architecture(model),
        "hidden_size": model.dim,
        "intermediate_size": model.ffn_dim,
        "num_hidden_layers": model.n_layers,
        "num_attention_heads": model.n_heads,
        "num_key_value_heads": model.n_kv_heads,
        "head_dim": model.head_dim,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.max_seq_len,
        "rope_theta": model.rope_theta,
        # transformers >= 5 reads RoPE settings from rope_parameters; older ones from
        # rope_theta and rope_scaling.
        "rope_parameters": {**rope, "rope_theta": model.rope_theta},
        "rope_scaling": rope if model.llama3_rope is not None else None,
        "rms_norm_eps": model.norm_eps,
        "tie_word_embeddings": model.tie_embeddings,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "initializer_range": model.init_std,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
        "use_cache": True,
    }


def _architecture(model: ModelSpec) -> dict:
    if model.attention_bias:  # Qwen2's attention: q/k/v biases, no o bias
        return {"architectures": [QWEN2], "model_type": "qwen2",
                "use_sliding_window": False, "sliding_window": None,
                "max_window_layers": model.n_layers}
    return {"architectures": [LLAMA], "model_type": "llama",
            "attention_bias": False, "mlp_bias": False}
