"""A Hugging Face model folder, read as plain JSON: its config.json as meshrun's model knobs.

`model=hf model.path=<dir>` takes the model's shape from here, and `checkpoint.load_from=<dir>`
checks the run's shape against it, without importing torch or transformers. Supported:
LlamaForCausalLM (RoPE scaling none or llama3) and Qwen2ForCausalLM (q/k/v biases, no sliding
window). Anything meshrun's model would compute differently is a problem, never a silent
approximation. The weights (training/hf_import.py) are `model.safetensors`, or shards listed by
`model.safetensors.index.json`.
"""
from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from pathlib import Path

from conf.errors import ProblemList

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
"""The Hugging Face classes meshrun's Transformer computes exactly."""
ROPE_TYPES = ("default", "llama3")

SHAPE_KNOBS = ("n_layers", "dim", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size",
               "rope_theta", "tie_embeddings", "norm_eps", "attention_bias", "rope_scaling",
               "rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor",
               "rope_original_max_seq_len")
"""Model knobs a checkpoint's weights or logits depend on (max_seq_len and init_std do not)."""
USER_WINS = ("max_seq_len", "init_std")
"""Knobs config.json only proposes: an explicit `model.<knob>=` override replaces its value (the
weights and logits do not depend on them). An explicit shape knob must agree with config.json."""

_HF_KEYS = {"n_layers": "num_hidden_layers", "dim": "hidden_size",
            "n_heads": "num_attention_heads", "ffn_dim": "intermediate_size",
            "vocab_size": "vocab_size", "max_seq_len": "max_position_embeddings"}
_LLAMA3_KEYS = {"rope_scaling_factor": "factor", "rope_low_freq_factor": "low_freq_factor",
                "rope_high_freq_factor": "high_freq_factor",
                "rope_original_max_seq_len": "original_max_position_embeddings"}


def is_hf_model_dir(path: str | Path) -> bool:
    """A folder holding config.json and safetensors weights (one file or an index)."""
    p = Path(path).expanduser()
    return (p / CONFIG_FILE).is_file() and any(
        (p / name).is_file() for name in (SAFETENSORS_FILE, SAFETENSORS_INDEX))


def read_hf_model_config(path: str | Path, *, key: str,
                         problems: ProblemList) -> dict[str, object] | None:
    """ModelConfig knob -> value from `path`/config.json; None (with problems added under
    `key`) when the folder is not a supported Hugging Face model."""
    folder = Path(path).expanduser()
    fix = "pass a Hugging Face LlamaForCausalLM or Qwen2ForCausalLM folder (save_pretrained)"
    if not is_hf_model_dir(folder):
        problems.add(key, path, f"is not a Hugging Face model folder (needs {CONFIG_FILE} and "
                     f"{SAFETENSORS_FILE} or {SAFETENSORS_INDEX})", fix)
        return None
    try:
        hf = json.loads((folder / CONFIG_FILE).read_text())
        knobs, refusals = _knobs(hf)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        problems.add(key, path, f"{CONFIG_FILE} is not a readable model config ({err!r})", fix)
        return None
    for rule in refusals:
        problems.add(key, path, f"{CONFIG_FILE}: {rule}", fix)
    return None if refusals else knobs


def explicit_model_keys(overrides: Iterable[str]) -> frozenset[str]:
    """The `model.<knob>` keys that command-line overrides (`key=v`, `+key=v`, `++key=v`) set."""
    from conf.compose import try_parse_override

    parsed = (try_parse_override(line)[0] for line in overrides)
    return frozenset(p.key for p in parsed
                     if p is not None and p.key.startswith("model.") and not p.is_delete)


def apply_explicit(knobs: dict[str, object], *, model: object, explicit: Collection[str],
                   path: str, problems: ProblemList) -> dict[str, object]:
    """config.json's `knobs`, less the USER_WINS knobs the user set explicitly (`explicit`:
    keys such as "model.n_layers"); an explicit shape knob that differs from config.json is a
    problem naming both values, never silently replaced."""
    out = dict(knobs)
    for name, from_file in knobs.items():
        if f"model.{name}" not in explicit:
            continue
        if name in USER_WINS:
            del out[name]
            continue
        given = getattr(model, name)
        if name == "n_kv_heads" and given == -1:  # -1 = n_heads (of config.json here)
            given = knobs["n_heads"]
        if given != from_file:
            problems.add(f"model.{name}", _shown(given),
                         f"conflicts with {name}={_shown(from_file)} ({_hf_key(name)} in "
                         f"{Path(path) / CONFIG_FILE}): with model.path the shape comes from "
                         f"that file",
                         f"drop model.{name}= or set it to {_shown(from_file)}; for another "
                         f"shape, use a model group without model.path")
    return out


def _shown(value: object) -> object:
    return str(value).lower() if isinstance(value, bool) else getattr(value, "value", value)


def _hf_key(name: str) -> str:
    """The config.json key a knob comes from, for messages."""
    keys = {**_HF_KEYS, **{k: f"rope_scaling.{v}" for k, v in _LLAMA3_KEYS.items()},
            "n_kv_heads": "num_key_value_heads", "norm_eps": "rms_norm_eps",
            "tie_embeddings": "tie_word_embeddings", "rope_theta": "rope_theta",
            "rope_scaling": "rope_scaling.rope_type", "attention_bias": "architectures"}
    return keys.get(name, name)


def _knobs(hf: dict) -> tuple[dict[str, object], list[str]]:
    arch = (hf.get("architectures") or ["?"])[0]
    if arch not in ARCHITECTURES:
        return {}, [f"architectures={arch} is not supported (meshrun models "
                    f"{', '.join(ARCHITECTURES)})"]
    knobs: dict[str, object] = {name: int(hf[hf_key]) for name, hf_key in _HF_KEYS.items()}
    knobs["n_kv_heads"] = int(hf.get("num_key_value_heads") or knobs["n_heads"])
    knobs["norm_eps"] = float(hf.get("rms_norm_eps", 1e-6))
    knobs["tie_embeddings"] = bool(hf.get("tie_word_embeddings", False))
    knobs["init_std"] = float(hf.get("initializer_range", 0.02))
    knobs["attention_bias"] = arch == "Qwen2ForCausalLM"
    refusals = _unmodelled(hf, arch, knobs)
    rope, rope_refusals = _rope(hf)
    return {**knobs, **rope}, refusals + rope_refusals


def _unmodelled(hf: dict, arch: str, knobs: dict) -> list[str]:
    """The config.json settings meshrun's model does not compute."""
    out = []
    if hf.get("hidden_act", "silu") != "silu":
        out.append(f"hidden_act={hf['hidden_act']} is not modelled (SwiGLU uses silu)")
    if arch == "LlamaForCausalLM" and hf.get("attention_bias"):
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


def check_hf_load_from(path: str, model: object, problems: ProblemList) -> None:
    """checkpoint.load_from=<Hugging Face folder>: its shape must be the run's (model spec)."""
    knobs = read_hf_model_config(path, key="checkpoint.load_from", problems=problems)
    if knobs is None:
        return
    differ = [f"{name}={knobs[name]} (the run has model.{name}={getattr(model, name)})"
              for name in SHAPE_KNOBS if name in knobs and knobs[name] != getattr(model, name)]
    if differ:
        problems.add("checkpoint.load_from", path,
                     f"its {CONFIG_FILE} describes another model: {'; '.join(differ)}",
                     f"use model=hf model.path={path} to take its shape")
