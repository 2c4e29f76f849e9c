"""The compute term of one rank's step, by what runs: GEMMs by shape and dtype
(parallel.cost.matmul_rate), the attention core, and on a GPU the memory-bound elementwise
work and fp8's casts (parallel.cost.elementwise). Torch-free.

    compute = GEMMs + attention core + elementwise + fp8 casts + loss   (+ recompute's re-run)

- GEMMs: every block linear and the head, forward and both backward GEMMs, at the rate of
  their dtype, shape and the knee (matmul_rate.py). Per pass (a pipeline micro-batch of a
  micro-batch) over the rank's tokens: micro_batch_size / pp_microbatches sequences, their
  1/cp share (sequence parallel gathers tp's share back before each column-parallel GEMM).
- attention core (SDPA, kept in bf16 under fp8): 4 (q/tp) FLOPs forward per query-key pair
  the kernel computes (`attention_pairs`), 2.5x that backward (FlashAttention re-computes the
  scores: 5 matmul-sized passes to the forward's 2; Dao 2023, FlashAttention-2 sec. 3), at
  `scale` x ATTENTION_FACTOR of the dense peak. With the causal flag the GPU kernel skips the
  masked half (each query meets T/2 keys on average). Under cp > 1
  parallel/context_parallel.py all-gathers K and V: without document masking each run of a
  rank's queries meets the keys up to its end under a lower-right causal bias (the flash
  kernel: the causal half of the rank's t x T); with document masking SDPA takes an explicit
  mask over [t, T]: no flash kernel takes a mask, so the memory-efficient kernel computes
  every score (twice the causal work) at MASKED_ATTENTION of the flash rate. On CPU every
  score is counted, with or without cp (one SDPA call over [t, T] under cp; PyTorch's CPU
  flash kernel splits keys into blocks of 512: below that nothing is skipped), at the GEMM
  rate.
- on a GPU only: elementwise ops and the loss (bytes / HBM), fp8's amax and cast passes;
  on CPU the calibrated efficiency absorbs them (the catalogue knows no per-core bandwidth
  worth timing them by), as it did before this model.
The pipeline's last stage runs the head and loss: their time is shared over pp (the same
stage average the step's FLOPs always used).
"""
from __future__ import annotations

from dataclasses import dataclass

from conf.spec import RunSpec
from parallel.cost import elementwise as ew
from parallel.cost.activations import DTYPE_BYTES
from parallel.cost.matmul_rate import (
    Gemm, MatmulRate, attention_projections, head_gemm, ops_policy_split,
)
from parallel.cost.moe_gemms import block_kinds

ATTENTION_FACTOR = (("H100", 0.45), ("H200", 0.45), ("H800", 0.45), ("GH200", 0.45),
                    ("B200", 0.45), ("GB200", 0.45), ("A100", 0.85), ("A800", 0.85))
"""The attention core's FLOP rate over a large GEMM's, per device (first key in the name
wins; others 0.6, CPU 1). PyTorch's SDPA runs FlashAttention-2 kernels: on A100 they reach
~70% of peak forward and ~60% backward against cuBLAS' ~80% (Dao 2023, FlashAttention-2,
Fig. 4-6), on H100 ~35% (no Hopper-specific instructions; Shah et al. 2024,
FlashAttention-3, Fig. 1: FA2 at ~330-350 TFLOP/s of 989) against ~75%."""
DEFAULT_ATTENTION_FACTOR = 0.6
MASKED_ATTENTION = 0.7
"""The memory-efficient (CUTLASS, xformers-derived) SDPA kernel's rate over FlashAttention-2's:
0.6-0.75 of it forward and backward in Dao 2023 (FlashAttention-2, Fig. 4-5, "xformers")."""
BACKWARD_ATTENTION = 2.5


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeParts:
    scaled_s: float
    """GEMM and attention FLOPs at the rate `scale` gives (what 1/efficiency multiplies)."""
    fixed_s: float
    """What the efficiency does not scale: each GEMM's knee and the memory-bound excess of
    thin GEMMs, elementwise ops, fp8 casts and the loss (bytes / HBM)."""
    recompute_s: float
    """The re-run's share of scaled_s + fixed_s."""
    gemm_efficiency: float
    """The block and head GEMMs' FLOPs over their time x the dense peak (shape and dtype)."""

    @property
    def total_s(self) -> float:
        return self.scaled_s + self.fixed_s


def attention_factor(device: str, *, gpu: bool) -> float:
    if not gpu:
        return 1.0
    name = device.lower()
    return next((f for key, f in ATTENTION_FACTOR if key.lower() in name),
                DEFAULT_ATTENTION_FACTOR)


