"""`meshrun plan --json`: the whole plan as one JSON object on stdout. Sizes are bytes,
times seconds. Keys (schema "meshrun.plan/1"):

- schema, name, world_size, dp, layout ({pp, dp_replicate, dp_shard, cp, tp, zero}), device
  ({type, name, count})
- tokens_per_step, total_tokens, steps
- params: {total, non_embedding, embedding}
- flops: {per_token, per_step, convention, attention ("full" | "causal")}
- memory_bytes: the fullest rank, by kind: {params, grads, optimizer, master_weights,
  weight_copies, activations, loss_peak (the transient at the loss beyond the kept
  activations: parallel.cost.activations.loss_peak_bytes), in_step (the step's fullest
  phase beyond params, optimizer and weight copies: parallel.cost.peak.step_peak_bytes)}
  and by phase: {static (between steps: params + grads + optimizer + master_weights), peak
  (params + optimizer + master_weights + weight_copies + in_step)}
- reserved: on a GPU the CUDA caching allocator's estimated reserved peak of that rank (what
  nvidia-smi shows; parallel.cost.allocator_reserve): {bytes, ratio (over the peak), source
  (cluster | calibration | default)}; null on CPU
- verdict: {fits (true | false | null: no verdict), need_bytes, device_bytes,
  usable_bytes, margin_bytes (usable - need), basis, line}
- step_time: the step-time model (parallel/cost/step_time.py) or null (a GPU with no known
  peak): {step_s, run_hours, gpu_hours (null on CPU), tokens_per_s_per_device, mfu,
  peak_flops, peak_source, matmul_efficiency, breakdown: {compute_s, recompute_s,
  overhead_s, bubble_s, comm_s, comm_exposed_s, optimizer_s, offload_s (activation offload's
  host copies), comm_by_axis: {axis: s}},
  collectives: [{axis, op, group, size_bytes, calls, link, seconds}], sources: {constant:
  cluster | calibration | catalogue | default}}
- does_not_fit: null when it fits (or no verdict); else, in plain words (launcher.plan.no_fit):
  {need_bytes, usable_bytes, state_bytes (the whole model's parameters, gradients and
  optimizer state), gpu_name, min_gpus (the fewest such GPUs holding that state fully
  sharded), line, fixes: [text]}; step_time is then what the run would take if it could
  start, not a prediction
- suggestions: when it does not fit, [{what, overrides, memory_bytes (peak), fits,
  margin_bytes}], each re-planned (launcher.plan.fit_advice); else []
"""
from __future__ import annotations

from conf.degrees import MESH_AXES
from conf.spec import RunSpec
from launcher.plan.no_fit import no_fit
from parallel.cost.allocator_reserve import estimate_reserved
from parallel.cost.plan import Plan
from parallel.cost.step_time import TimeEstimate, estimate_time

SCHEMA = "meshrun.plan/1"


def plan_json(spec: RunSpec, plan: Plan, suggestions: list) -> dict:
    p, m, v = spec.parallel, plan.memory, plan.verdict
    time = estimate_time(spec, plan)
    return {
        "schema": SCHEMA, "name": spec.name, "world_size": plan.world_size, "dp": plan.dp,
        "layout": {axis: getattr(p, axis) for axis in (*MESH_AXES, "zero")},
        "device": {"type": spec.training.device, "name": spec.host.gpu_name,
                   "count": spec.host.gpu_count},
        "tokens_per_step": plan.tokens_per_step, "total_tokens": plan.total_tokens,
        "steps": spec.training.steps,
        "params": {"total": plan.params.total, "non_embedding": plan.params.non_embedding,
                   "embedding": plan.params.embedding, "active": plan.params.active},
        "flops": {"per_token": plan.flops_per_token, "per_step": plan.flops_per_step,
                  "convention": plan.flops_convention,
                  "attention": plan.flops_attention},
        "memory_bytes": {"params": m.params, "grads": m.grads, "optimizer": m.optimizer,
                         "master_weights": m.master_weights,
                         "weight_copies": m.weight_copies, "activations": m.activations,
                         "loss_peak": m.loss_peak, "in_step": m.in_step,
                         "static": m.static, "peak": m.total},
        "reserved": _reserved_json(spec, m.total),
        "verdict": {"fits": v.fits, "need_bytes": v.need_bytes, "device_bytes": v.device_bytes,
                    "usable_bytes": v.usable_bytes, "margin_bytes": v.margin_bytes,
                    "basis": v.basis, "line": v.line},
        "step_time": None if time is None else time_json(time),
        "does_not_fit": _no_fit_json(spec, plan, suggestions),
        "suggestions": [{"what": s.what, "overrides": s.overrides,
                         "memory_bytes": s.plan.memory.total, "fits": s.plan.verdict.fits,
                         "margin_bytes": s.plan.verdict.margin_bytes} for s in suggestions],
    }


def _reserved_json(spec: RunSpec, peak: int) -> dict | None:
    reserved = estimate_reserved(spec, peak)
    return None if reserved is None else {"bytes": reserved.bytes, "ratio": reserved.ratio,
                                          "source": reserved.source}


def _no_fit_json(spec: RunSpec, plan: Plan, suggestions: list) -> dict | None:
    told = no_fit(spec, plan, any_suggestion_fits=any(s.plan.verdict.fits for s in suggestions))
    return None if told is None else told.as_json()


def time_json(e: TimeEstimate) -> dict:
    b = e.breakdown
    return {"step_s": e.step_s, "run_hours": e.run_hours, "gpu_hours": e.gpu_hours,
            "tokens_per_s_per_device": e.tokens_per_s_per_device, "mfu": e.mfu,
            "peak_flops": e.peak.flops, "peak_source": e.peak.source,
            "matmul_efficiency": e.hardware.matmul_efficiency,
            "breakdown": {"compute_s": b.compute_s, "recompute_s": b.recompute_s,
                          "overhead_s": b.overhead_s, "bubble_s": b.bubble_s,
                          "comm_s": b.comm_s, "comm_exposed_s": b.comm_exposed_s,
                          "optimizer_s": b.optimizer_s, "offload_s": b.offload_s,
                          "comm_by_axis": b.comm_by_axis},
            "collectives": [{"axis": c.axis, "op": c.op, "group": c.group,
                             "size_bytes": c.size_bytes, "calls": c.calls,
                             "link": c.link.name, "seconds": c.seconds}
                            for c in e.collectives],
            "sources": e.hardware.sources}
