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


def newton_schulz_flops(shape: tuple[int, ...], ns_steps: int) -> float:
    """FLOPs of orthogonalising one whole matrix of `shape` (module docstring)."""
    m, n = sorted(shape)
    return float(ns_steps * (4 * m * m * n + 2 * m ** 3))


def uses_muon(optim) -> bool:
    """Is the run's optimizer (an OptimSpec) optim=muon?"""
    return optim.name == "muon"
