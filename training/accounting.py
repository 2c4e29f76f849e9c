"""Torch-free accounting: parameter counts, FLOPs per token, memory per rank, the run plan.

One formula, one place: the dry run, the planner and the MFU metric all call these.
"""
from __future__ import annotations

from dataclasses import dataclass

from conf.spec import ModelSpec, RunSpec
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


def activation_elements_per_token_per_layer(model: ModelSpec, *, recompute: str) -> int:
    """Elements one block keeps for backward per token (measured on CPU in
    tests/unit/test_recompute.py against the storages alive after forward).

    none: per norm its input, x*rsqrt, weight*normed and rsqrt; q and k after RoPE; v; the
    attention output and its log-sum-exp (one per head); SwiGLU's w1, w3, silu and product.
    selective: the block input, the q/k/v/wo/w1/w3/w2 matmul outputs, attention output + lse.
    full: only the block input.
    """
    d, f = model.dim, model.ffn_dim
    kv = model.n_kv_heads * model.head_dim
    attention_out = d + model.n_heads
    if recompute == "full":
        return d
    if recompute == "selective":
        return d + (d + 2 * kv) + attention_out + d + 2 * f + d
    return 2 * (3 * d + 1) + (d + kv) + kv + attention_out + 4 * f


def activation_elements_per_token_outside_blocks(model: ModelSpec) -> int:
    """The last block's output, the final norm's two products and rsqrt, and the fp32
    log-softmax over the vocabulary that cross entropy keeps."""
    return 3 * model.dim + 1 + model.vocab_size


def activation_bytes(model: ModelSpec, *, tokens: int, recompute: str, dtype_bytes: int) -> int:
    """Bytes kept for backward by one micro-batch of `tokens` tokens (targets included)."""
    per_token = (model.n_layers * activation_elements_per_token_per_layer(model, recompute=recompute)
                 + activation_elements_per_token_outside_blocks(model))
    return tokens * (per_token * dtype_bytes + TARGET_BYTES)


def estimate_memory(spec: RunSpec) -> MemoryEstimate:
    n = param_counts(spec.model).total
    t = spec.training
    activations = activation_bytes(spec.model, tokens=t.micro_batch_size * t.seq_len,
                                   recompute=spec.recompute.mode.value,
                                   dtype_bytes=DTYPE_BYTES[spec.precision.compute_dtype.value])
    return MemoryEstimate(params=4 * n, grads=4 * n, optimizer=2 * 4 * n, master_weights=0,
                          activations=activations)


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
