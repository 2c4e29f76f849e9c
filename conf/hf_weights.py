"""A Hugging Face folder's weights, checked before launch without torch: every problem the ranks
would meet while loading them is found here, named (file, tensor, rule, fix) and refused (exit 2,
before a run dir exists).

The weights are `model.safetensors`, or the shards `model.safetensors.index.json` lists. The
index must be a JSON object whose `weight_map` maps tensor names to file names inside the folder
(no absolute path, no `..`: a symlinked file, as in the Hugging Face cache, is fine), each an
existing file that holds the tensor. Every file's header is sound (conf/safetensors_header.py).
The tensors are exactly the family's parameter table (training/models/<family>/shapes.py) under
the family's Hugging Face names, with the shapes config.json implies, in a float dtype; a tied
model's `lm_head.weight` may be there too (it is the embedding). The ranks read the same map
(training/hf_import.py `weight_files`) and check again before they read a byte.
"""
from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from conf.errors import ProblemList
from conf.safetensors_header import BadSafetensors, TensorEntry, read_header, tensor_bytes
from training.models import family_of
from training.models.hf_names import hf_name, hf_shapes, meshrun_name

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
WEIGHT_DTYPES = ("F32", "BF16", "F16", "F64")
"""The dtypes a weight may be stored in (converted to the run's dtype on load)."""
MAX_LISTED = 6
"""Problems listed per folder; the rest are counted (a wrong config.json breaks every tensor)."""


class BadWeights(ValueError):
    """The folder's weights cannot be loaded; `rules` says every reason (each one sentence)."""

    def __init__(self, rules: list[str]):
        self.rules = list(rules)
        super().__init__("; ".join(summarised(self.rules)))


def summarised(rules: list[str]) -> list[str]:
    if len(rules) <= MAX_LISTED:
        return rules
    return [*rules[:MAX_LISTED], f"... and {len(rules) - MAX_LISTED} more like these"]


def weight_map(folder: str | Path) -> dict[str, Path]:
    """Hugging Face tensor name -> the file holding it; BadWeights when the index or the one
    file cannot say."""
    folder = Path(folder)
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        return {name: folder / file for name, file in _read_index(index).items()}
    try:
        return {name: folder / SAFETENSORS_FILE for name in read_header(folder / SAFETENSORS_FILE)}
    except BadSafetensors as err:
        raise BadWeights([f"{SAFETENSORS_FILE}: {err}"]) from None


