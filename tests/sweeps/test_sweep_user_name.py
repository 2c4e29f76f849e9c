"""A user's `name=` inside a sweep is kept, never silently replaced by the run-name template:
made unique per point, used as the template when it has {fields}, or refused (a template that
would drop it, points it would name alike). sweeps/naming.py point_template."""
from __future__ import annotations

import pytest

from conf.errors import ConfigError
from sweeps.expand import expand
from sweeps.spec_file import inline_sweep


def _names(*words: str, **settings) -> list[str]:
    return [p.name for p in expand(inline_sweep(list(words), **settings))]


def test_a_plain_name_is_kept_and_made_unique_per_point():
    assert _names("name=foo", "optim.lr=1e-4,3e-4") == ["foo-lr=0.0001", "foo-lr=0.0003"]
    point = expand(inline_sweep(["name=foo", "optim.lr=1e-4,3e-4"]))[1]
    assert point.run_overrides[-3] == "name='foo-lr=0.0003'"  # what the run is given


def test_a_name_with_fields_is_the_template_and_a_name_axis_leads():
    assert _names('name="lr{optim.lr}-{index}"', "optim.lr=1e-4,3e-4") == ["lr0.0001-0",
                                                                         "lr0.0003-1"]
    assert _names("name=a,b", "optim.lr=1e-4,2e-4") == ["a-lr=0.0001", "a-lr=0.0002",
                                                         "b-lr=0.0001", "b-lr=0.0002"]
    assert _names("name=a,b", "optim.lr=1e-4") == ["a", "b"]  # one lr: not an axis
    assert _names("name=foo", "optim.lr=1e-4,3e-4",
                  run_name="{name}-{index}") == ["foo-0", "foo-1"]


def test_without_a_name_the_template_names_the_points_as_before():
    assert _names("optim.lr=1e-4,3e-4") == ["lr=0.0001", "lr=0.0003"]


@pytest.mark.parametrize(("words", "settings", "said"), [
    (["name=foo", "optim.lr=1e-4,3e-4"], {"run_name": "x{index}"}, "would replace it"),
    (["name=same", "optim.lr=1e-4,3e-4"], {"run_name": "{name}"}, "would name 2 points the same"),
    (['name="run-{nope}"', "optim.lr=1e-4,3e-4"], {}, "unknown field {nope}"),
])
def test_a_name_that_would_be_lost_or_collide_is_refused(words, settings, said):
    with pytest.raises(ConfigError) as err:
        expand(inline_sweep(words, **settings))
    assert said in str(err.value)
