"""A Hugging Face model folder, read as plain JSON: its config.json as meshrun's model knobs.

`model=hf model.path=<dir>` takes the model's shape from here, and `checkpoint.load_from=<dir>`
checks the run's shape against it, without importing torch or transformers. The model family
whose `hf_architectures` name config.json's class reads it (training/models/: for Llama,
LlamaForCausalLM and Qwen2ForCausalLM) and sets `model.family`; anything the family would
compute differently is a problem, never a silent approximation; a value of the wrong type or
range, or a missing key, is a problem naming the key (training/models/config_json.py). The
weights (`model.safetensors`, or shards listed by `model.safetensors.index.json`) are checked
torch-free against the resolved shape by conf/hf_weights.py before launch.
"""
from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from pathlib import Path

from conf.errors import ProblemList
from conf.hf_weights import SAFETENSORS_FILE, SAFETENSORS_INDEX, add_weight_problems
from training.models import family_for_architecture, hf_architectures, model_family

CONFIG_FILE = "config.json"

SHAPE_KNOBS = ("family", "n_layers", "dim", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size",
               "rope_theta", "tie_embeddings", "norm_eps", "attention_bias", "rope_scaling",
               "rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor",
               "rope_original_max_seq_len")
"""Model knobs a checkpoint's weights or logits depend on (max_seq_len and init_std do not)."""
USER_WINS = ("max_seq_len", "init_std")
"""Knobs config.json only proposes: an explicit `model.<knob>=` override replaces its value (the
weights and logits do not depend on them). An explicit shape knob must agree with config.json."""


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
    fix = (f"pass a Hugging Face {' or '.join(hf_architectures())} folder "
           f"(save_pretrained)")
    if not is_hf_model_dir(folder):
        problems.add(key, path, f"is not a Hugging Face model folder (needs {CONFIG_FILE} and "
                     f"{SAFETENSORS_FILE} or {SAFETENSORS_INDEX})", fix)
        return None
    hf, unreadable = _read_json(folder / CONFIG_FILE)
    if hf is None:
        problems.add(key, path, f"{folder / CONFIG_FILE} {unreadable}", fix)
        return None
    knobs, refusals = _knobs(hf)
    for rule in refusals:
        problems.add(key, path, f"{folder / CONFIG_FILE}: {rule}", fix)
    return None if refusals else knobs


def _read_json(path: Path) -> tuple[dict | None, str]:
    """(the JSON object in `path`, "") or (None, why it is not one)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        return None, f"cannot be read ({err.strerror or err})"
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, f"is not UTF-8 JSON ({err})"
    if not isinstance(data, dict):
        return None, f"holds a JSON {type(data).__name__}, not an object of model settings"
    return data, ""


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
                         f"conflicts with {name}={_shown(from_file)} ({_hf_key(name, knobs)} in "
                         f"{Path(path) / CONFIG_FILE}): with model.path the shape comes from "
                         f"that file",
                         f"drop model.{name}= or set it to {_shown(from_file)}; for another "
                         f"shape, use a model group without model.path")
    return out


def _shown(value: object) -> object:
    return str(value).lower() if isinstance(value, bool) else getattr(value, "value", value)


def _hf_key(name: str, knobs: dict[str, object]) -> str:
    """The config.json key a knob comes from, for messages."""
    return "architectures" if name == "family" else model_family(knobs["family"]).hf_key(name)


def _knobs(hf: dict) -> tuple[dict[str, object], list[str]]:
    """The knobs of the family whose class config.json names (its `family` among them)."""
    arch = hf.get("architectures")
    if not isinstance(arch, list) or not arch or not all(isinstance(a, str) for a in arch):
        return {}, [f"architectures={json.dumps(arch)[:60]}: must be a list naming the model "
                    f"class ({', '.join(hf_architectures())})"]
    family = family_for_architecture(arch[0])
    if family is None:
        return {}, [f"architectures={arch[0]} is not supported (meshrun models "
                    f"{', '.join(hf_architectures())})"]
    knobs, refusals = family.read_hf_config(hf)
    return {"family": family.name, **knobs}, refusals


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


def check_start_weights(load_from: str, model: object, problems: ProblemList) -> None:
    """The safetensors the run starts from (checkpoint.load_from's Hugging Face folder, else
    model.path; training/hf_import.py `hf_start_dir` picks the same), checked torch-free
    against the resolved model, unless the shape itself already has a problem."""
    if load_from and not is_hf_model_dir(load_from):
        return  # a meshrun checkpoint (or nothing loadable: checkpoint_rules says so)
    key, folder = ("checkpoint.load_from", load_from) if load_from else ("model.path",
                                                                         model.path)
    if folder and not any(p.key == key or p.key.startswith("model.") for p in problems.items):
        add_weight_problems(str(Path(folder).expanduser()), model, key=key, problems=problems)
