"""Torch-free accounting: parameter counts, FLOPs per token, memory per rank, the run plan.

One formula, one place: the dry run, the planner and the MFU metric all call these.
"""
from __future__ import annotations

from dataclasses import dataclass

from conf.schema import RecomputeMode
from conf.spec import ModelSpec, RecomputeSpec, RunSpec
from parallel.dims import ParallelDims
from training.memory_layout import held_layers, static_bytes
from training.peaks import PeakFlops, gpu_peak

FLOPS_CONVENTION = "6N + 12*L*H*Q*T (PaLM / torchtitan; N = parameters without token embeddings)"
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
TARGET_BYTES = 8  # int64 target id per token
ASSUMED_MFU = 0.4  # what time estimates assume a GPU run achieves (labelled where shown)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamCounts:
    total: int
    embedding: int
    """Token-embedding parameters (the output head counts here too only when tied)."""

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


def param_counts(model: ModelSpec) -> ParamCounts:
    d, hd = model.dim, model.head_dim
    attention = d * model.n_heads * hd * 2 + d * model.n_kv_heads * hd * 2
    mlp = 3 * d * model.ffn_dim
    block = attention + mlp + 2 * d
    embedding = model.vocab_size * d
    head = 0 if model.tie_embeddings else model.vocab_size * d
    total = model.n_layers * block + d + embedding + head
    return ParamCounts(total=total, embedding=embedding)


