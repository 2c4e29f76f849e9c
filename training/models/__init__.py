"""Model families, one folder each, found through one table. Torch-free.

A family's folder holds a torch-free module whose `FAMILY` is a `ModelFamily`
(training/models/family.py: parameter table, TP plan, recompute submodules, FSDP and pipeline
units, Hugging Face names, config.json read and write) and its torch module, imported only when
a model is built. conf, parallel and training all import the torch-free part; it imports nothing
of ours but conf's leaves (conf.choices, and conf.errors / conf.spec for types only).

Adding a family is its folder plus one line in FAMILIES. `model.family` names a family by its
key here, or by the import path of its torch-free module (a test's or a user's family, e.g.
`tests.support.toy_family`): spec.json carries that name, so every rank finds the family
without anything registered at run time.
"""
from __future__ import annotations

import importlib
import re
from functools import cache

from training.models.family import ModelFamily

FAMILIES = {
    "llama": "training.models.llama",  # Llama 3 and Qwen2 dense
    "moe": "training.models.moe",  # mixture of experts: Qwen3-MoE, DeepSeek-V3-style
    "mixtral": "training.models.moe.mixtral_family",  # the MoE module, Mixtral's names
}
"""Family name -> import path of its torch-free module (which defines FAMILY)."""
MODULE_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
"""An import path a family may be named by: dotted identifiers, never a file path."""


class UnknownFamily(ValueError):
    """`model.family` names neither a registered family nor an importable family module."""


def known_families() -> tuple[str, ...]:
    return tuple(FAMILIES)


@cache
def model_family(name: str) -> ModelFamily:
    """The family `name` (a key of FAMILIES, or an import path of a module defining FAMILY)."""
    path = FAMILIES.get(name, name)
    if path not in FAMILIES.values() and not MODULE_PATH.fullmatch(path):
        raise UnknownFamily(name)
    try:
        family = importlib.import_module(path).FAMILY
    except (ImportError, AttributeError, TypeError, ValueError) as err:
        raise UnknownFamily(name) from err
    if not isinstance(family, ModelFamily):
        raise UnknownFamily(name)
    return family


def family_of(model) -> ModelFamily:
    """The family of a ModelSpec (its `family` knob)."""
    return model_family(model.family)


def family_for_architecture(architecture: str) -> ModelFamily | None:
    """The registered family that computes Hugging Face class `architecture`, or None."""
    for name in FAMILIES:
        family = model_family(name)
        if architecture in family.hf_architectures:
            return family
    return None


def hf_architectures() -> tuple[str, ...]:
    """Every Hugging Face class some registered family computes (for messages)."""
    return tuple(arch for name in FAMILIES for arch in model_family(name).hf_architectures)
