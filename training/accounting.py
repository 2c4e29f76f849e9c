"""Torch-free accounting: parameter counts, FLOPs per token, memory per rank, the run plan.

One formula, one place: the dry run, the planner and the MFU metric all call these.
"""
from __future__ import annotations

from dataclasses import dataclass

from conf.spec import ModelSpec, RunSpec

FLOPS_CONVENTION = "6N + 12*L*H*Q*T (PaLM / torchtitan; N = parameters without token embeddings)"
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


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


def activation_bytes_per_layer(model: ModelSpec, *, tokens: int, seq_len: int,
                               dtype_bytes: int, recompute: str) -> int:
    """Bytes one block keeps for backward for `tokens` tokens of one micro-batch.

    none: every intermediate (norm inputs/outputs, q/k/v before and after RoPE, attention
    output and its log-sum-exp, the four SwiGLU tensors, residuals); selective: matmul outputs
    and their inputs only; full: only the block input.
    """
    d, f = model.dim, model.ffn_dim
    kv = model.n_kv_heads * model.head_dim
    if recompute == "full":
        return tokens * d * dtype_bytes
    matmul_side = 4 * d + 2 * kv + 2 * d + 3 * f  # x_norm, q, k, v, attn out, o in; w1, w3, w2 in
    if recompute == "selective":
        return tokens * matmul_side * dtype_bytes
    elementwise = 4 * d + 2 * kv + 2 * f  # residual inputs, norms, rotated q/k, silu output
    lse = tokens * model.n_heads * 4
    return tokens * (matmul_side + elementwise) * dtype_bytes + lse


def estimate_memory(spec: RunSpec) -> MemoryEstimate:
    counts = param_counts(spec.model)
    n = counts.total
    t = spec.training
    compute_bytes = DTYPE_BYTES[spec.precision.compute_dtype.value]
    tokens = t.micro_batch_size * t.seq_len
    per_layer = activation_bytes_per_layer(spec.model, tokens=tokens, seq_len=t.seq_len,
                                           dtype_bytes=compute_bytes,
                                           recompute=spec.recompute.mode.value)
    logits = tokens * spec.model.vocab_size * (compute_bytes + 4)  # logits + fp32 log-softmax
    embeddings = tokens * spec.model.dim * 4 * 2  # embedding output and final norm output
    activations = spec.model.n_layers * per_layer + logits + embeddings
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
