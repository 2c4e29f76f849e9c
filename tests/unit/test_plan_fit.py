"""The fits / does-not-fit verdict (parallel.cost.fit), the re-planned suggestions
(launcher.advice)."""
from __future__ import annotations

from parallel.cost.devices import GIB
from parallel.cost.fit import USABLE_FRACTION, memory_verdict
from parallel.cost.plan import make_plan
from tests.support.specs import cpu_spec

# The README's 8B example: DDP on 8 x H100 80GB, which does not fit.
EIGHT_B = ["model=llama3_8b", "precision=bf16", "cluster=slurm", "cluster.nodes=1",
           "cluster.gpus_per_node=8", "cluster.gpu_name=H100"]


def test_the_verdict_compares_the_peak_with_the_usable_device_memory():
    spec = cpu_spec(*EIGHT_B)
    plan = make_plan(spec)
    v = plan.verdict
    assert v.device_bytes == 80 * GIB and v.usable_bytes == USABLE_FRACTION * 80 * GIB
    assert v.need_bytes == plan.memory.total
    assert v.fits is False and v.margin_bytes == v.usable_bytes - plan.memory.total < 0
    assert "DOES NOT FIT" in v.line
    assert memory_verdict(spec, int(v.usable_bytes)).fits is True
    assert memory_verdict(spec, int(v.usable_bytes) + 1).fits is False
    assert make_plan(cpu_spec("model=debug")).verdict.fits is None  # CPU: no verdict


def test_the_sweep_preview_uses_the_same_verdict():
    from sweeps.preview import point_cost

    spec = cpu_spec(*EIGHT_B)
    assert point_cost(spec).verdict == make_plan(spec).verdict
    assert point_cost(spec).fits is False


def test_suggestions_are_re_planned():
    from launcher.advice import suggestions

    spec = cpu_spec(*EIGHT_B)
    found = suggestions(spec, EIGHT_B)
    assert found and any(s.plan.verdict.fits for s in found)
    for s in found:
        other = make_plan(cpu_spec(*EIGHT_B, *s.overrides))
        assert s.plan.memory.total == other.memory.total < make_plan(spec).memory.total
