"""What the dry run and `meshrun plan` print: the resolved config and the numbers of a run."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from conf.spec import RunSpec
from launcher.plan.no_fit import no_fit
from launcher.views.rank_view import layout_line, rank_table
from parallel.cost.allocator_reserve import estimate_reserved
from parallel.cost.devices import GIB
from parallel.cost.optimizer_state import uses_muon
from parallel.cost.plan import Plan
from parallel.cost.step_time import estimate_time


def human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def gib(n: int) -> str:
    """Bytes as MiB below 1 GiB, else GiB."""
    if n < GIB:
        return f"{n / 1024**2:.1f} MiB"
    return f"{n / GIB:.2f} GiB"


def plan_table(spec: RunSpec, plan: Plan) -> Table:
    table = Table(title=f"Plan: {spec.name}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    t = spec.training
    rows = [
        ("device", _device_line(spec)),
        ("world size", f"{plan.world_size} = {spec.cluster.nodes} node(s) x "
                       f"{spec.cluster.procs_per_node} process(es); dp={plan.dp}"),
        ("layout", layout_line(spec)),
        ("precision", f"{spec.precision.name} (compute {spec.precision.compute_dtype.value}, "
                      f"params fp32, grad reduce {spec.precision.reduce_dtype.value})"),
        ("batch", f"global {t.global_batch_size} = micro {t.micro_batch_size} x accum "
                  f"{t.grad_accum_steps} x dp {plan.dp}; seq_len {t.seq_len}"),
        ("tokens per step", f"{plan.tokens_per_step:,}"),
        ("tokens in run", f"{plan.total_tokens:,} ({t.steps} steps)"),
        ("parameters", f"{plan.params.total:,} total, {plan.params.non_embedding:,} "
                       f"without embeddings" + (f", {plan.params.active:,} active per token"
                                                if plan.params.active != plan.params.total
                                                else "")),
        ("FLOPs per token", f"{human(plan.flops_per_token)}  [{plan.flops_convention}]"),
        ("FLOPs per step", human(plan.flops_per_step)),
    ]
    rows += _memory_rows(spec, plan)
    rows.append(("fits device", plan.verdict.line))
    rows += _time_rows(spec, plan)
    for what, value in rows:
        table.add_row(what, value)
    return table


def _device_line(spec: RunSpec) -> str:
    if spec.training.device == "cuda":
        return f"cuda: {spec.host.gpu_count} x {spec.host.gpu_name}"
    return f"cpu ({spec.host.cpu_count} cores)"


def _weight_copies_note(spec: RunSpec) -> str:
    p, dtype = spec.parallel, spec.precision.compute_dtype.value
    if p.uses_fsdp and p.zero == 2:
        return f"FSDP zero=2: every unit's gathered {dtype} weights"
    if p.uses_fsdp:
        return f"FSDP zero=3: the root unit's and 2 blocks' gathered {dtype} weights"
    return f"autocast {dtype} copies of the matmul weights" if dtype in ("bf16", "fp16") \
        else "none: fp32 compute casts nothing"


def _memory_rows(spec: RunSpec, plan: Plan) -> list[tuple[str, str]]:
    m = plan.memory
    return [
        ("memory per rank", f"{gib(m.total)} (peak, the fullest rank; every rank below)"),
        ("  parameters", f"{gib(m.params)} (fp32, this rank's shards)"),
        ("  gradients", gib(m.grads)),
        ("  optimizer state", f"{gib(m.optimizer)} ({_optimizer_state_note(spec)})"),
        ("  master weights", f"{gib(m.master_weights)} (parameters are the fp32 masters)"),
        ("  weight copies", f"{gib(m.weight_copies)} ({_weight_copies_note(spec)}; "
                            "forward to backward)"),
        ("  activations", f"{gib(m.activations)} (kept for backward: pipeline chunks in "
                          "flight, recompute policy, dtype, tp/sp/cp split)"),
        ("  loss peak", f"{gib(m.loss_peak)} (transient at the loss, beyond what is kept)"),
        ("  fullest phase", f"{gib(m.in_step)} (gradients, activations, transients at the "
                            "loss, a block's backward or the optimizer step; the peak is this "
                            "+ parameters, optimizer state, weight copies)"),
        *_reserved_row(spec, plan),
    ]


def _reserved_row(spec: RunSpec, plan: Plan) -> list[tuple[str, str]]:
    """The allocator's reserved peak on a GPU (what nvidia-smi shows), with its ratio's source,
    and what it means when it is more than the device has."""
    reserved = estimate_reserved(spec, plan.memory.total)
    if reserved is None:
        return []
    text = (f"{gib(reserved.bytes)} (what the GPU shows: the CUDA caching allocator's peak, "
            f"x{reserved.ratio:.2f} the peak above ({reserved.source}; cluster.reserved_ratio))")
    device = plan.verdict.device_bytes
    if plan.verdict.fits and device and reserved.bytes > device:
        text += (f"; over the device's {gib(device)}: the allocator will empty its cache and "
                 "retry (slower steps); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                 "keeps less in reserve")
    return [("reserved (est.)", text)]


def _optimizer_state_note(spec: RunSpec) -> str:
    adamw = "AdamW: 2 moments + a step per tensor"
    return f"Muon: 1 buffer per block matrix; {adamw} of the rest" if uses_muon(spec.optim) \
        else adamw


def _time_rows(spec: RunSpec, plan: Plan) -> list[tuple[str, str]]:
    if plan.verdict.fits is False:
        return [("est. step time", f"none: the run does not fit {_where(spec)} (see 'fits "
                                   "device'; a step time for a run that cannot start means "
                                   "nothing)")]
    estimate = estimate_time(spec, plan)
    if estimate is None:
        return [("est. step time", f"unknown peak for {spec.host.gpu_name} "
                                   "(set cluster.peak_tflops)")]
    return time_rows(estimate)


def time_rows(e) -> list[tuple[str, str]]:
    """The step-time model's lines (parallel.cost.step_time), one term each."""
    b, hw = e.breakdown, e.hardware
    axes = ", ".join(f"{axis} {s * 1e3:.1f}" for axis, s in b.comm_by_axis.items()) or "none"
    if "ep" in b.comm_by_axis:
        axes += (f"; ep all-to-all at {hw.ep_imbalance:.3g}x the mean tokens "
                 f"({hw.sources.get('ep_imbalance')})")
    rows = [("est. step time", f"{e.step_s:.3f} s; {_rate(e.tokens_per_s_per_device)} tokens/s "
                               f"per device; MFU {e.mfu:.1%} of {e.peak.source}"),
            ("  compute", f"{b.compute_s * 1e3:.1f} ms at {hw.matmul_efficiency:.0%} matmul "
                          f"efficiency ({hw.sources.get('matmul_efficiency')}); recompute "
                          f"{b.recompute_s * 1e3:.1f} ms of it"),
            ("  communication", f"{b.comm_exposed_s * 1e3:.1f} ms exposed of "
                                f"{b.comm_s * 1e3:.1f} ms (ms by axis: {axes})"),
            ("  bubble, overhead", f"{b.bubble_s * 1e3:.1f} ms pipeline bubble; "
                                   f"{b.overhead_s * 1e3:.1f} ms per-block overhead (TP included)"),
            ("  optimizer", f"{b.optimizer_s * 1e3:.1f} ms (AdamW memory traffic, and "
                            f"{hw.update_overhead_s * 1e6:.0f} us per parameter tensor"
                            + (f"; Muon's Newton-Schulz {b.muon_s * 1e3:.1f} ms" if b.muon_s
                               else "") + ")")]
    if b.offload_s:
        rows.append(("  offload", f"{b.offload_s * 1e3:.1f} ms (activations to host memory and "
                                  f"back at {hw.host_gbps:g} GB/s, not overlapped)"))
    if e.gpu_hours is not None:
        rows.append(("est. run time", f"{e.run_hours:.2f} h; {e.gpu_hours:.1f} GPU-hours"))
    return rows


