"""Activation bytes kept for backward, per block and per micro-batch. Torch-free."""
from __future__ import annotations

from conf.schema import RecomputeMode
from conf.spec import ModelSpec, ParallelSpec, RecomputeSpec

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
TARGET_BYTES = 8  # int64 target id per token


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


def pipeline_in_flight(p: ParallelSpec, pp_rank: int) -> int:
    """Pipeline micro-batches whose activations a rank holds at once: all of them under
    GPipe; under 1F1B-style schedules the warm-up depth, pp - pp_rank (x stages per rank)."""
    if p.pp == 1:
        return 1
    if p.pp_schedule == "gpipe":
        return p.pp_microbatches
    return min(p.pp_microbatches * p.pp_virtual_stages, (p.pp - pp_rank) * p.pp_virtual_stages)