def attention_pairs(spec: RunSpec, *, gpu: bool) -> float:
    """Query-key pairs the attention kernel computes for one sequence's queries on the
    busiest rank (its cp share of T, t = T/cp, against the keys it meets): the module
    docstring's cases."""
    T, cp = spec.training.seq_len, spec.parallel.cp
    t = T // cp
    if cp == 1:
        return T * T / 2 if gpu else T * T
    if spec.data.document_mask or not gpu:
        return t * T
    return t * T / 2 if spec.parallel.cp_balanced else t * T - t * t / 2


def pass_tokens(spec: RunSpec) -> int:
    """Tokens one pass runs through a rank's blocks (whole over tp, its cp share)."""
    t, p = spec.training, spec.parallel
    return max(1, t.micro_batch_size * t.seq_len // (p.pp_microbatches * p.cp))


def passes(spec: RunSpec) -> int:
    """Passes through the rank's blocks in a step: micro-batches x pipeline micro-batches."""
    return spec.training.grad_accum_steps * spec.parallel.pp_microbatches


def compute_parts(spec: RunSpec, *, rate: MatmulRate, peak: float, attention_rate: float,
                  gpu: bool, ep_imbalance: float = 1.0) -> ComputeParts:
    """The compute term (module docstring) of the busiest-average rank of `spec`; a
    mixture-of-experts block's feed-forward by parallel.cost.moe_gemms (its busiest ep rank
    runs ep_imbalance x the mean token copies)."""
    m, p, t = spec.model, spec.parallel, spec.training
    tokens, layers = pass_tokens(spec), m.n_layers // p.pp
    fp8 = spec.precision.name.value == "fp8" and rate.fp8_flops > 0
    operand = DTYPE_BYTES[spec.precision.compute_dtype.value]
    if fp8:
        operand = 2  # fp8 runs keep bf16 for everything but the block GEMMs
    kinds = block_kinds(m, p, tokens=tokens, fp8=fp8, ep_imbalance=ep_imbalance)
    head = head_gemm(m, tokens=tokens, tp=p.tp)
    split = _Split(rate, operand, gpu)
    block = _mean_over_kinds(split.full, kinds)
    head_s = split.full((head,))
    q_local = m.n_heads * m.head_dim // p.tp
    masked = p.cp > 1 and spec.data.document_mask  # context_parallel.py (docstring)
    sequences = tokens / (t.seq_len // p.cp)
    attn_fwd = 4.0 * q_local * sequences * attention_pairs(spec, gpu=gpu) / (
        attention_rate * (MASKED_ATTENTION if masked and gpu else 1.0))
    attention = attn_fwd * (1 + BACKWARD_ATTENTION)
    memory = tuple(b / rate.hbm_bytes_s for b in _memory_bytes(spec, kinds, tokens=tokens,
                                                                fp8=fp8, gpu=gpu))
    re_scaled, re_fixed, re_bytes = _recompute(spec, kinds, tokens=tokens, split=split,
                                               attn_fwd=attn_fwd, fp8=fp8, gpu=gpu)
    n = passes(spec)
    scaled = n * (layers * (block[0] + attention + re_scaled) + head_s[0] / p.pp)
    fixed = n * (layers * (block[1] + memory[0] + re_fixed + re_bytes / rate.hbm_bytes_s)
                 + (head_s[1] + memory[1]) / p.pp)
    recompute = n * layers * (re_scaled + re_fixed + re_bytes / rate.hbm_bytes_s)
    flops = 3 * (_mean_over_kinds(lambda g: (sum(x.flops for x in g),), kinds)[0] * layers
                 + head.flops / p.pp)
    gemm_s = layers * sum(block) + sum(head_s) / p.pp
    return ComputeParts(scaled_s=scaled, fixed_s=fixed, recompute_s=recompute,
                        gemm_efficiency=flops / gemm_s / peak if gemm_s > 0 else 0.0)


def _mean_over_kinds(cost, kinds) -> tuple[float, ...]:
    """cost(gemms) averaged over the kinds of block (moe_gemms.block_kinds), by their share."""
    parts = [tuple(share * c for c in cost(gemms)) for gemms, share in kinds]
    return tuple(sum(column) for column in zip(*parts))


class _Split:
    """GEMM time split into the FLOP part (scaled by the efficiency) and the rest."""

    def __init__(self, rate: MatmulRate, operand: int, gpu: bool) -> None:
        self.rate, self.operand, self.gpu = rate, operand, gpu

    def full(self, gemms) -> tuple[float, float]:
        return self._sum(gemms, forward_only=False)

    def forward(self, gemms) -> tuple[float, float]:
        return self._sum(gemms, forward_only=True)

    def _sum(self, gemms, *, forward_only: bool) -> tuple[float, float]:
        scaled = fixed = 0.0
        for g in gemms:
            fp8 = g.fp8 and self.rate.fp8_flops > 0
            flop_s = g.flops / (self.rate.fp8_flops if fp8 else self.rate.flops)
            calls = 1 if forward_only else 3
            if self.gpu:
                total = (self.rate.forward_seconds(g, operand_bytes=self.operand)
                         if forward_only else self.rate.seconds(g, operand_bytes=self.operand))
            else:
                total = calls * (flop_s + self.rate.knee_s)
            scaled += calls * flop_s
            fixed += total - calls * flop_s
        return scaled, fixed


def _memory_bytes(spec: RunSpec, kinds, *, tokens: int, fp8: bool,
                  gpu: bool) -> tuple[float, float]:
    """(a block's, the head+loss's) elementwise and cast bytes of one pass; 0 on CPU."""
    if not gpu:
        return 0.0, 0.0
    m, p = spec.model, spec.parallel
    compiled = spec.training.compile
    c = 2 if fp8 else DTYPE_BYTES[spec.precision.compute_dtype.value]
    r = c if p.uses_fsdp or c == 4 else 4
    groups = ew.forward_bytes_per_token(m, compiled=compiled, residual_bytes=r,
                                        compute_bytes=c, tp=p.tp)
    seq_share = p.tp if p.sequence_parallel and p.tp > 1 else 1
    per_token = groups["rope"] + groups["swiglu"] + \
        (groups["norm"] + groups["residual"]) / seq_share
    block = tokens * per_token * (1 + ew.BACKWARD_TRAFFIC)
    if fp8:
        x, dy, w = _mean_over_kinds(_fp8_linear_elements, kinds)
        block += ew.fp8_cast_bytes(x_elements=x, dy_elements=dy, weight_elements=w,
                                   compiled=compiled)
    vocab_share = p.tp if p.tp > 1 else 1
    loss = tokens * m.vocab_size / vocab_share * ew.LOSS_BYTES_PER_LOGIT
    return block, loss


def _fp8_linear_elements(gemms) -> tuple[float, float, float]:
    """Elements of the fp8 block linears' inputs X, output gradients dY and weights, one
    pass."""
    fp8 = [g for g in gemms if g.fp8]
    return (sum(g.m * g.k for g in fp8), sum(g.m * g.n for g in fp8),
            sum(g.n * g.k for g in fp8))


def _recompute(spec: RunSpec, kinds, *, tokens: int, split: _Split, attn_fwd: float,
               fp8: bool, gpu: bool) -> tuple[float, float, float]:
    """(scaled s, fixed s, bytes) one block's re-run adds per pass, averaged over the blocks
    the policy covers (every_n_layers)."""
    r, m, p = spec.recompute, spec.model, spec.parallel
    mode, targets = r.mode.value, set(r.targets)
    if mode in ("none", "offload"):
        return 0.0, 0.0, 0.0
    share = len(range(0, m.n_layers, max(1, r.every_n_layers))) / m.n_layers
    whole = mode == "full" or "block" in targets
    alternate = r.ops_matmuls == "alternate"
    n_attention = len(attention_projections(m, tokens=1, tp=1, fp8=False))

    def rerun(gemms: tuple[Gemm, ...]) -> tuple[Gemm, ...]:
        if whole:
            return gemms
        if "ffn" in targets:
            return gemms[n_attention:]
        if "ops" in targets:
            return ops_policy_split(gemms, alternate=alternate)[1]
        return ()

    rerun_kinds = tuple((rerun(gemms), share) for gemms, share in kinds)
    scaled, fixed = _mean_over_kinds(split.forward, rerun_kinds)
    scaled += attn_fwd if whole or (mode == "selective" and "attention" in targets) else 0.0
    moved = 0.0
    if gpu:
        c = 2 if fp8 else DTYPE_BYTES[spec.precision.compute_dtype.value]
        res = c if p.uses_fsdp or c == 4 else 4
        groups = ew.forward_bytes_per_token(m, compiled=spec.training.compile,
                                            residual_bytes=res, compute_bytes=c, tp=p.tp)
        moved = tokens * sum(groups[g] for g in ew.recomputed_groups(mode, targets))
        if fp8:
            x = _mean_over_kinds(lambda g: _fp8_linear_elements(g)[:1], rerun_kinds)
            moved += ew.FP8_CAST_BYTES[spec.training.compile] * (x[0] if x else 0.0)
    return scaled * share, fixed * share, moved * share


__all__ = ["ComputeParts", "attention_factor", "compute_parts", "attention_projections"]