def flops_per_token(model: ModelSpec, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward), FLOPS_CONVENTION."""
    n = param_counts(model).non_embedding
    return 6 * n + 12 * model.n_layers * model.n_heads * model.head_dim * seq_len


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """Bytes per rank. Parameters stay fp32 (they are the master weights under autocast)."""

    params: int
    grads: int
    optimizer: int
    master_weights: int
    activations: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.master_weights + self.activations


def activation_elements_per_token_per_layer(model: ModelSpec, *, recompute: RecomputeSpec,
                                            device_type: str) -> int:
    """Elements one block that `recompute` applies to keeps for backward per token, in the
    memory of a `device_type` device (measured on CPU for every mode and every combination of
    targets in tests/unit/test_recompute.py, against the storages alive after forward).

    none: per norm its input, x*rsqrt, weight*normed and rsqrt (3d+1); q and k after RoPE; v;
    the attention output and its log-sum-exp (one per head; the output, stored [B, T, heads,
    head_dim], is also wo's input as a view); SwiGLU's w1, w3, silu and product (4f).
    full, or selective with block: only the block input.
    selective ops: the block input, the q/k/v/wo/w1/w3/w2 matmul outputs, attention output +
    lse; with attention as well, not the attention output and lse.
    selective module targets, each taken off what none keeps:
      ffn: w1, w3, silu and product (4f; its input, the ffn_norm output, is kept either way);
      swiglu: silu (f; gate and up are its checkpoint's inputs, the product is w2's input);
      attention: only the lse (heads; q, k, v are its inputs, the output is wo's input);
      norm: x*rsqrt and rsqrt per norm (2(d+1); its output is the next matmul's input).
    offload: what none keeps, in host memory: nothing on a GPU, all of it on a CPU device.
    """
    mode = RecomputeMode(recompute.mode)
    targets = set(recompute.targets)
    d, f, heads = model.dim, model.ffn_dim, model.n_heads
    kv = model.n_kv_heads * model.head_dim
    attention_out = d + heads
    none = 2 * (3 * d + 1) + (d + kv) + kv + attention_out + 4 * f
    if mode is RecomputeMode.none:
        return none
    if mode is RecomputeMode.offload:
        return none if device_type == "cpu" else 0
    if mode is RecomputeMode.full or "block" in targets:
        return d
    if "ops" in targets:  # ops re-computes norms and SwiGLU; a policy cannot single out ffn
        ops = d + (d + 2 * kv) + attention_out + d + 2 * f + d
        return ops - (attention_out if "attention" in targets else 0)
    saved = {"ffn": 4 * f, "swiglu": f, "attention": heads, "norm": 2 * (d + 1)}
    if "ffn" in targets:
        targets.discard("swiglu")  # ffn covers it
    return none - sum(saved[target] for target in targets)


def activation_elements_per_token_outside_blocks(model: ModelSpec) -> int:
    """The last block's output, the final norm's two products and rsqrt, and the fp32
    log-softmax over the vocabulary that cross entropy keeps."""
    return 3 * model.dim + 1 + model.vocab_size


def activation_bytes(model: ModelSpec, *, tokens: int, recompute: RecomputeSpec,
                     dtype_bytes: int, device_type: str, layers: list[int] | None = None,
                     with_head: bool = True) -> int:
    """Bytes kept for backward in `device_type` memory by one micro-batch of `tokens` tokens
    (targets included) in blocks `layers` (default: all) and, `with_head`, the final norm
    and loss. The policy covers the blocks `RecomputeSpec.applies_to` picks; the other
    blocks keep what none keeps."""
    none = RecomputeSpec(mode=RecomputeMode.none)
    layers = list(range(model.n_layers)) if layers is None else layers
    chosen = sum(1 for layer in layers if recompute.applies_to(layer))
    per_token = (chosen * activation_elements_per_token_per_layer(
                     model, recompute=recompute, device_type=device_type)
                 + (len(layers) - chosen) * activation_elements_per_token_per_layer(
                     model, recompute=none, device_type=device_type))
    if with_head:
        per_token += activation_elements_per_token_outside_blocks(model)
    return tokens * (per_token * dtype_bytes + (TARGET_BYTES if with_head else 0))


def estimate_memory(spec: RunSpec, *, rank: int | None = None) -> MemoryEstimate:
    """Bytes `rank` holds under the run's layout (default: the rank that holds the most).

    Parameters, gradients and optimizer state are exact (training/memory_layout.py; checked
    on every rank in tests/distributed). Activations: the per-block counts measured on one
    process, for this rank's tokens (micro-batch / pipeline micro-batches / cp), its blocks,
    and the pipeline micro-batches in flight; split evenly over tp (an approximation)."""
    if rank is None:
        return max((estimate_memory(spec, rank=r) for r in representative_ranks(spec)),
                   key=lambda m: m.total)
    static = static_bytes(spec, rank)
    return MemoryEstimate(params=static.params, grads=static.grads, optimizer=static.optimizer,
                          master_weights=0, activations=layout_activation_bytes(spec, rank))


def representative_ranks(spec: RunSpec) -> list[int]:
    """Ranks among which the fullest is: every pipeline rank; shard 0 of FSDP (its chunks
    are the ceil-sized ones); every ZeRO-1 owner (their shares differ)."""
    dims = ParallelDims.from_spec(spec.parallel)
    shards = range(dims.dp_shard) if dims.zero == 1 else range(1)
    return sorted({dims.rank_of({"pp": pp, "dp_replicate": 0, "dp_shard": shard, "cp": 0,
                                 "tp": 0})
                   for pp in range(dims.pp) for shard in shards})


def layout_activation_bytes(spec: RunSpec, rank: int) -> int:
    p, t = spec.parallel, spec.training
    dims = ParallelDims.from_spec(p)
    pp_rank = dims.coordinates(rank)["pp"]
    tokens = t.micro_batch_size // p.pp_microbatches * t.seq_len // p.cp
    per_micro_batch = activation_bytes(
        spec.model, tokens=tokens, recompute=spec.recompute, device_type=t.device,
        dtype_bytes=DTYPE_BYTES[spec.precision.compute_dtype.value],
        layers=held_layers(spec, pp_rank), with_head=pp_rank == p.pp - 1)
    return per_micro_batch * pipeline_in_flight(p, pp_rank) // p.tp


def pipeline_in_flight(p, pp_rank: int) -> int:
    """Pipeline micro-batches whose activations a rank holds at once: all of them under
    GPipe; under 1F1B-style schedules the warm-up depth, pp - pp_rank (x stages per rank)."""
    if p.pp == 1:
        return 1
    if p.pp_schedule == "gpipe":
        return p.pp_microbatches
    return min(p.pp_microbatches * p.pp_virtual_stages, (p.pp - pp_rank) * p.pp_virtual_stages)


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    world_size: int
    dp: int
    tokens_per_step: int
    params: ParamCounts
    flops_per_token: int
    flops_per_step: float
    memory: MemoryEstimate
    total_tokens: int


def make_plan(spec: RunSpec) -> Plan:
    fpt = flops_per_token(spec.model, spec.training.seq_len)
    tps = spec.training.tokens_per_step
    return Plan(world_size=spec.world_size, dp=spec.parallel.dp, tokens_per_step=tps,
                params=param_counts(spec.model), flops_per_token=fpt,
                flops_per_step=float(fpt) * tps, memory=estimate_memory(spec),
                total_tokens=tps * spec.training.steps)


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
