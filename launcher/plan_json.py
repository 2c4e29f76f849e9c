"""`meshrun plan --json`: the whole plan as one JSON object on stdout. Sizes are bytes,
times seconds. Keys (schema "meshrun.plan/1"):

- schema, name, world_size, dp, layout ({pp, dp_replicate, dp_shard, cp, tp, zero}), device
  ({type, name, count})
- tokens_per_step, total_tokens, steps
- params: {total, non_embedding, embedding}
- flops: {per_token, per_step, convention, attention ("full" | "causal")}
- memory_bytes: the fullest rank, by kind: {params, grads, optimizer, master_weights,
  weight_copies, activations, loss_peak (the transient at the loss beyond the kept
  activations: parallel.cost.activations.loss_peak_bytes)} and by phase: {static (between
  steps: params + grads + optimizer + master_weights), peak (static + weight_copies +
  activations + loss_peak)}
- verdict: {fits (true | false | null: no verdict), need_bytes, device_bytes,
  usable_bytes, margin_bytes (usable - need), basis, line}
- step_time: {step_s, run_hours, gpu_hours, assumed_mfu, peak_flops, peak_source} or null
  (CPU, or a GPU with no known peak)
- suggestions: when it does not fit, [{what, overrides, memory_bytes (peak), fits,
  margin_bytes}], each re-planned (launcher.advice); else []
"""
from __future__ import annotations

from conf.spec import RunSpec
from parallel.cost.plan import Plan
from parallel.cost.step_time import ASSUMED_MFU, estimate_time

SCHEMA = "meshrun.plan/1"


def plan_json(spec: RunSpec, plan: Plan, suggestions: list) -> dict:
    p, m, v = spec.parallel, plan.memory, plan.verdict
    time = estimate_time(spec, plan)
    return {
        "schema": SCHEMA, "name": spec.name, "world_size": plan.world_size, "dp": plan.dp,
        "layout": {axis: getattr(p, axis)
                   for axis in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "zero")},
        "device": {"type": spec.training.device, "name": spec.host.gpu_name,
                   "count": spec.host.gpu_count},
        "tokens_per_step": plan.tokens_per_step, "total_tokens": plan.total_tokens,
        "steps": spec.training.steps,
        "params": {"total": plan.params.total, "non_embedding": plan.params.non_embedding,
                   "embedding": plan.params.embedding},
        "flops": {"per_token": plan.flops_per_token, "per_step": plan.flops_per_step,
                  "convention": plan.flops_convention,
                  "attention": plan.flops_attention},
        "memory_bytes": {"params": m.params, "grads": m.grads, "optimizer": m.optimizer,
                         "master_weights": m.master_weights,
                         "weight_copies": m.weight_copies, "activations": m.activations,
                         "loss_peak": m.loss_peak,
                         "static": m.static, "peak": m.total},
        "verdict": {"fits": v.fits, "need_bytes": v.need_bytes, "device_bytes": v.device_bytes,
                    "usable_bytes": v.usable_bytes, "margin_bytes": v.margin_bytes,
                    "basis": v.basis, "line": v.line},
        "step_time": None if time is None else {
            "step_s": time.step_s, "run_hours": time.run_hours, "gpu_hours": time.gpu_hours,
            "assumed_mfu": ASSUMED_MFU, "peak_flops": time.peak.flops,
            "peak_source": time.peak.source},
        "suggestions": [{"what": s.what, "overrides": s.overrides,
                         "memory_bytes": s.plan.memory.total, "fits": s.plan.verdict.fits,
                         "margin_bytes": s.plan.verdict.margin_bytes} for s in suggestions],
    }
