"""The dtype regimes and the parallel split of the activation model (parallel/cost/
activations.py, whose docstring says what each regime keeps). Torch-free."""
from __future__ import annotations

from dataclasses import dataclass

from conf.spec import ParallelSpec, PrecisionSpec

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
FP32 = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationDtypes:
    """Bytes per element of what a block keeps (see the module docstring)."""

    residual: int
    """The residual stream, the normalised values and (without autocast) the norm outputs."""
    compute: int
    """Matmul and attention outputs."""
    autocast: bool
    """Each matmul keeps its own compute-dtype copy of its input (autocast over fp32 weights)."""
    grouped_experts: bool = False
    """MoE experts run as torch's grouped GEMM (bf16 compute: training/models/moe/model/
    grouped_experts.py): one cast of their input, the group offsets kept (expert_activations)."""

    @classmethod
    def uniform(cls, nbytes: int) -> "ActivationDtypes":
        return cls(residual=nbytes, compute=nbytes, autocast=False)


def activation_dtypes(precision: PrecisionSpec, *, uses_fsdp: bool) -> ActivationDtypes:
    """The regime a run's blocks compute in: fp32, FSDP mixed precision or autocast."""
    compute = DTYPE_BYTES[precision.compute_dtype.value]
    if compute >= FP32:
        return ActivationDtypes.uniform(FP32)
    grouped = precision.compute_dtype.value == "bf16"
    if uses_fsdp:
        return ActivationDtypes(residual=compute, compute=compute, autocast=False,
                                grouped_experts=grouped)
    return ActivationDtypes(residual=FP32, compute=compute, autocast=True,
                            grouped_experts=grouped)


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationSplit:
    """How tensor and context parallelism split one rank's activations."""

    tp: int = 1
    sequence_parallel: bool = True
    """With tp: norms and the residual stream hold 1/tp of the sequence (else all of it)."""
    loss_parallel: bool = False
    """With tp: logits stay split over the vocabulary (else every rank holds all of it)."""
    cp: int = 1
    cp_balanced: bool = True
    """cp > 1: each rank holds two chunks (early and late) rather than one contiguous run."""
    fsdp: bool = False
    """FSDP2 wraps the model (zero 2/3 over more than one rank)."""
    document_mask: bool = False
    """data.document_mask: RoPE rows per token ([micro-batch, seq] of them, as under cp) and
    one dense mask per forward on the SDPA path (`document_mask_bytes`)."""
    loss_chunks: int = 1
    """training.loss_chunks: the head and loss run in this many row blocks (tp = pp = 1)."""
    compiled: bool = False
    """training.compile: each block is one inductor graph (`compiled_savings`)."""
    ep: int = 1
    """parallel.ep: MoE blocks send token copies to other ranks' experts (expert_activations)."""
    ep_imbalance: float = 1.0
    """ep > 1: the token copies the busiest rank's experts receive over the mean
    (parallel.ep_imbalance when set, else 1.0: the memory plan reads no calibration file)."""

    @classmethod
    def of(cls, p: ParallelSpec, *, document_mask: bool = False, loss_chunks: int = 1,
           compiled: bool = False) -> "ActivationSplit":
        return cls(tp=p.tp, sequence_parallel=p.sequence_parallel,
                   loss_parallel=p.loss_parallel, cp=p.cp, cp_balanced=p.cp_balanced,
                   fsdp=p.uses_fsdp,
                   document_mask=document_mask, loss_chunks=loss_chunks, compiled=compiled,
                   ep=p.ep, ep_imbalance=p.ep_imbalance or 1.0)

    @property
    def sequence_share(self) -> int:
        """The part of the sequence a rank's norms and residual stream hold (1/this)."""
        return self.tp if self.sequence_parallel else 1

    @property
    def vocab_share(self) -> int:
        return self.tp if self.loss_parallel else 1


FP32_SPLIT = ActivationSplit()


__all__ = ["DTYPE_BYTES", "FP32", "FP32_SPLIT", "ActivationDtypes", "ActivationSplit",
           "activation_dtypes"]
