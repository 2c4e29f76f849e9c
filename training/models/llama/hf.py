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

from training.models.config_json import ConfigFields

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
    """config.json (a class this family computes) -> (ModelConfig knobs, refusals: a value of
    the wrong type or range, a missing key, a setting our module does not compute)."""
    fields = ConfigFields(hf)
    arch = hf["architectures"][0]
    knobs: dict[str, object] = {name: fields.size(key) for name, key in _HF_KEYS.items()}
    knobs["n_kv_heads"] = fields.size("num_key_value_heads", knobs["n_heads"])
    knobs["norm_eps"] = fields.number("rms_norm_eps", 1e-6)
    knobs["tie_embeddings"] = fields.flag("tie_word_embeddings", False)
    knobs["init_std"] = fields.number("initializer_range", 0.02, positive=False)
    knobs["attention_bias"] = arch == QWEN2
    _unmodelled(fields, arch, knobs)
    rope = _rope(fields)
    return {**knobs, **rope}, fields.refusals


def _unmodelled(fields: ConfigFields, arch: str, knobs: dict) -> None:
    """Refuse the config.json settings our module does not compute."""
    act = fields.text("hidden_act", "silu")
    if act and act != "silu":
        fields.refuse("hidden_act", act, "is not modelled (SwiGLU uses silu)")
    if arch == LLAMA and fields.flag("attention_bias", False):  # q/k/v biases, o_proj's zero
        knobs["attention_bias"] = True
    if fields.flag("mlp_bias", False):
        fields.refuse("mlp_bias", True, "is not modelled")
    if fields.flag("use_sliding_window", False):
        fields.refuse("use_sliding_window", True, "is not modelled (full causal attention only)")
    if fields.get("head_dim", None) is not None and not {
            "hidden_size", "num_attention_heads"} & fields.bad:
        head_dim = fields.size("head_dim")
        if head_dim * knobs["n_heads"] != knobs["dim"]:
            fields.refuse("head_dim", head_dim,
                          "!= hidden_size/num_attention_heads is not modelled")


def _rope(fields: ConfigFields) -> dict[str, object]:
    """RoPE knobs from `rope_scaling` (transformers < 5) or `rope_parameters` (>= 5)."""
    params = fields.section("rope_parameters")
    scaling = fields.section("rope_scaling")
    merged = ConfigFields({**params.data, **scaling.data}, refusals=fields.refusals,
                          prefix="rope_scaling." if scaling.data else "rope_parameters.")
    theta = (merged.number("rope_theta") if "rope_theta" in merged.data
             else fields.number("rope_theta", 10000.0))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        merged.refuse("rope_type", rope_type, f"is not modelled (supported: "
                      f"{', '.join(ROPE_TYPES)})")
        return {}
    if rope_type == "default":
        return {"rope_theta": theta, "rope_scaling": "none"}
    knobs: dict[str, object] = {"rope_theta": theta, "rope_scaling": "llama3"}
    for name, key in _LLAMA3_KEYS.items():
        knobs[name] = merged.number(key)
    knobs["rope_original_max_seq_len"] = merged.size(_LLAMA3_KEYS["rope_original_max_seq_len"])
    return knobs


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


QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                           r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
"""The pre-tokenizer transformers' Qwen2Tokenizer imposes on every `model_type: qwen2` folder
(one digit per piece), whatever its tokenizer.json or tokenizer_config.json say."""
O_BIAS = "model.layers.{i}.self_attn.o_proj.bias"


def is_qwen2_tokenizer(tokenizer: dict | None) -> bool:
    """Does transformers' Qwen2Tokenizer compute this tokenizer.json as it is (NFC, Qwen2's split
    regex, byte-level BPE)? Anything else would be tokenized differently under model_type qwen2."""
    if not isinstance(tokenizer, dict):
        return False
    pre = tokenizer.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers") or [] if isinstance(pre, dict) else []
    shapes = [(p.get("type"), (p.get("pattern") or {}).get("Regex"), p.get("use_regex"))
              for p in parts if isinstance(p, dict)]
    return (tokenizer.get("normalizer") == {"type": "NFC"}
            and (tokenizer.get("model") or {}).get("type") == "BPE"
            and shapes == [("Split", QWEN2_PRETOKENIZE_REGEX, None), ("ByteLevel", None, False)])


def config_for_tokenizer(config: dict, tokenizer: dict | None) -> dict:
    """A Qwen2-shaped model exported with a tokenizer Qwen2Tokenizer would change becomes a
    `LlamaForCausalLM` with attention_bias (o_proj's bias written as zeros: the same function),
    whose AutoTokenizer reads tokenizer.json as it is."""
    if config.get("model_type") != "qwen2" or is_qwen2_tokenizer(tokenizer):
        return config
    llama = {key: value for key, value in config.items()
             if key not in ("use_sliding_window", "sliding_window", "max_window_layers")}
    return {**llama, "architectures": [LLAMA], "model_type": "llama", "attention_bias": True,
            "mlp_bias": False}


def zero_tensors(model: ModelSpec, config: dict) -> dict[str, tuple[int, ...]]:
    """A Llama config.json with attention_bias holds an o_proj bias per block (all zero)."""
    arch = (config.get("architectures") or [""])[0]
    if arch != LLAMA or config.get("attention_bias") is not True:
        return {}
    return {O_BIAS.format(i=i): (model.dim,) for i in range(model.n_layers)}
