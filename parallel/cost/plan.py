"""The plan of a run: parameters, FLOPs, tokens and the fullest rank's memory. Torch-free."""
from __future__ import annotations

from dataclasses import dataclass

from conf.spec import RunSpec
from parallel.cost.fit import Verdict, memory_verdict, node_peak_bytes
from parallel.cost.flops import flops_per_token, run_flops_convention
from parallel.cost.memory import MemoryEstimate, estimate_memory
from parallel.cost.params import ParamCounts, param_counts


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    world_size: int
    dp: int
    tokens_per_step: int
    params: ParamCounts
    flops_per_token: int
    flops_attention: str
    """The attention term: "full" (the MFU default) or "causal" (parallel.cost.flops)."""
    flops_convention: str
    """The formula flops_per_token follows (parallel.cost.flops), shown beside it."""
    flops_per_step: float
    memory: MemoryEstimate
    verdict: Verdict
    """Does the fullest rank fit its device (parallel.cost.fit)?"""
    total_tokens: int


def make_plan(spec: RunSpec, *, attention: str = "full",
              device_bytes: float | None = None) -> Plan:
    """The plan of `spec`; `attention` picks the FLOPs attention term ("full", the MFU
    default, or "causal"); `device_bytes` overrides the catalogue's memory per device."""
    memory = estimate_memory(spec)
    cpu_here = spec.training.device != "cuda" and spec.host.mem_available_bytes > 0
    node = node_peak_bytes(spec) if cpu_here else None
    fpt = flops_per_token(spec.model, spec.training.seq_len, attention=attention)
    tps = spec.training.tokens_per_step
    return Plan(world_size=spec.world_size, dp=spec.parallel.dp, tokens_per_step=tps,
                params=param_counts(spec.model), flops_per_token=fpt,
                flops_attention=attention, flops_convention=run_flops_convention(spec, attention),
                flops_per_step=float(fpt) * tps, memory=memory,
                verdict=memory_verdict(spec, memory.total, device_bytes=device_bytes,
                                       node_bytes=node),
                total_tokens=tps * spec.training.steps)