def _rate(per_s: float) -> str:
    """Tokens/s as a person reads it: whole numbers, significant digits below 10."""
    return f"{per_s:,.0f}" if per_s >= 10 else f"{per_s:.2g}"


def _where(spec: RunSpec) -> str:
    if spec.training.device == "cuda":
        return f"its {spec.host.gpu_name or 'GPU'}s"
    return "this machine's memory"


def suggestion_table(suggestions: list) -> Table:
    """launcher.plan.fit_advice suggestions, each re-planned: its overrides, memory and verdict."""
    table = Table(title="Does not fit: what would (each re-planned)", title_justify="left")
    for column in ("change", "overrides", "memory per rank", "verdict"):
        table.add_column(column)
    for s in suggestions:
        v = s.plan.verdict
        verdict = "fits" if v.fits else "does not fit" if v.fits is False else "?"
        if v.margin_bytes is not None:
            verdict += f" (margin {v.margin_bytes / GIB:.2f} GiB)"
        table.add_row(s.what, " ".join(s.overrides), gib(s.plan.memory.total), verdict)
    return table


def print_plan(spec: RunSpec, plan: Plan, console: Console,
               suggestions: list | None = None) -> None:
    console.print(plan_table(spec, plan))
    if spec.world_size > 1:
        console.print(rank_table(spec))
    if suggestions:
        console.print(suggestion_table(suggestions))
    if plan.verdict.fits is False:
        head, *fixes = does_not_fit_line(spec, plan, suggestions).split("\n")
        console.print(head, markup=False, highlight=False)  # prose: wrapped at the width
        for fix in fixes:  # commands to copy: never broken, the terminal wraps them
            console.print(fix, markup=False, highlight=False, soft_wrap=True)


def does_not_fit_line(spec: RunSpec, plan: Plan, suggestions: list | None) -> str:
    """In plain words: this model, in this layout, does not fit where it would run."""
    fits = any(s.plan.verdict.fits for s in suggestions or [])
    told = no_fit(spec, plan, any_suggestion_fits=fits)
    head = f"model {spec.model.name} does not fit {_where(spec)}: it {told.line}"
    if fits:
        head += "; the changes above that say 'fits' would"
    elif suggestions:
        head += "; none of the single changes above is enough"
    else:
        head += "; no single change (zero, recompute, tp, micro-batch) resolves for this run"
    return head + "\nfix: " + "\n     ".join(told.fixes)
