"""The model family rules: `model.family` names a family, and that family computes the model
knobs and has the submodules each recompute target names."""
from __future__ import annotations

from conf.errors import ProblemList
from conf.schema import OpsMatmuls, RecomputeConfig, RecomputeMode, RecomputeTarget
from conf.spec import ModelSpec
from training.models import UnknownFamily, family_of, known_families


def check_model_family(model: ModelSpec, recompute: RecomputeConfig,
                       problems: ProblemList) -> None:
    """An unknown family is one problem; a known one adds a problem for each knob it refuses
    and for selective recompute targets it has no submodules for (ops needs none)."""
    try:
        family = family_of(model)
    except UnknownFamily:
        problems.add("model.family", model.family, "is not a model family",
                     f"use {', '.join(known_families())}, or the import path of a module "
                     f"that defines FAMILY (training/models/__init__.py)")
        return
    family.check(model, problems)
    check_family_recompute(model, recompute, problems)


def check_family_recompute(model: ModelSpec, recompute: RecomputeConfig,
                           problems: ProblemList) -> None:
    """Selective recompute of a known family: targets it has submodules for, and an
    alternate-matmul policy only where its matmul order is fixed (also what the layout
    search asks of each candidate policy)."""
    if recompute.mode is not RecomputeMode.selective:
        return
    check_alternate_matmuls(model, recompute, problems)
    known = {RecomputeTarget.ops, *family_of(model).recompute}
    missing = [t for t in recompute.targets if t in tuple(RecomputeTarget) and t not in known]
    if missing:
        problems.add("recompute.targets", list(recompute.targets),
                     f"model.family={model.family} has nothing to re-run for "
                     f"{', '.join(missing)}", f"choose from {', '.join(sorted(known))}")


def check_alternate_matmuls(model: ModelSpec, recompute: RecomputeConfig,
                            problems: ProblemList) -> None:
    """recompute.ops_matmuls=alternate needs a family whose blocks run the same matmuls in
    the same order every step (`ModelFamily.fixed_matmul_order`)."""
    if (recompute.mode == RecomputeMode.selective and RecomputeTarget.ops in recompute.targets
            and recompute.ops_matmuls == OpsMatmuls.alternate
            and not family_of(model).fixed_matmul_order):
        problems.add("recompute.ops_matmuls", "alternate",
                     f"model.family={model.family} routes tokens to experts, so which matmul "
                     "is every second one changes with the routing",
                     "use recompute.ops_matmuls=all (recompute=selective)")
