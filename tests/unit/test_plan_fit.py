"""The fits / does-not-fit verdict (parallel.cost.fit), the re-planned suggestions
(launcher.plan.fit_advice) and `meshrun plan --json` (launcher.plan.plan_json)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from parallel.cost.devices import GIB
from parallel.cost.fit import USABLE_FRACTION, memory_verdict
from parallel.cost.plan import make_plan
from tests.support.meshrun_cli import meshrun
from tests.support.specs import cpu_spec

REPO = Path(__file__).resolve().parents[2]
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


def _plan_json(*args: str) -> dict:
    proc = meshrun("plan", "--json", *args, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_plan_json_holds_the_whole_plan_and_re_planned_suggestions():
    out = _plan_json(*EIGHT_B)
    spec = cpu_spec(*EIGHT_B)
    plan = make_plan(spec)
    m = out["memory_bytes"]
    assert m["peak"] == plan.memory.total == out["verdict"]["need_bytes"]
    assert (m["params"] + m["optimizer"] + m["master_weights"] + m["weight_copies"]
            + m["in_step"] == m["peak"])
    # the step's fullest phase holds at least the loss's: every activation and its transient
    assert m["in_step"] >= m["activations"] + m["loss_peak"]
    assert m["loss_peak"] > 0
    assert m["weight_copies"] > 0
    assert out["flops"]["per_token"] == plan.flops_per_token
    assert out["flops"]["attention"] == "full" and "6N + 12*L*H*Q*T" in out["flops"]["convention"]
    assert out["verdict"]["fits"] is False and out["verdict"]["margin_bytes"] < 0
    assert out["step_time"]["step_s"] > 0
    assert out["suggestions"] and any(s["fits"] for s in out["suggestions"])
    for s in out["suggestions"]:
        other = make_plan(cpu_spec(*EIGHT_B, *s["overrides"]))
        assert s["memory_bytes"] == other.memory.total < plan.memory.total, s
        assert s["fits"] == other.verdict.fits
    causal = _plan_json("--attention-flops", "causal", *EIGHT_B)
    assert causal["flops"]["attention"] == "causal"
    assert causal["flops"]["per_token"] < out["flops"]["per_token"]


def test_a_plan_that_fits_has_a_margin_and_no_suggestions():
    out = _plan_json("model=debug", "cluster=slurm", "cluster.nodes=1",
                     "cluster.gpus_per_node=2", "cluster.gpu_name=H100")
    assert out["verdict"]["fits"] is True and out["verdict"]["margin_bytes"] > 0
    assert out["suggestions"] == []


def test_suggestions_are_re_planned():
    from launcher.plan.fit_advice import suggestions

    spec = cpu_spec(*EIGHT_B)
    found = suggestions(spec, EIGHT_B)
    assert found and any(s.plan.verdict.fits for s in found)
    for s in found:
        other = make_plan(cpu_spec(*EIGHT_B, *s.overrides))
        assert s.plan.memory.total == other.memory.total < make_plan(spec).memory.total
