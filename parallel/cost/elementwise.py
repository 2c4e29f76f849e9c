"""Memory traffic of a block's elementwise work, eager and compiled, and of fp8's casts.
Torch-free. On a GPU these kernels are bound by HBM bandwidth, so their time is bytes / HBM.

Bytes read + written per token of one block's forward (d = dim, q/kv = query/key-value
widths, f = ffn_dim, r = residual bytes, c = compute bytes), counted from the ops of
training/models/llama/model.py:
- eager: RMSNorm runs x.float(), pow, mean, x * rsqrt, .to(dtype), weight * -- about
  (28 + 4r) d per norm, two norms; RoPE on q and k (x * cos, rotate_half's cat, addcmul)
  7c (q + kv); two residual adds 3r d each; SwiGLU's silu and product 5c f;
- compiled (training.compile: inductor fuses each chain of pointwise ops and reductions into
  one kernel that reads its inputs and writes its outputs once): a norm (r + c) d, RoPE
  2c (q + kv), the adds 3r d each, SwiGLU 3c f.
Backward moves about twice the forward's bytes (each op reads the gradient and what it saved
and writes a gradient): BACKWARD_TRAFFIC.

The loss (eager in every run: only blocks compile) moves LOSS_BYTES_PER_LOGIT per logit:
the bf16 logits written, upcast to fp32, log-softmax read and written, its gradient read and
written, cast back.

fp8 (torchao's Float8Linear, tensorwise dynamic scaling, the recipe convert_to_float8_training
applies by default): before each fp8 GEMM an amax pass (read) and a scale-and-cast pass (read
bf16, write fp8) over its bf16 operand -- the input X and the weight in forward, the output's
gradient dY in backward -- and the transposed fp8 copies the weight-gradient GEMM takes:
8 bytes per element of X and of dY eager (2 + 3 and the transposed 3), 5 compiled (the cast
and the transpose fused), and 8 per weight element per micro-batch (weights are cast after
FSDP's bf16 all-gather, each pass).
"""
from __future__ import annotations

from conf.spec import ModelSpec

BACKWARD_TRAFFIC = 2.0
"""Backward bytes over forward bytes of the elementwise ops (module docstring)."""
LOSS_BYTES_PER_LOGIT = 30
"""bf16 logits (2), fp32 upcast (2 + 4), log-softmax (4 + 4), its gradient (4 + 4), cast back
(4 + 2)."""
FP8_CAST_BYTES = {False: 8, True: 5}
"""Bytes moved per bf16 element fp8 casts (amax, scale+cast, transposed copy), eager / compiled."""
FP8_WEIGHT_CAST_BYTES = 8


def forward_bytes_per_token(model: ModelSpec, *, compiled: bool, residual_bytes: int,
                            compute_bytes: int, tp: int = 1) -> dict[str, float]:
    """Forward bytes per token of one block by op group (norm, rope, residual, swiglu), on a
    rank whose head- and ffn-split tensors are 1/tp of them (norms and adds are whole per
    token the rank holds)."""
    d, f = model.dim, model.ffn_dim
    qkv = (model.n_heads + model.n_kv_heads) * model.head_dim
    r, c = residual_bytes, compute_bytes
    if compiled:
        return {"norm": 2 * (r + c) * d, "rope": 2 * c * qkv / tp,
                "residual": 2 * 3 * r * d, "swiglu": 3 * c * f / tp}
    return {"norm": 2 * (28 + 4 * r) * d, "rope": 7 * c * qkv / tp,
            "residual": 2 * 3 * r * d, "swiglu": 5 * c * f / tp}


def recomputed_groups(mode: str, targets: set[str]) -> set[str]:
    """The elementwise op groups a recompute policy re-runs in backward."""
    if mode == "full" or "block" in targets:
        return {"norm", "rope", "residual", "swiglu"}
    if mode != "selective":
        return set()
    groups = set()
    if "ops" in targets:
        groups |= {"norm", "rope", "swiglu"}
    if "norm" in targets:
        groups.add("norm")
    if "swiglu" in targets or "ffn" in targets:
        groups.add("swiglu")
    if "attention" in targets:
        groups.add("rope")
    return groups


def fp8_cast_bytes(*, x_elements: float, dy_elements: float, weight_elements: float,
                   compiled: bool) -> float:
    """Bytes the fp8 casts of one pass move (module docstring)."""
    return FP8_CAST_BYTES[compiled] * (x_elements + dy_elements) + \
        FP8_WEIGHT_CAST_BYTES * weight_elements
