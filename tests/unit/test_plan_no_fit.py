"""A run that cannot fit says so plainly (launcher.plan.no_fit): needs against has, the model
state alone, the fewest GPUs that could hold it fully sharded, and the fixes; in the plan view
and in `plan --json`."""
from __future__ import annotations

from launcher.plan.fit_advice import suggestions
from launcher.plan.no_fit import model_state_bytes, no_fit
from launcher.plan.plan_json import plan_json
from launcher.views.plan_view import does_not_fit_line
from parallel.cost.plan import make_plan
from tests.support.specs import cpu_spec

SEVENTY_B = ["model=llama3_70b", "precision=bf16", "cluster=slurm", "cluster.gpu_name=H100"]


def test_seventy_b_on_one_node_says_how_many_gpus_it_needs():
    spec = cpu_spec(*SEVENTY_B)
    plan = make_plan(spec)
    told = no_fit(spec, plan, any_suggestion_fits=False)
    assert told is not None and told.need_bytes == plan.verdict.need_bytes
    # DDP holds the whole state on every rank: the rank's static bytes are the model's
    assert model_state_bytes(plan) == plan.memory.static
    usable = plan.verdict.usable_bytes
    assert told.state_bytes / told.min_gpus <= usable < told.state_bytes / (told.min_gpus - 1)
    assert told.min_gpus > spec.world_size == 8
    assert any("cluster.nodes=2" in f for f in told.fixes)
    assert any("--search" in f for f in told.fixes)


def test_the_view_and_the_json_say_it():
    spec = cpu_spec(*SEVENTY_B)
    plan = make_plan(spec)
    advice = suggestions(spec, SEVENTY_B)
    line = does_not_fit_line(spec, plan, advice)
    assert "does not fit" in line and "\nfix: " in line and "GiB usable" in line
    out = plan_json(spec, plan, advice)["does_not_fit"]
    assert out["min_gpus"] > 8 and out["state_bytes"] > out["usable_bytes"]
    assert out["fixes"] and out["line"].startswith("needs ")


def test_a_run_that_fits_has_nothing_to_say():
    spec = cpu_spec("model=llama3_8b", "precision=bf16", "cluster=slurm", "parallel=fsdp",
                    "recompute=full", "training.seq_len=2048", "training.micro_batch_size=1")
    plan = make_plan(spec)
    assert plan.verdict.fits is True
    assert no_fit(spec, plan, any_suggestion_fits=False) is None
    assert plan_json(spec, plan, [])["does_not_fit"] is None


def test_fixes_lead_with_a_suggestion_that_fits_and_skip_more_devices_when_enough():
    over = ["model=llama3_8b", "precision=bf16", "cluster=slurm", "cluster.gpu_name=H100"]
    spec = cpu_spec(*over)
    plan = make_plan(spec)
    told = no_fit(spec, plan, any_suggestion_fits=True)
    assert told.min_gpus <= spec.world_size
    assert told.fixes[0].startswith("a layout") and not any("more devices" in f
                                                            for f in told.fixes)
