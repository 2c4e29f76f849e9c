"""Export weights as a Hugging Face folder (model.safetensors, config.json,
generation_config.json) of the class the model family writes (Llama: `LlamaForCausalLM`, or
`Qwen2ForCausalLM` when the model has q/k/v biases), plus the run's tokenizer files when it has
a tokenizer, so `AutoTokenizer` and `AutoModelForCausalLM` load it.

Weights are written as they are; the only translation is the family's name table
(`ModelFamily.hf_names`, read in reverse by the import, training/hf_import.py), and config.json
is the family's `write_hf_config` (which conf/hf_model_config.py reads back through the same
family's `read_hf_config`). Every file gets the mode a plain new file gets (0644 under umask 022).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from conf.run_dir.disk_space import disk_full_line
from conf.run_dir.export_dirs import (EXPORT_CONFIG, EXPORT_WEIGHTS, export_replaced_dir,
                                      export_tmp_dir)
from conf.spec import ModelSpec
from conf.data_contract.tokenizer_info import (TIKTOKEN_MODEL, TOKENIZER_FILE, TokenizerInfo,
                                               read_tokenizer_info)
from parallel.cost.params import parameter_shapes
from training.durable_files import fsync_path
from training.models import family_of
from training.models.hf_names import hf_name, hf_tensors, meshrun_name

__all__ = ["export_hf", "hf_name", "meshrun_name", "gather_full_state"]

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def hf_state_dict(state_dict: dict[str, torch.Tensor], model: ModelSpec) -> dict[str, torch.Tensor]:
    """Rename to Hugging Face keys; contiguous CPU tensors, no two sharing storage."""
    expected, family = _expected_keys(model), family_of(model)
    missing = sorted(expected - state_dict.keys())
    unknown = sorted(state_dict.keys() - expected - {f"{family.head}.weight"})
    assert not missing and not unknown, f"state dict mismatch: missing {missing}, unknown {unknown}"
    renamed: dict[str, torch.Tensor] = {}
    seen_storages: set[int] = set()
    for name in sorted(expected):
        tensor = state_dict[name].detach().to("cpu")
        storage = tensor.untyped_storage().data_ptr()
        # safetensors refuses tensors that share memory (tied or views of one buffer): copy those.
        tensor = tensor.clone() if storage in seen_storages else tensor.contiguous()
        seen_storages.add(storage)
        for hf, expert in hf_tensors(name, tuple(tensor.shape), family):
            renamed[hf] = tensor if expert is None else tensor[expert].clone()
    return renamed


def hf_config(model: ModelSpec, *, dtype: torch.dtype,
              tokenizer: TokenizerInfo | None = None) -> dict:
    """The config.json of the model family's Hugging Face class with this shape, and the
    tokenizer's special-token ids when there is one."""
    config = family_of(model).write_hf_config(model, _DTYPE_NAMES[dtype])
    return {**config, **special_token_ids(tokenizer)}


def special_token_ids(tokenizer: TokenizerInfo | None) -> dict:
    """bos/eos/pad_token_id as Hugging Face configs name them (those the tokenizer has)."""
    if tokenizer is None:
        return {}
    ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id,
           "pad_token_id": tokenizer.pad_id}
    return {key: value for key, value in ids.items() if value is not None}


def export_hf(state_dict: dict[str, torch.Tensor], model: ModelSpec, out_dir: Path, *,
              tokenizer: str = "") -> Path:
    """Write out_dir/model.safetensors, config.json and, with a tokenizer (`tokenizer`, else
    one in model.path), generation_config.json and the tokenizer files; return out_dir.

    Atomic (conf.run_dir.export_dirs): written into `<out_dir>.tmp`, fsynced, renamed; an
    earlier export is replaced only once the new one is whole. A full disk raises OSError
    with one line naming the path and the free space, and leaves no partial folder."""
    out_dir = Path(out_dir)
    tmp = export_tmp_dir(out_dir)
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a killed export
    try:
        tmp.mkdir()  # never parents: a removed run dir is not recreated
        _write_export(state_dict, model, tmp, tokenizer=tokenizer)
    except Exception as exc:  # safetensors raises its own error type for ENOSPC
        shutil.rmtree(tmp, ignore_errors=True)
        line = disk_full_line(exc, tmp)
        if line is None:
            raise
        raise OSError(errno.ENOSPC, line) from None
    _publish_export(tmp, out_dir)
    return out_dir


