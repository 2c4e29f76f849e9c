"""Step and run time at an assumed MFU of the GPUs' dense peak. Torch-free."""
from __future__ import annotations

from dataclasses import dataclass

from conf.spec import RunSpec
from parallel.cost.devices import PeakFlops, gpu_peak
from parallel.cost.plan import Plan

ASSUMED_MFU = 0.4  # what time estimates assume a GPU run achieves (labelled where shown)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeEstimate:
    step_s: float
    run_hours: float
    gpu_hours: float
    peak: PeakFlops


def estimate_time(spec: RunSpec, plan: Plan) -> TimeEstimate | None:
    """Step time at ASSUMED_MFU of the GPUs' dense peak; None on CPU or for an unknown GPU."""
    if spec.training.device != "cuda":
        return None
    peak = gpu_peak(spec.host.gpu_name, spec.precision.compute_dtype.value)
    if peak is None:
        return None
    step_s = plan.flops_per_step / (plan.world_size * peak.flops * ASSUMED_MFU)
    run_hours = step_s * spec.training.steps / 3600
    return TimeEstimate(step_s=step_s, run_hours=run_hours,
                        gpu_hours=run_hours * plan.world_size, peak=peak)
