"""The model family rule: `model.family` names a family, and that family computes the knobs."""
from __future__ import annotations

from conf.errors import ProblemList
from conf.spec import ModelSpec
from training.models import UnknownFamily, family_of, known_families


def check_model_family(model: ModelSpec, problems: ProblemList) -> None:
    """An unknown family is one problem; a known one adds a problem for each knob it refuses."""
    try:
        family = family_of(model)
    except UnknownFamily:
        problems.add("model.family", model.family, "is not a model family",
                     f"use {', '.join(known_families())}, or the import path of a module "
                     f"that defines FAMILY (training/models/__init__.py)")
        return
    family.check(model, problems)