def _read_index(index: Path) -> dict[str, str]:
    try:
        data = json.loads(index.read_text(encoding="utf-8"),
                          parse_constant=lambda name: float("nan"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadWeights([f"{index.name} is not readable JSON ({err})"]) from None
    files = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not files:
        raise BadWeights([f"{index.name} has no weight_map object of tensor name -> file name"])
    rules = [f"{index.name}: weight_map[{name!r}] = {file!r} {why}"
             for name, file in files.items() if (why := _bad_file_name(file))]
    if rules:
        raise BadWeights(rules)
    return files


def _bad_file_name(file: object) -> str:
    """Why `file` may not name a shard (empty when it may)."""
    if not isinstance(file, str) or not file:
        return "is not a file name"
    path = PurePosixPath(file)
    if path.is_absolute() or ".." in path.parts or "\\" in file or "\0" in file:
        return "is a path out of the folder (shards live inside it)"
    return ""


def check_weights(folder: str | Path, model) -> int:
    """Every problem of `folder`'s weights for `model` (a ModelSpec) as BadWeights; else the
    number of tensors the model will read."""
    folder = Path(folder)
    files = weight_map(folder)
    headers, rules = _headers(folder, set(files.values()))
    if rules:
        raise BadWeights(rules)
    expected = _expected(model)
    zeros = family_of(model).hf_zero_tensors(model, _config_json(folder))
    for name, path in files.items():
        entry = headers[path].get(name)
        if entry is None:
            rules.append(f"{SAFETENSORS_INDEX} puts {name} in {path.name}, which does not "
                         "hold it")
        elif name in zeros:
            rules += _zero_rules(name, entry, zeros[name], path)
        else:
            rules += _tensor_rules(name, entry, expected, model, path.name)
    missing = [name for name in expected if name not in files and not _optional(name, model)]
    rules += [f"{name} is missing from {_source(folder)} (config.json implies shape "
              f"{list(expected[name])})"
              for name in missing]
    if rules:
        raise BadWeights(rules)
    return sum(1 for name in expected if name in files)


def _config_json(folder: Path) -> dict:
    """config.json as plain JSON (resolve() has checked it; {} when it cannot be read)."""
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _zero_rules(name: str, entry: TensorEntry, shape: tuple[int, ...], path: Path) -> list[str]:
    """A tensor config.json's class has and our module does not: it must be all zero."""
    if entry.shape != tuple(shape) or entry.dtype not in WEIGHT_DTYPES:
        return [f"{path.name}: {name} is {entry.dtype} {list(entry.shape)}, config.json implies "
                f"a float {list(shape)}"]
    if any(tensor_bytes(path, entry)):
        return [f"{path.name}: {name} is not all zero, and this model computes no such term"]
    return []


def _headers(folder: Path, paths: set[Path]) -> tuple[dict[Path, dict[str, TensorEntry]],
                                                     list[str]]:
    headers, rules = {}, []
    for path in sorted(paths):
        if not path.is_file():
            rules.append(f"{path.relative_to(folder)} is named by {SAFETENSORS_INDEX} but "
                         "is not a file there")
            continue
        try:
            headers[path] = read_header(path)
        except BadSafetensors as err:
            rules.append(f"{path.relative_to(folder)}: {err}")
    return headers, rules


def _expected(model) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> shape of every tensor the model reads (a tied head: see _optional)."""
    family = family_of(model)
    shapes = {hf: part for name, shape in family.parameter_shapes(model)
              for hf, part in hf_shapes(name, shape, family).items()}
    if model.tie_embeddings:  # saved by some tools; the same values as the embedding
        shapes.setdefault(hf_name(f"{family.head}.weight", family),
                          shapes[hf_name(family.embedding_param, family)])
    return shapes


def _optional(name: str, model) -> bool:
    family = family_of(model)
    return model.tie_embeddings and name == hf_name(f"{family.head}.weight", family)


def _tensor_rules(name: str, entry: TensorEntry, expected: dict[str, tuple[int, ...]],
                  model, file: str) -> list[str]:
    if name not in expected:
        if meshrun_name(name, family_of(model)) is not None:  # e.g. layer 5 of a 4-layer model
            return [f"{file}: {name} has no place in a model of this config.json's shape"]
        return [f"{file}: {name} is a tensor the model has no place for (another architecture, "
                "or a quantised or adapter checkpoint?)"]
    rules = []
    if entry.shape != tuple(expected[name]):
        rules.append(f"{file}: {name} has shape {list(entry.shape)}, config.json implies "
                     f"{list(expected[name])}")
    if entry.dtype not in WEIGHT_DTYPES:
        rules.append(f"{file}: {name} is stored as {entry.dtype}; weights load from "
                     f"{', '.join(WEIGHT_DTYPES)}")
    return rules


def add_weight_problems(folder: str, model, *, key: str, problems: ProblemList) -> None:
    """check_weights, as problems under `key` (model.path or checkpoint.load_from)."""
    try:
        check_weights(folder, model)
    except BadWeights as err:
        for rule in summarised(err.rules):
            problems.add(key, folder, rule,
                         "pass a folder as save_pretrained writes it (config.json and its "
                         "complete, intact safetensors), e.g. download it again")


def _source(folder: Path) -> str:
    return SAFETENSORS_INDEX if (folder / SAFETENSORS_INDEX).is_file() else SAFETENSORS_FILE