def _write_export(state_dict: dict[str, torch.Tensor], model: ModelSpec, out_dir: Path, *,
                  tokenizer: str) -> None:
    tensors = hf_state_dict(state_dict, model)
    dtype = state_dict[family_of(model).embedding_param].dtype
    info = export_tokenizer(tokenizer or _model_dir_tokenizer(model), out_dir)
    config = hf_config(model, dtype=dtype, tokenizer=info)
    if info is not None:
        config = family_of(model).hf_config_for_tokenizer(config, _tokenizer_json(out_dir))
    for name, shape in family_of(model).hf_zero_tensors(model, config).items():
        tensors[name] = torch.zeros(shape, dtype=dtype)
    save_file(tensors, str(out_dir / EXPORT_WEIGHTS), metadata={"format": "pt"})
    written = {EXPORT_CONFIG: config}
    if special_token_ids(info):
        written["generation_config.json"] = {**special_token_ids(info),
                                             "_from_model_config": True}
    for name, content in written.items():
        (out_dir / name).write_text(json.dumps(content, indent=2) + "\n")
    for path in out_dir.iterdir():
        if path.is_file():
            make_shareable(path)
            fsync_path(path)


def _publish_export(tmp: Path, out_dir: Path) -> None:
    """`tmp` -> `out_dir` by rename; an existing export goes to `.old` first, then away."""
    replaced = export_replaced_dir(out_dir)
    if out_dir.exists():
        shutil.rmtree(replaced, ignore_errors=True)
        os.replace(out_dir, replaced)
    os.replace(tmp, out_dir)
    fsync_path(out_dir.parent)
    shutil.rmtree(replaced, ignore_errors=True)


def _tokenizer_json(out_dir: Path) -> dict | None:
    """The exported tokenizer.json (None: the tokenizer is a tiktoken file)."""
    path = out_dir / TOKENIZER_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _model_dir_tokenizer(model: ModelSpec) -> str:
    """The tokenizer.json of the Hugging Face folder the model came from, if it has one."""
    if model.path and (Path(model.path) / TOKENIZER_FILE).is_file():
        return model.path
    return ""


def export_tokenizer(tokenizer: str, out_dir: Path) -> TokenizerInfo | None:
    """Copy the tokenizer file (tokenizer.json, or a tiktoken rank file as tokenizer.model,
    which transformers converts on load) and write tokenizer_config.json (the source's,
    completed) and special_tokens_map.json next to the weights; None when the run has none."""
    if not tokenizer:
        return None
    info = read_tokenizer_info(tokenizer)
    source = Path(info.path)
    config_path = source.parent / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    if info.kind == "tiktoken":
        (out_dir / TIKTOKEN_MODEL).write_bytes(source.read_bytes())
        first = info.vocab_size - len(info.specials)
        by_id = {first + i: name for i, name in enumerate(info.specials)}
        config.setdefault("extra_special_tokens", list(info.specials))  # ids first, first+1...
    else:
        (out_dir / TOKENIZER_FILE).write_bytes(source.read_bytes())
        by_id = _names_by_id(json.loads(source.read_text()))
        # tokenizer.json is what the run trained with: a model-specific class (LlamaTokenizer,
        # Qwen2Tokenizer) would rebuild the pipeline its own way and change the ids.
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    ids = {"bos_token": info.bos_id, "eos_token": info.eos_id, "pad_token": info.pad_id}
    names = {key: by_id[i] for key, i in ids.items() if i is not None and i in by_id}
    for key, name in names.items():
        config.setdefault(key, name)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(names, indent=2) + "\n")
    return info


def _names_by_id(data: dict) -> dict[int, str]:
    """id -> token text over a tokenizer.json's vocab and added tokens."""
    vocab = data["model"].get("vocab")
    by_id = {int(i): str(token) for token, i in vocab.items()} if isinstance(vocab, dict) else {}
    by_id.update({int(t["id"]): t["content"] for t in data.get("added_tokens") or []})
    return by_id


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
    return {name for name, _ in parameter_shapes(model)}


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
