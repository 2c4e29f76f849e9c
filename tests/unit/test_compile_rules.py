"""resolve() refuses training.compile=true where it would silently compile nothing:
context parallel with a whole-block recompute checkpoint (conf/rules/compile_rules.py). The
combinations it allows are run compiled in tests/distributed/test_compile_layouts.py."""
from __future__ import annotations

import pytest

from conf.errors import ConfigError
from tests.support.specs import cpu_spec

BASE = ("model=tiny", "data=synthetic", "training.seq_len=32", "cluster.procs_per_node=2")


@pytest.mark.parametrize("recompute", [["recompute=full"], ["recompute=full_every2"],
                                       ["recompute=selective"],
                                       ["recompute=selective", "recompute.targets=[block]"]])
def test_compile_with_cp_and_whole_block_recompute_is_refused(recompute):
    with pytest.raises(ConfigError) as error:
        cpu_spec(*BASE, "parallel=cp", "training.compile=true", *recompute)
    text = str(error.value)
    assert "training.compile=true" in text and "parallel.cp=2" in text
    assert "recompute=selective_attention" in text  # the fix names a recompute that compiles


@pytest.mark.parametrize("overrides", [
    ["parallel=cp", "training.compile=true", "recompute=selective_attention"],
    ["parallel=cp", "training.compile=true", "recompute=none"],
    ["parallel=cp", "training.compile=false", "recompute=full"],
    ["parallel=zero3", "training.compile=true", "recompute=full"],
    ["parallel=tp", "training.compile=true", "recompute=selective"],
])
def test_compile_is_allowed_elsewhere(overrides):
    spec = cpu_spec(*BASE, *overrides)
    assert spec.training.compile_backend.value == "inductor"  # the default backend
