"""`model=<shipped model>` without its recipe: the plan says which +experiment sets the
published training shape (launcher.plan.recipe_hint)."""
from __future__ import annotations

from launcher.plan.recipe_hint import recipe_hint
from tests.support.specs import cpu_spec


def test_a_model_alone_points_at_its_recipe_with_the_shape_it_keeps():
    over = ["model=llama3_8b"]
    hint = recipe_hint(cpu_spec(*over), over)
    assert "+experiment=llama3_8b" in hint and "seq_len 128" in hint and "120 steps" in hint


def test_no_hint_with_a_recipe_the_default_model_or_none_to_offer():
    over = ["+experiment=llama3_8b"]
    assert recipe_hint(cpu_spec(*over), over) is None
    assert recipe_hint(cpu_spec("model=debug"), ["model=debug"]) is None
    assert recipe_hint(cpu_spec(), []) is None
    over = ["model=tiny"]  # tiny's recipe is named smoke: no experiment named tiny
    assert recipe_hint(cpu_spec(*over), over) is None
