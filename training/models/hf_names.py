"""Our parameter names <-> Hugging Face tensor names, through a family's one table
(`ModelFamily.hf_names`). Torch-free: the launcher checks a folder's safetensors headers with
it before launch, the export writes through it and the import reads through it in reverse."""
from __future__ import annotations

import re
from functools import lru_cache

from training.models.family import BLOCKS, ModelFamily, block_index, block_path


EXPERT = "{e}"
"""In a Hugging Face name, the expert index: our 3-D expert weight [E, ...] is E tensors there."""
_EXPERT_INDEX = re.compile(r"\.(\d+)\.")


def hf_name(name: str, family: ModelFamily) -> str:
    """Map one of our state-dict keys to its Hugging Face name (KeyError if unknown); a
    stacked expert weight's name keeps EXPERT in place of the expert index."""
    index = block_index(name)
    if index is None:
        return family.hf_names[name]
    return family.hf_names[f"{BLOCKS}.{{i}}.{block_path(name)}"].replace("{i}", str(index))


def hf_tensors(name: str, shape: tuple[int, ...], family: ModelFamily
               ) -> list[tuple[str, int | None]]:
    """The Hugging Face tensors parameter `name` of `shape` is: [(its name, None)], or for a
    stacked expert weight one (name, expert index) per row of dim 0."""
    template = hf_name(name, family)
    if EXPERT not in template:
        return [(template, None)]
    return [(template.replace(EXPERT, str(e)), e) for e in range(shape[0])]


def hf_shapes(name: str, shape: tuple[int, ...], family: ModelFamily
              ) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> shape of each tensor parameter `name` is stored as."""
    return {hf: tuple(shape[1:]) if e is not None else tuple(shape)
            for hf, e in hf_tensors(name, shape, family)}


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
    if ours is None:  # one expert's tensor: our stacked weight
        ours = names.get(name[:match.start(1)] + "{i}." + _EXPERT_INDEX.sub(
            f".{EXPERT}.", rest, count=1))
    return ours.replace("{i}", index) if ours is not None else None
