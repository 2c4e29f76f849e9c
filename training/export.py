"""Export weights as a Hugging Face `LlamaForCausalLM` folder (model.safetensors + config.json).

Our RoPE uses Hugging Face's rotate_half layout, so q/k weights are written as they are; the only
translation is the name table below.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from conf.spec import ModelSpec

# Our state-dict name -> Hugging Face Llama name; "{i}" is the block index.
HF_NAMES: dict[str, str] = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "layers.{i}.attention_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "layers.{i}.attention.wq.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "layers.{i}.attention.wk.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "layers.{i}.attention.wv.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "layers.{i}.attention.wo.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "layers.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "layers.{i}.feed_forward.w1.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "layers.{i}.feed_forward.w3.weight": "model.layers.{i}.mlp.up_proj.weight",
    "layers.{i}.feed_forward.w2.weight": "model.layers.{i}.mlp.down_proj.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def hf_name(name: str) -> str:
    """Map one of our state-dict keys to its Hugging Face name (KeyError if unknown)."""
    match = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    if match is None:
        return HF_NAMES[name]
    index, rest = match.groups()
    return HF_NAMES["layers.{i}." + rest].format(i=index)


def hf_state_dict(state_dict: dict[str, torch.Tensor], model: ModelSpec) -> dict[str, torch.Tensor]:
    """Rename to Hugging Face keys; contiguous CPU tensors, no two sharing storage."""
    expected = _expected_keys(model)
    missing = sorted(expected - state_dict.keys())
    unknown = sorted(state_dict.keys() - expected - {"output.weight"})
    assert not missing and not unknown, f"state dict mismatch: missing {missing}, unknown {unknown}"
    renamed: dict[str, torch.Tensor] = {}
    seen_storages: set[int] = set()
    for name in sorted(expected):
        tensor = state_dict[name].detach().to("cpu")
        storage = tensor.untyped_storage().data_ptr()
        # safetensors refuses tensors that share memory (tied or views of one buffer): copy those.
        tensor = tensor.clone() if storage in seen_storages else tensor.contiguous()
        seen_storages.add(storage)
        renamed[hf_name(name)] = tensor
    return renamed


def hf_config(model: ModelSpec, *, dtype: torch.dtype) -> dict:
    """The config.json of a `LlamaForCausalLM` with this shape."""
    dtype_name = _DTYPE_NAMES[dtype]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": model.dim,
        "intermediate_size": model.ffn_dim,
        "num_hidden_layers": model.n_layers,
        "num_attention_heads": model.n_heads,
        "num_key_value_heads": model.n_kv_heads,
        "head_dim": model.head_dim,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.max_seq_len,
        "rope_theta": model.rope_theta,
        # transformers >= 5 reads RoPE settings from here; older versions read rope_theta above.
        "rope_parameters": {"rope_type": "default", "rope_theta": model.rope_theta},
        "rms_norm_eps": model.norm_eps,
        "tie_word_embeddings": model.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": model.init_std,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
        "use_cache": True,
    }


def export_hf(state_dict: dict[str, torch.Tensor], model: ModelSpec, out_dir: Path) -> Path:
    """Write out_dir/model.safetensors and out_dir/config.json; return out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = hf_state_dict(state_dict, model)
    dtype = tensors["model.embed_tokens.weight"].dtype
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = hf_config(model, dtype=dtype)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("model.safetensors", "config.json"):
        make_shareable(out_dir / name)
    return out_dir


def make_shareable(path: Path) -> None:
    """Give `path` the mode a plain new file gets (0644 under the usual umask 022).

    safetensors writes 0600 (it saves through a private temporary file), so an exported model
    would be unreadable to the teammates and inference jobs it is exported for."""
    path.chmod(0o666 & ~current_umask())


def current_umask() -> int:
    """This process's umask, read without changing it (Linux), else set and restored at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _expected_keys(model: ModelSpec) -> set[str]:
    keys = {"tok_embeddings.weight", "norm.weight"}
    if not model.tie_embeddings:
        keys.add("output.weight")
    for index in range(model.n_layers):
        keys.update(name.format(i=index) for name in HF_NAMES if name.startswith("layers."))
    return keys


def gather_full_state(model) -> dict[str, torch.Tensor] | None:
    """Collective over every rank: the full, unsharded weights by name on rank 0 (CPU), None
    elsewhere. DTensor shards (FSDP, TP) are gathered within each stage; pipeline stages are
    then gathered to rank 0. Holds the whole model in rank 0's CPU memory."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True)
    state = {}
    for part in model.parts:
        for name, tensor in get_model_state_dict(part, options=options).items():
            state[name] = tensor.detach().cpu()
    pp_group = model.group("pp")
    if pp_group is None:
        return state if model.rank == 0 else None
    stages = [None] * model.dims.pp if model.coords["pp"] == 0 else None
    dist.gather_object(state, stages, group=pp_group, group_dst=0)
    if model.rank != 0:
        return None
    return {name: tensor for stage in stages for name, tensor in stage.items()}
