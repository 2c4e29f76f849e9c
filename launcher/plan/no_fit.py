"""A run that cannot fit where it would run, said plainly: what it needs against what the
devices have, the model state alone (what no layout of this many devices can shrink below
state / devices), the fewest devices that could hold it fully sharded, and the fixes (more
nodes or GPUs, a layout from the re-planned suggestions, `meshrun plan --search`). Read by the
plan view and `plan --json`."""
from __future__ import annotations

import math
from dataclasses import dataclass

from conf.spec import RunSpec
from parallel.cost.devices import GIB, gpu_memory_bytes
from parallel.cost.fit import USABLE_FRACTION
from parallel.cost.plan import Plan

GPUS_PER_NODE = 8
REFERENCE_GPU = "H100"
"""The GPU a CPU-only machine's advice counts in (the catalogue's H100 80GB)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NoFit:
    need_bytes: int
    """What must fit (the fullest rank's peak; on CPU all ranks of the host together)."""
    usable_bytes: float
    state_bytes: int
    """Parameters, gradients, optimizer state and master weights of the whole model."""
    gpu_name: str
    min_gpus: int
    """The fewest such GPUs whose usable memory holds the model state fully sharded (a lower
    bound: activations come on top)."""
    fixes: tuple[str, ...]

    @property
    def line(self) -> str:
        return (f"needs {self.need_bytes / GIB:,.1f} GiB, has {self.usable_bytes / GIB:,.1f} "
                f"GiB usable; the model state alone is {self.state_bytes / GIB:,.1f} GiB, "
                f"at least {self.min_gpus} x {self.gpu_name} fully sharded")

    def as_json(self) -> dict:
        return {"need_bytes": self.need_bytes, "usable_bytes": self.usable_bytes,
                "state_bytes": self.state_bytes, "gpu_name": self.gpu_name,
                "min_gpus": self.min_gpus, "line": self.line, "fixes": list(self.fixes)}


def model_state_bytes(plan: Plan) -> int:
    """The whole model's static state: this rank's state bytes per fp32 parameter it holds,
    times every parameter (16 B for fp32 weights, gradients and AdamW's two moments)."""
    m = plan.memory
    held = max(m.params // 4, 1)
    per_param = (m.params + m.grads + m.optimizer + m.master_weights) / held
    return int(plan.params.total * per_param)


def no_fit(spec: RunSpec, plan: Plan, *, any_suggestion_fits: bool) -> NoFit | None:
    """None unless the plan says it does not fit."""
    v = plan.verdict
    if v.fits is not False:
        return None
    on_gpu = spec.training.device == "cuda"
    gpu = spec.host.gpu_name if on_gpu else REFERENCE_GPU
    per_gpu = (v.usable_bytes if on_gpu else USABLE_FRACTION * (gpu_memory_bytes(gpu) or 0))
    state = model_state_bytes(plan)
    min_gpus = max(1, math.ceil(state / per_gpu)) if per_gpu else 0
    return NoFit(need_bytes=v.need_bytes, usable_bytes=v.usable_bytes or 0.0,
                 state_bytes=state, gpu_name=gpu, min_gpus=min_gpus,
                 fixes=_fixes(spec, min_gpus, any_suggestion_fits))


def _fixes(spec: RunSpec, min_gpus: int, any_suggestion_fits: bool) -> tuple[str, ...]:
    """Most likely to help first: a suggested layout that fits, else more devices when the
    model state alone needs more than the run has, else a search."""
    nodes = max(1, math.ceil(min_gpus / GPUS_PER_NODE))
    layout = ("a layout: a re-planned suggestion that says 'fits'" if any_suggestion_fits else
              "a layout: no single re-planned suggestion is enough; combine them (zero 3, "
              "full recompute, tp, a smaller micro-batch)")
    search = (f"the best layout that fits: meshrun plan --search --global-batch-tokens N "
              f"cluster=slurm cluster.nodes={nodes} ...")
    if spec.training.device == "cuda" and min_gpus <= spec.world_size:
        return (layout, search)
    more = (f"more devices: at least {min_gpus} GPUs, "
            f"cluster=slurm cluster.nodes={nodes} or more, with a sharded layout "
            f"(parallel=fsdp or fsdp_tp)")
    return (layout, more, search) if any_suggestion_fits else (more, layout, search)
