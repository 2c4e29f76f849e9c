"""A shipped model chosen without its recipe (`model=llama3_8b` alone) keeps the default
experiment's training shape, made for a 0.85M-parameter model on 2 CPU cores; the plan and
the dry run then say which recipe (`+experiment=<model>`, conf/experiment/) sets what its
authors or torchtitan published."""
from __future__ import annotations

from conf.search_path import option_sources
from conf.spec import RunSpec

DEFAULT_RECIPE = "debug"
"""The default experiment's own model: its recipe is the default."""


def chosen_model(overrides: list[str]) -> str | None:
    models = [o.split("=", 1)[1] for o in overrides if o.startswith("model=")]
    return models[-1] if models else None


def recipe_hint(spec: RunSpec, overrides: list[str]) -> str | None:
    """The line to print, or None (no model chosen, an experiment given, or no recipe)."""
    model = chosen_model(overrides)
    if model is None or model == DEFAULT_RECIPE or any(
            o.lstrip("+~").startswith("experiment=") for o in overrides):
        return None
    if model not in option_sources("experiment"):
        return None
    t = spec.training
    return (f"note: model={model} alone keeps the default experiment's training shape "
            f"(seq_len {t.seq_len}, micro-batch {t.micro_batch_size}, lr {spec.optim.lr:g}, "
            f"{t.steps} steps, data {spec.data.kind.value}); the recipe its authors or "
            f"torchtitan published is +experiment={model} (conf/experiment/{model}.yaml)")
