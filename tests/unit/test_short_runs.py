"""Auto warmup (schedule.warmup_steps=-1) scales with the run, so short runs just work."""
from __future__ import annotations

import pytest

from tests.support.specs import cpu_spec


@pytest.mark.parametrize(("steps", "warmup"), [(1, 0), (9, 0), (10, 1), (55, 5), (100, 10),
                                               (5000, 10)])
def test_auto_warmup_is_min_10_and_a_tenth_of_the_run(steps: int, warmup: int):
    spec = cpu_spec("model=tiny", f"training.steps={steps}")
    assert spec.schedule.warmup_steps == warmup


def test_one_step_run_resolves_with_every_schedule():
    for kind in ("constant", "linear", "cosine", "wsd"):
        assert cpu_spec("model=tiny", "training.steps=1", f"schedule={kind}").training.steps == 1


def test_explicit_warmup_is_kept():
    assert cpu_spec("model=tiny", "training.steps=100",
                    "schedule.warmup_steps=30").schedule.warmup_steps == 30
