"""How long a rank's matmuls take, by shape and dtype: a roofline with a knee. Torch-free.

One GEMM C[M, N] = A[M, K] @ B[K, N] of `b`-byte operands takes

    t = max(2 M N K / (peak_dtype x scale), b (M K + K N) + 2 M N) / HBM) + knee

- `scale` (cluster.matmul_efficiency, fitted by `plan --calibrate`) is the fraction of the
  dense peak a large GEMM reaches: cuBLAS reaches 0.7-0.8 of it for large bf16 shapes on
  A100/H100 (NVIDIA's GEMM performance guide, "Matrix Multiplication Background"), so the
  uncalibrated default is parallel.cost.step_time.DEFAULT_MATMUL_EFFICIENCY;
- the memory side is what a GEMM must read and write once (operands in the compute dtype or
  fp8, the bf16 output): it binds only for thin matmuls (a few tokens, or a tp-split N);
- `knee` (cluster.matmul_knee_us, fitted) is a fixed cost per GEMM call: launch, the tile
  prologue/epilogue and the last partial wave of thread blocks. It is what makes a small
  matmul slow: a GEMM of 2 M N K FLOPs reaches scale x w / (w + knee x peak x scale), half of
  `scale` where w equals the knee's FLOPs. On H100 a 1024^3 bf16 GEMM (2.1 GFLOP) runs near
  half the rate of a 8192^3 one (NVIDIA's GEMM guide, Fig. "performance vs size"): about
  3 us of fixed cost at 750 TFLOP/s (DEFAULT_KNEE_US). This is what makes tp and a small
  micro-batch cost compute: tp 8 cuts N or K of every block matmul by 8, and a micro-batch
  of one sequence M to seq_len.

Which GEMMs a step runs (`block_gemms`): per block the q, k, v and output projections and the
SwiGLU MLP's w1, w3, w2 (tp-local: column-parallel ones split N, row-parallel ones split K;
sequence parallel gathers M back to the whole cp share of the sequence), and the output head;
each forward GEMM has two backward GEMMs of the same M N K product (the input's gradient and
the weight's). fp8 (`precision=fp8`, torchao's Float8Linear, training/precision.py) runs the
block linears' three GEMMs in fp8; the output head stays bf16 (the filter in apply_fp8), so
do the attention core, norms and embedding.
"""
from __future__ import annotations

from dataclasses import dataclass

from conf.spec import ModelSpec

DEFAULT_KNEE_US = {"gpu": 3.0, "cpu": 0.0}
"""Fixed cost per GEMM call when neither a knob nor a calibration gives one (module
docstring). CPU: 0, the per-block overhead the calibration fits (layer_overhead_us) already
holds what a call costs there."""

OUTPUT_BYTES = 2
"""A GEMM's output is written in bf16 (fp8 GEMMs too: torchao asks _scaled_mm for bf16)."""


@dataclass(frozen=True, slots=True)
class Gemm:
    """`count` forward GEMMs of one shape per block pass (or per head pass)."""

    m: int
    n: int
    k: int
    fp8: bool = False
    """Runs in fp8 under precision=fp8 (a block linear, not the head)."""
    groups: int = 1
    """Identical GEMMs run as one grouped call (a rank's experts: torch._grouped_mm): their
    FLOPs and bytes add up, the knee is paid once."""

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.groups


@dataclass(frozen=True, slots=True, kw_only=True)
class MatmulRate:
    """What one rank's GEMMs run at."""

    flops: float
    """Large-GEMM FLOP/s in the compute dtype: dense peak x scale (x the core share on CPU)."""
    fp8_flops: float
    """The same for fp8 GEMMs (dense fp8 peak x scale); 0 where the device has no fp8."""
    hbm_bytes_s: float
    knee_s: float

    def seconds(self, gemm: Gemm, *, operand_bytes: int) -> float:
        """One forward GEMM and its two backward GEMMs (same M N K, three calls)."""
        fp8 = gemm.fp8 and self.fp8_flops > 0
        rate = self.fp8_flops if fp8 else self.flops
        b = 1 if fp8 else operand_bytes
        m, n, k, g = gemm.m, gemm.n, gemm.k, gemm.groups
        moved = (b * (m * k + k * n) + OUTPUT_BYTES * m * n,   # forward: X W
                 b * (m * n + k * n) + OUTPUT_BYTES * m * k,   # input's gradient: dY W^T
                 b * (m * k + m * n) + OUTPUT_BYTES * k * n)   # weight's gradient: X^T dY
        return sum(max(gemm.flops / rate, g * bytes_ / self.hbm_bytes_s) + self.knee_s
                   for bytes_ in moved)

    def forward_seconds(self, gemm: Gemm, *, operand_bytes: int) -> float:
        """The forward GEMM alone (what recompute re-runs)."""
        fp8 = gemm.fp8 and self.fp8_flops > 0
        b = 1 if fp8 else operand_bytes
        moved = gemm.groups * (b * (gemm.m * gemm.k + gemm.k * gemm.n)
                               + OUTPUT_BYTES * gemm.m * gemm.n)
        return max(gemm.flops / (self.fp8_flops if fp8 else self.flops),
                   moved / self.hbm_bytes_s) + self.knee_s


def attention_projections(model: ModelSpec, *, tokens: int, tp: int, fp8: bool) -> tuple:
    """The q, k, v and output projections of one block pass over `tokens` (tp-local)."""
    d, q, kv = model.dim, model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    return (Gemm(tokens, q // tp, d, fp8), Gemm(tokens, kv // tp, d, fp8),
            Gemm(tokens, kv // tp, d, fp8), Gemm(tokens, d, q // tp, fp8))


def mlp_gemms(model: ModelSpec, *, tokens: int, tp: int, fp8: bool) -> tuple:
    """w1 and w3 (column-parallel) and w2 (row-parallel) of one block pass."""
    d, f = model.dim, model.ffn_dim
    return (Gemm(tokens, f // tp, d, fp8), Gemm(tokens, f // tp, d, fp8),
            Gemm(tokens, d, f // tp, fp8))


def head_gemm(model: ModelSpec, *, tokens: int, tp: int) -> Gemm:
    """The output head over one pass's tokens: vocabulary split over tp (column-parallel),
    kept in bf16 under fp8."""
    return Gemm(tokens, model.vocab_size // tp, model.dim, False)


def block_gemms(model: ModelSpec, *, tokens: int, tp: int, fp8: bool) -> tuple:
    return attention_projections(model, tokens=tokens, tp=tp, fp8=fp8) + \
        mlp_gemms(model, tokens=tokens, tp=tp, fp8=fp8)


def ops_policy_split(gemms: tuple, *, alternate: bool) -> tuple[tuple, tuple]:
    """(kept, re-run): the matmuls of one block pass (`block_gemms`, in call order) whose
    outputs the selective ops policy keeps, and those it re-runs in backward. alternate
    (recompute.ops_matmuls, torchtitan's op SAC) keeps the 1st, 3rd, 5th ... of them."""
    return (gemms[0::2], gemms[1::2]) if alternate else (gemms, ())


def efficiency_of(gemm: Gemm, rate: MatmulRate, *, peak: float, operand_bytes: int) -> float:
    """Fraction of `peak` the GEMM (forward + backward) reaches under `rate`."""
    return 3 * gemm.flops / rate.seconds(gemm, operand_bytes=operand_bytes) / peak
