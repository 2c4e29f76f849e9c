"""The step-time model: compute, communication per mesh axis, pipeline bubble, optimizer.
Torch-free. Read top to bottom, a step of one rank takes

    compute   = the rank's GEMMs by shape and dtype (a roofline with a knee: large ones at
                peak x matmul_efficiency, small ones slower by matmul_knee_us a call; fp8
                GEMMs at the fp8 peak), the attention core at FlashAttention's rate, and on a
                GPU the elementwise work, fp8's casts and the loss as memory traffic (fused
                by training.compile); recompute's re-run included
                (parallel.cost.compute_time, parallel.cost.matmul_rate)
    overhead  = (layer_overhead + tp_overhead if tp > 1) x blocks on the rank x micro-batches
                through them
    bubble    = (compute + overhead) x (pp - 1) / (virtual stages x pipeline micro-batches)
    comm      = the exposed part of every collective (parallel.cost.comm: volumes per mesh
                axis, the link each axis uses, alpha-beta ring costs plus a software cost per
                call, the overlap rule)
    optimizer = AdamW's memory traffic over the rank's optimizer shard / HBM bandwidth
                + with optim=muon, Newton-Schulz's bf16 GEMMs of every whole matrix the rank
                orthogonalises (parallel.cost.optimizer_state; its gathers are in comm)
                + update_overhead x the parameter tensors the rank's optimizer steps (the
                per-tensor work of AdamW and of the gradient clipping's norms: on CPU about
                34 us a tensor here, more than the bandwidth term for small models; a GPU's
                fused AdamW makes it small). Not fitted by the run calibration
                (parallel.cost.calibrate says why)
    offload   = recompute=offload on a GPU: the saved activations copied to host memory in
                forward and back in backward, 2 x bytes / host link bandwidth, none of it
                hidden (parallel.cost.offload: what moves, and why nothing overlaps)
    step      = compute + overhead + bubble + comm + optimizer + offload

The bubble is the schedule's idle fraction (pp-1)/(m+pp-1) of the whole pipeline time for
GPipe/1F1B, divided by the virtual stages v for interleaved schedules (zero-bubble and looped
schedules are counted as interleaved). On a CPU, each rank gets one core, and when a node runs
more ranks than it has cores they share them (`core_share`: N ranks on C < N cores each run at
C/N of a core): compute, overhead, optimizer and every term of communication (gloo copies,
waits and the framework's code around each call run on the same cores) grow by N/C.

Every constant comes from, in order: a `cluster.*` knob that is not 0, the calibration
(`meshrun plan --calibrate`, parallel.cost.calibrate_store), the device catalogue
(parallel.cost.devices); matmul_efficiency falls back to DEFAULT_MATMUL_EFFICIENCY. The
ep all-to-all's imbalance likewise: `parallel.ep_imbalance` when not 0 (a value the user set
wins), else the calibration's (fitted to MoE runs' routing metrics), else 1.0 (balanced).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from conf.spec import RunSpec
from parallel.cost.calibrate_store import CONSTANTS, load_entry
from parallel.cost.comm import Collective, Link, exposed_s, step_collectives
from parallel.cost.compute_time import ComputeParts, attention_factor, compute_parts
from parallel.cost.moe_gemms import ffn_forward_flops_per_token
from parallel.cost.devices import (
    CPU_KEY, DEVICES, PeakFlops, device_facts, gpu_fp8_peak, gpu_peak,
)
from parallel.cost.matmul_rate import DEFAULT_KNEE_US, MatmulRate, block_gemms, ops_policy_split
from parallel.cost.flops import ATTENTION_TERMS
from parallel.cost.offload import offload_s
from parallel.cost.optimizer_state import muon_seconds
from parallel.cost.memory_static import zero1_shares
from parallel.cost.params import held_parameters, numel, param_counts, tp_local_shape
from parallel.cost.plan import Plan

DEFAULT_MATMUL_EFFICIENCY = 0.6
"""Fraction of the dense peak a large GEMM reaches when nothing is calibrated: cuBLAS reaches
0.6-0.8 of it for large bf16 shapes on A100/H100 under sustained load (clocks fall under the
power limit of a long run); the low end, as the other terms (attention's own rate, small
shapes' knee, memory-bound elementwise work: compute_time.py) are counted apart. Before those
terms existed one 0.5 covered everything."""

ADAMW_BYTES_PER_PARAM = 28
"""HBM traffic of one fp32 AdamW update per parameter: read parameter, gradient and two
moments (16 bytes), write parameter and two moments (12)."""

DEFAULT_LATENCY_US = {"intra-node": 10.0, "inter-node": 20.0, "cpu": 50.0}
"""alpha per collective step when neither a knob nor a calibration gives one."""

DEFAULT_HOST_LINK_GBPS = 25.0
"""Host link of a GPU the catalogue does not know: PCIe Gen4 x16's effective rate."""

DEFAULT_UPDATE_OVERHEAD_US = {"gpu": 0.0, "cpu": 34.0}
"""The optimizer's cost per parameter tensor when neither a knob nor a calibration gives one.
CPU: measured on this project's 2-core machine, AdamW (foreach) + clip_grads over the tiny
model at 4, 8 and 16 blocks (39, 75, 147 tensors) and at 4x the parameters: the update took
34 us a tensor + 28 bytes a parameter at ~6 GB/s (within 6% for all four). GPU: fused AdamW and
foreach norms launch a few kernels per step whatever the tensor count: 0."""

DEFAULT_COLLECTIVE_OVERHEAD_US = {"gpu": 0.0, "cpu": 0.0}
"""o, the software cost per collective call (parallel.cost.comm), when neither a knob nor a
calibration gives one: unknown until a calibration fits it from training runs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """The constants one rank's step is timed with, and where each came from."""

    device: str
    """The calibration key (parallel.cost.calibrate_store.device_key)."""
    peak: PeakFlops
    """Dense peak of one device (one core on CPU) in the compute dtype."""
    matmul_efficiency: float
    layer_overhead_s: float
    tp_overhead_s: float = 0.0
    """Extra per tensor-parallel block pass (counted only when tp > 1)."""
    update_overhead_s: float = 0.0
    """Fixed cost per parameter tensor the rank's optimizer steps (`optimizer_tensors`)."""
    knee_s: float = 0.0
    """Fixed cost of one GEMM call (parallel.cost.matmul_rate)."""
    fp8_flops: float = 0.0
    """Dense fp8 peak of one device; 0 where it has none (fp8 GEMMs then run at `peak`)."""
    hbm_gbps: float
    host_gbps: float = DEFAULT_HOST_LINK_GBPS
    """Device <-> host memory, GB/s per direction (activation offload's copies)."""
    intra: Link
    inter: Link
    ranks_per_node: int
    core_share: float
    """Fraction of a device one rank gets: 1 on a GPU; on CPU min(1, cores / ranks per node)."""
    overlaps_comm: bool
    """Can collectives run under compute (GPU: yes; CPU: gloo shares the cores, no)?"""
    ep_imbalance: float = 1.0
    """Tokens the busiest ep rank receives over the mean (scales the ep all-to-all)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Constant -> "cluster" (or "parallel"), "calibration", "catalogue" or "default"."""

    @property
    def gpu(self) -> bool:
        return self.device != CPU_KEY

    @property
    def rank_flops(self) -> float:
        """FLOP/s one rank's large matmuls achieve."""
        return self.peak.flops * self.matmul_efficiency * self.core_share

    def matmul_rate(self) -> MatmulRate:
        return MatmulRate(flops=self.rank_flops,
                          fp8_flops=self.fp8_flops * self.matmul_efficiency * self.core_share,
                          hbm_bytes_s=self.hbm_gbps * 1e9 * self.core_share,
                          knee_s=self.knee_s / self.core_share)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepBreakdown:
    compute_s: float
    """Matmuls, attention, elementwise work; recompute's re-run included."""
    compute_fixed_s: float = 0.0
    """The part of compute_s matmul_efficiency does not scale (GEMM knees, memory traffic)."""
    gemm_efficiency: float = 0.0
    """The block and head GEMMs' achieved fraction of the dense peak (shape, dtype, knee)."""
    recompute_s: float
    """The re-run's share of compute_s."""
    overhead_s: float
    bubble_s: float
    comm_s: float
    """All communication, hidden or not."""
    comm_exposed_s: float
    optimizer_s: float
    muon_s: float = 0.0
    """optim=muon: Newton-Schulz's share of optimizer_s (optimizer_state.muon_seconds)."""
    offload_s: float = 0.0
    """Activation offload's copies to host memory and back (exposed in full)."""
    comm_by_axis: dict[str, float] = field(default_factory=dict)
    """Seconds per step of each axis' collectives (fsdp, ddp, zero1, hsdp, tp, cp, pp)."""
    collectives: tuple = ()
    """The collectives the comm terms sum (comm.Collective), computed once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeEstimate:
    step_s: float
    run_hours: float
    gpu_hours: float | None
    """run_hours x ranks on GPUs; None on CPU."""
    peak: PeakFlops
    tokens_per_s_per_device: float
    mfu: float
    """Model FLOPs (the plan's, recompute not counted) / (step time x ranks x peak)."""
    breakdown: StepBreakdown
    collectives: tuple[Collective, ...]
    hardware: Hardware


def estimate_time(spec: RunSpec, plan: Plan, *,
                  hardware: Hardware | None = None) -> TimeEstimate | None:
    """The step-time model (module docstring); None for a GPU with no known peak."""
    hardware = hardware or hardware_of(spec)
    if hardware is None:
        return None
    parts = step_parts(spec, plan, hardware)
    step_s = parts.compute_s + parts.overhead_s + parts.bubble_s + parts.comm_exposed_s + \
        parts.optimizer_s + parts.offload_s
    world = plan.world_size
    run_hours = step_s * spec.training.steps / 3600
    return TimeEstimate(
        step_s=step_s, run_hours=run_hours,
        gpu_hours=run_hours * world if spec.training.device == "cuda" else None,
        peak=hardware.peak, tokens_per_s_per_device=plan.tokens_per_step / step_s / world,
        mfu=plan.flops_per_step / (step_s * world * hardware.peak.flops),
        breakdown=parts, collectives=parts.collectives, hardware=hardware)


def step_parts(spec: RunSpec, plan: Plan, hw: Hardware) -> StepBreakdown:
    """Every term of the step (module docstring)."""
    world, p = plan.world_size, spec.parallel
    parts = compute_terms(spec, plan, hw)
    compute_s = parts.total_s
    per_pass = hw.layer_overhead_s + (hw.tp_overhead_s if p.tp > 1 else 0.0)
    overhead_s = per_pass * block_passes(spec) / hw.core_share
    bubble_s = (compute_s + overhead_s) * bubble_factor(spec)
    collectives = collectives_of(spec, hw)
    by_axis: dict[str, float] = {}
    for c in collectives:
        by_axis[c.axis] = by_axis.get(c.axis, 0.0) + c.seconds
    exposed = exposed_s(collectives, compute_s=compute_s, layers=spec.model.n_layers // p.pp,
                        overlaps=hw.overlaps_comm)
    optimizer_s = (optimizer_params(spec) * ADAMW_BYTES_PER_PARAM / (hw.hbm_gbps * 1e9)
                   + optimizer_tensors(spec) * hw.update_overhead_s) / hw.core_share
    muon_s = muon_seconds(spec, hw.matmul_rate())
    return StepBreakdown(compute_s=compute_s, compute_fixed_s=parts.fixed_s,
                         gemm_efficiency=parts.gemm_efficiency, recompute_s=parts.recompute_s,
                         overhead_s=overhead_s, bubble_s=bubble_s, comm_s=sum(by_axis.values()),
                         comm_exposed_s=exposed, optimizer_s=optimizer_s + muon_s, muon_s=muon_s,
                         offload_s=offload_s(spec, host_gbps=hw.host_gbps), comm_by_axis=by_axis,
                         collectives=tuple(collectives))


def compute_terms(spec: RunSpec, plan: Plan, hw: Hardware) -> ComputeParts:
    """The step's compute on one rank, recompute's re-run included (compute_time.py)."""
    factor = attention_factor(hw.device, gpu=hw.gpu)
    return compute_parts(spec, rate=hw.matmul_rate(), peak=hw.peak.flops,
                         attention_rate=hw.rank_flops * factor, gpu=hw.gpu,
                         ep_imbalance=hw.ep_imbalance)


def step_floor_s(spec: RunSpec, plan: Plan, hw: Hardware) -> float:
    """A lower bound of estimate_time's step_s, cheap (no communication): the compute term
    and the bubble over it alone. step_parts adds the same compute term, a bubble over
    compute + overhead, and terms that are never negative (calibrated and catalogue constants
    are >= 0), and floating-point addition and multiplication are monotone, so its sum is
    never below this. The search predicts only the layouts whose bound could rank high."""
    compute_s = compute_terms(spec, plan, hw).total_s
    return compute_s + compute_s * bubble_factor(spec)


def collectives_of(spec: RunSpec, hw: Hardware) -> list[Collective]:
    return step_collectives(spec, ranks_per_node=hw.ranks_per_node, intra=hw.intra,
                            inter=hw.inter, ep_imbalance=hw.ep_imbalance)


def bubble_factor(spec: RunSpec) -> float:
    """Pipeline idle time over busy time: (pp-1) / (v x m); 0 without a pipeline."""
    p = spec.parallel
    if p.pp <= 1:
        return 0.0
    virtual = p.pp_virtual_stages if p.pp_schedule != "gpipe" and p.pp_schedule != "1f1b" else 1
    return (p.pp - 1) / (virtual * p.pp_microbatches)


def block_passes(spec: RunSpec) -> int:
    """Blocks one rank runs forward + backward in a step: its blocks x micro-batches x
    pipeline micro-batches."""
    p = spec.parallel
    return (spec.model.n_layers // p.pp) * spec.training.grad_accum_steps * p.pp_microbatches


def optimizer_params(spec: RunSpec) -> float:
    """Parameters whose AdamW update one rank runs: its tp/pp part, sharded by zero >= 1."""
    p = spec.parallel
    shards = p.fsdp_shards if p.zero >= 2 else p.dp_cp if p.zero == 1 else 1
    return param_counts(spec.model).total / (p.pp * p.tp * shards)


def optimizer_tensors(spec: RunSpec) -> int:
    """Parameter tensors the busiest rank's optimizer steps: those of its pipeline stage (a
    shard of each under FSDP, its tp part under tp); under zero 1 the most that any dp_shard
    rank owns (parallel.dims.zero1_owners, as training/parallel_model.py partitions them)."""
    p = spec.parallel
    stages = [held_parameters(spec, r) for r in range(p.pp)]
    if p.zero != 1 or p.dp_shard <= 1:
        return max(len(held) for held in stages)
    return max(tensors for held in stages for _, tensors in zero1_shares(
        tuple(numel(tp_local_shape(name, shape, p.tp, spec.model.family))
              for name, shape in held), p.dp_shard))


def recompute_flops_per_token(spec: RunSpec, *, attention: str = "full") -> float:
    """FLOPs per token the recompute policy re-runs in backward: full (or selective block) the
    forward of each recomputed block (2 x its matmul parameters + the attention core);
    selective attention the attention core's forward; selective ffn the MLP's forward;
    ops/swiglu/norm re-run element-wise work only (no matmul FLOPs), but ops with
    ops_matmuls=alternate also every second matmul of the block."""
    r, m, t = spec.recompute, spec.model, spec.training
    mode = r.mode.value
    if mode in ("none", "offload"):
        return 0.0
    targets = set(r.targets)
    q = m.n_heads * m.head_dim
    attention_fwd = ATTENTION_TERMS[attention] / 3 * q * t.seq_len
    ffn_fwd = ffn_forward_flops_per_token(m)
    attn_proj_fwd = 2 * (2 * m.dim * q + 2 * m.dim * m.n_kv_heads * m.head_dim)
    if mode == "full" or "block" in targets:
        per_layer = attn_proj_fwd + attention_fwd + ffn_fwd
    else:
        per_layer = ("attention" in targets) * attention_fwd + ("ffn" in targets) * ffn_fwd
    if mode == "selective" and "ops" in targets and "block" not in targets:
        _, rerun = ops_policy_split(block_gemms(m, tokens=1, tp=1, fp8=False),
                                    alternate=r.ops_matmuls == "alternate")
        per_layer += sum(g.flops for g in rerun)
    recomputed = len(range(0, m.n_layers, max(1, r.every_n_layers)))
    return per_layer * recomputed


def core_share(*, cpu_count: int, ranks: int) -> float:
    """The fraction of a core each of `ranks` ranks of a CPU node gets: ranks beyond the
    cores take turns on them, so N ranks on C < N cores each run at C / N of a core."""
    return min(1.0, cpu_count / max(ranks, 1))


def hardware_of(spec: RunSpec, *, calibration: dict | None = None) -> Hardware | None:
    """The constants for `spec` (module docstring for the order); None for an unknown GPU."""
    c = spec.cluster
    calibration = load_entry(spec) if calibration is None else calibration
    cpu = spec.training.device != "cuda"
    facts = next(d for d in DEVICES if d.key == CPU_KEY) if cpu else \
        device_facts(spec.host.gpu_name)
    sources: dict[str, str] = {}

    def pick(name: str, catalogue: float | None, default: float | None = None, *,
             section=c, section_name: str = "cluster") -> float | None:
        for source, value in ((section_name, getattr(section, name) or None),
                              ("calibration", calibration.get(name)),
                              ("catalogue", catalogue), ("default", default)):
            if value is not None:
                sources[name] = source
                return float(value)
        return None

    dtype = spec.precision.compute_dtype.value
    table = facts.fp32_flops if cpu else (gpu_peak(spec.host.gpu_name, dtype) or
                                          PeakFlops(flops=0.0, source="")).flops or None
    peak_tflops = pick("peak_tflops", table / 1e12 if table else None)
    if peak_tflops is None:
        return None
    what = f"{facts.key} {dtype} dense" if facts is not None else spec.host.gpu_name
    peak = PeakFlops(flops=peak_tflops * 1e12, source=f"{sources['peak_tflops']}:{what}")
    # fp8's peak keeps the catalogue's ratio to the bf16 one when cluster.peak_tflops moves it
    fp8 = (gpu_fp8_peak(spec.host.gpu_name) or 0.0) if not cpu else 0.0
    fp8 = fp8 * peak.flops / table if fp8 and table else 0.0
    get = (lambda attr: getattr(facts, attr) if facts is not None else None)
    latency = DEFAULT_LATENCY_US["cpu"] if cpu else None
    intra = Link(name="intra-node", gbps=pick("intra_node_gbps", get("intra_node_gbps"), 100.0),
                 latency_s=pick("intra_node_latency_us", None, latency or
                                DEFAULT_LATENCY_US["intra-node"]) * 1e-6)
    inter = Link(name="inter-node", gbps=pick("inter_node_gbps", get("inter_node_gbps"), 25.0),
                 latency_s=pick("inter_node_latency_us", None, latency or
                                DEFAULT_LATENCY_US["inter-node"]) * 1e-6)
    call_s = pick("collective_overhead_us", None,
                  DEFAULT_COLLECTIVE_OVERHEAD_US["cpu" if cpu else "gpu"]) * 1e-6
    ranks = spec.cluster.procs_per_node
    share = core_share(cpu_count=spec.host.cpu_count, ranks=ranks) if cpu else 1.0
    # gloo moves bytes, waits on peers and runs the framework's code around each call with the
    # same (shared) cores: every term of a CPU collective stretches by 1 / share
    intra, inter = (Link(name=k.name, gbps=k.gbps * share, latency_s=k.latency_s / share,
                         call_overhead_s=call_s / share) for k in (intra, inter))
    return Hardware(
        device=CPU_KEY if cpu else (facts.key if facts else spec.host.gpu_name), peak=peak,
        matmul_efficiency=pick("matmul_efficiency", None, DEFAULT_MATMUL_EFFICIENCY),
        layer_overhead_s=pick("layer_overhead_us", None, 0.0) * 1e-6,
        tp_overhead_s=pick("tp_overhead_us", None, 0.0) * 1e-6,
        update_overhead_s=pick("update_overhead_us", None,
                               DEFAULT_UPDATE_OVERHEAD_US["cpu" if cpu else "gpu"]) * 1e-6,
        knee_s=pick("matmul_knee_us", None, DEFAULT_KNEE_US["cpu" if cpu else "gpu"]) * 1e-6,
        fp8_flops=fp8,
        ep_imbalance=pick("ep_imbalance", None, 1.0, section=spec.parallel,
                          section_name="parallel"),
        hbm_gbps=pick("hbm_gbps", get("hbm_gbps"), 1000.0),
        host_gbps=pick("host_link_gbps", get("host_link_gbps"), DEFAULT_HOST_LINK_GBPS),
        intra=intra, inter=inter,
        ranks_per_node=ranks, core_share=share, overlaps_comm=not cpu, sources=sources)


__all__ = ["CONSTANTS", "DEFAULT_MATMUL_EFFICIENCY", "Hardware", "StepBreakdown",
           "TimeEstimate", "estimate_time", "hardware_of"]
