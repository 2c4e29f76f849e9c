"""Every sweep file shipped in conf/sweeps/ loads, expands and validates (all points)."""
from __future__ import annotations

import pytest

from conf.spec import HostSpec
from sweeps.expand import expand
from sweeps.spec_file import SWEEPS_DIR, load_sweep_file, shipped_sweeps
from sweeps.validate import describe_invalid, validate

CPU = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=8)


def test_there_are_shipped_sweeps():
    assert {"debug_lr_warmup", "llama1b_layout_precision"} <= set(shipped_sweeps())


@pytest.mark.parametrize("name", shipped_sweeps())
def test_shipped_sweep_expands_and_validates(name):
    sweep = load_sweep_file(SWEEPS_DIR / f"{name}.yaml")
    assert sweep.name == name
    points = expand(sweep)
    assert len(points) >= 4
    checked = validate(points, host=CPU)  # Slurm sweeps validate against their cluster's GPUs
    invalid = [c for c in checked if not c.valid]
    assert not invalid, describe_invalid(invalid, len(checked))
    assert len({p.name for p in points}) == len(points)  # every run name tells its point apart
