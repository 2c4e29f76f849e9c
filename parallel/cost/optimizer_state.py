"""What each optimizer keeps and spends per parameter tensor, and which tensors Muon steps.
Torch-free: the memory plan, the step time and training/optim.py read this one place.

- AdamW: two moments per element (fp32, or bf16 with precision.optimizer_state_dtype=bf16)
  and a 4-byte step count per tensor.
- Muon (optim=muon): one momentum buffer per matrix, fp32 like the gradient it is made from
  (torch.optim.Muon: zeros_like(grad); no step count); the 2-D weights inside the blocks.
  Each step orthogonalises every matrix whole: ns_steps Newton-Schulz iterations, each
  X X^T (2 m^2 n), the quintic's (X X^T)^2 (2 m^3) and its product with X (2 m^2 n) for
  an m x n matrix with m <= n; a sharded matrix (FSDP, tp) is all-gathered first.
"""
from __future__ import annotations

from conf.spec import RunSpec
from parallel.cost.matmul_rate import Gemm, MatmulRate
from parallel.cost.params import held_parameters, numel, tp_local_shape
from parallel.dims import zero1_owners
from training.models.family import block_index

STEP_BYTES = 4
"""AdamW's step count per tensor (fp32 scalar)."""
MUON_BUFFER_BYTES = 4
"""Muon's momentum buffer per element (the fp32 gradient's dtype)."""


def muon_matrix(name: str, shape: tuple[int, ...]) -> bool:
    """Does optim=muon step parameter `name` with Muon? The 2-D weights inside the blocks
    (attention and FFN projections); embeddings, head, norms and biases take AdamW, as in
    torchtitan and Moonlight."""
    return block_index(name) is not None and len(shape) == 2


def optimizer_state_bytes(*, adamw_elements: int, adamw_tensors: int, muon_elements: int,
                          moment_bytes: int) -> int:
    """Bytes of optimizer state for the tensors a rank steps (module docstring)."""
    return (2 * moment_bytes * adamw_elements + STEP_BYTES * adamw_tensors
            + MUON_BUFFER_BYTES * muon_elements)


NS_OPERAND_BYTES = 2
"""torch.optim.Muon orthogonalises in bf16, whatever the run's dtypes."""


def newton_schulz_gemms(shape: tuple[int, ...], ns_steps: int) -> tuple[Gemm, ...]:
    """The GEMMs of orthogonalising one whole matrix of `shape`: per iteration X X^T, the
    quintic's (X X^T)^2 and its product with X (m <= n)."""
    m, n = sorted(shape)
    return (Gemm(m, m, n), Gemm(m, m, m), Gemm(m, n, m)) * ns_steps


def newton_schulz_flops(shape: tuple[int, ...], ns_steps: int) -> float:
    """FLOPs of orthogonalising one whole matrix of `shape` (module docstring)."""
    return sum(gemm.flops for gemm in newton_schulz_gemms(shape, ns_steps))


def muon_matrices(spec: RunSpec) -> list[tuple[str, tuple[int, ...]]]:
    """(name, whole shape) of the Muon matrices the busiest rank orthogonalises each step:
    every one its pipeline stage holds (a sharded one is gathered and orthogonalised whole
    on every rank holding a shard), under ZeRO-1 those it owns; none without optim=muon."""
    if not uses_muon(spec.optim):
        return []
    p, best, most = spec.parallel, [], -1.0
    owners_n = p.dp_shard if p.zero == 1 and p.dp_shard > 1 else 1
    for pp_rank in range(p.pp):
        held = held_parameters(spec, pp_rank)
        sizes = [numel(tp_local_shape(n, s, p.tp, spec.model.family)) for n, s in held]
        owners = zero1_owners(sizes, owners_n) if owners_n > 1 else [0] * len(held)
        for owner in range(owners_n):
            mine = [(n, s) for (n, s), o in zip(held, owners) if o == owner and muon_matrix(n, s)]
            flops = sum(newton_schulz_flops(s, 1) for _, s in mine)
            if flops > most:
                best, most = mine, flops
    return best


def muon_seconds(spec: RunSpec, rate: MatmulRate) -> float:
    """Newton-Schulz time of the busiest rank's step (its gathers: comm.py, axis muon)."""
    return sum(rate.forward_seconds(gemm, operand_bytes=NS_OPERAND_BYTES)
               for _, shape in muon_matrices(spec)
               for gemm in newton_schulz_gemms(shape, spec.optim.ns_steps))


def uses_muon(optim) -> bool:
    """Is the run's optimizer (an OptimSpec) optim=muon?"""
    return optim.name == "muon"
