"""The degree table (conf/degrees.py) and the parallelism index (parallel/parallelisms.py)
stay true: every place the index names exists, every degree is covered, and the table agrees
with the schema, the spec and the layout."""
from __future__ import annotations

import dataclasses
import importlib

import pytest

from conf.degrees import DEGREE_TABLE, DEGREES, FLATTENED_AXES, MESH_AXES
from conf.schema import ParallelConfig
from parallel.dims import ParallelDims
from parallel.parallelisms import APPLIED_BY, PARALLELISMS

PLACES = sorted({APPLIED_BY, *(place for p in PARALLELISMS
                               for place in (*p.passes, *p.rules, *p.cost))})


@pytest.mark.parametrize("place", PLACES)
def test_every_place_the_index_names_exists(place):
    module, _, attribute = place.partition(":")
    assert attribute, f"{place}: write it as module:attribute"
    assert hasattr(importlib.import_module(module), attribute), place


def test_every_degree_has_a_parallelism_and_every_parallelism_known_degrees():
    covered = {d for p in PARALLELISMS for d in p.degrees}
    assert covered == set(DEGREES)
    assert len({p.name for p in PARALLELISMS}) == len(PARALLELISMS)
    assert all(p.passes and p.rules and p.cost for p in PARALLELISMS)


def test_the_degree_table_agrees_with_the_schema_and_the_layout():
    schema = [f.name for f in dataclasses.fields(ParallelConfig)]
    assert [name for name in schema if name in DEGREES] == list(DEGREES)  # the schema's order
    assert sorted(d.mesh_position for d in DEGREE_TABLE) == list(range(len(DEGREE_TABLE)))
    assert sorted(MESH_AXES) == sorted(DEGREES)
    assert MESH_AXES == ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # init_device_mesh order
    assert all(set(axes) <= set(MESH_AXES) for axes in FLATTENED_AXES.values())
    single = ParallelDims.single()
    assert all(getattr(single, d.axis) == 1 for d in DEGREE_TABLE)
    assert single.shape == (1,) * len(MESH_AXES)
