"""Our parameter names <-> Hugging Face tensor names, through a family's one table
(`ModelFamily.hf_names`). Torch-free: the launcher checks a folder's safetensors headers with
it before launch, the export writes through it and the import reads through it in reverse."""
from __future__ import annotations

import re
from functools import lru_cache

from training.models.family import BLOCKS, ModelFamily, block_index, block_path


def hf_name(name: str, family: ModelFamily) -> str:
    """Map one of our state-dict keys to its Hugging Face name (KeyError if unknown)."""
    index = block_index(name)
    if index is None:
        return family.hf_names[name]
    return family.hf_names[f"{BLOCKS}.{{i}}.{block_path(name)}"].format(i=index)


@lru_cache(maxsize=16)
def _meshrun_names(family: ModelFamily) -> tuple[dict[str, str], re.Pattern]:
    """(Hugging Face name with "{i}" -> ours, the pattern of a Hugging Face block name)."""
    names = {hf: ours for ours, hf in family.hf_names.items()}
    prefix = {hf.split("{i}")[0] for hf in names if "{i}" in hf}
    assert len(prefix) <= 1, f"{family.name}: block names under several prefixes {prefix}"
    block = re.escape(next(iter(prefix), "\0")) + r"(\d+)\.(.+)"
    return names, re.compile(block)


def meshrun_name(name: str, family: ModelFamily) -> str | None:
    """The inverse of `hf_name`: our state-dict key for a Hugging Face name, or None."""
    names, block = _meshrun_names(family)
    match = block.fullmatch(name)
    if match is None:
        return names.get(name)
    index, rest = match.groups()
    ours = names.get(name[:match.start(1)] + "{i}." + rest)
    return ours.format(i=index) if ours is not None else None
