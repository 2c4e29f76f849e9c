"""Activation bytes kept for backward, per block and per micro-batch. Torch-free.

What the code really saves (the Llama family's module, training/models/llama/model.py;
training/loss.py, parallel/*.py), by dtype regime
(`ActivationDtypes`), measured per tensor with saved-tensor hooks and exact per block in
tests/unit/test_activation_dtypes.py:
- fp32: every activation 4 bytes.
- autocast (bf16/fp16 compute without FSDP; parameters stay fp32): the residual stream, every
  RMSNorm and the norm outputs stay fp32; matmul and attention outputs are in the compute
  dtype; each matmul casts its input for itself, so the q, k and v projections each keep their
  own copy of the attention norm's output, and the gate and up projections of the MLP norm's.
- FSDP mixed precision (parameters gathered in the compute dtype): the residual stream and
  norm outputs are in the compute dtype; RMSNorm upcasts its input to fp32 and keeps it.
In every regime RMSNorm keeps an fp32 input (the input itself or its upcast), its rsqrt, its
normalised value (residual dtype) and its output (above); the RoPE tables are cast per
attention when q/k are not fp32 (four [seq, head_dim] copies per block).
"""
from __future__ import annotations

from fractions import Fraction

from conf.schema import OpsMatmuls, RecomputeMode, RecomputeTarget
from conf.spec import ModelSpec, ParallelSpec, RecomputeSpec
from parallel.cost.activation_types import (  # noqa: F401 (re-exported: the model's types)
    DTYPE_BYTES, FP32, FP32_SPLIT, ActivationDtypes, ActivationSplit, activation_dtypes,
)
from parallel.cost.expert_activations import (
    is_moe_block, moe_bytes_per_micro_batch, moe_bytes_per_token, qk_norm_bytes_per_token,
    qk_norm_fp32_attention_inputs,
)
from parallel.cost.matmul_rate import block_gemms, mlp_gemms, ops_policy_split

def _norm_core(model: ModelSpec, dt: ActivationDtypes) -> int:
    """One RMSNorm's fp32 input (or upcast), rsqrt and normalised value, per token."""
    return FP32 * model.dim + FP32 + dt.residual * model.dim


def _norm_output(model: ModelSpec, dt: ActivationDtypes, *, matmuls: int) -> int:
    """A norm output the next `matmuls` column-parallel layers keep, per token of the whole
    sequence (under tp it is all-gathered with sequence parallel, replicated without)."""
    return (matmuls * dt.compute if dt.autocast else dt.residual) * model.dim


def selective_targets(recompute: RecomputeSpec) -> set[RecomputeTarget]:
    """The targets a policy re-computes (none unless the mode is selective)."""
    if RecomputeMode(recompute.mode) is not RecomputeMode.selective:
        return set()
    return {RecomputeTarget(target) for target in recompute.targets}


def block_bytes_per_token(model: ModelSpec, *, recompute: RecomputeSpec, device_type: str,
                          dtypes: ActivationDtypes, split: ActivationSplit = FP32_SPLIT,
                          moe: bool = False) -> Fraction:
    """Bytes one block under `recompute` keeps per token of this rank's micro-batch (its cp
    share of the sequence, whole over tp), besides the per-block constants
    (`block_bytes_per_micro_batch`). Terms (see `activation_elements_per_token_per_layer`
    for which tensor each is):
      none: per norm `_norm_core` (÷ tp with SP) and its output copies; q, k after RoPE and
        v (k, v all-gathered over cp: x cp); attention output + fp32 lse (and its joined copy
        under balanced cp on CUDA, `runs_copy`); SwiGLU 4f; all head- or ffn-split ÷ tp.
      full / block: the block input (residual dtype, ÷ tp with SP).
      ops: block input, the matmul outputs (row-parallel ones whole before their reduction,
        plus the reduce-scattered share with SP; ops_matmuls=alternate: the 1st, 3rd, ... in
        call order, `ops_policy_split`), attention output + lse.
      module targets: none minus what they re-compute (ffn also keeps its input once).
    `moe`: a mixture-of-experts block, its feed-forward's terms expert_activations' instead of
    the SwiGLU MLP's (`_moe_instead_of_mlp`); model.qk_norm adds the q/k norms' (none and
    module targets).
    """
    mode = RecomputeMode(recompute.mode)
    d, f, heads = model.dim, model.ffn_dim, model.n_heads
    dq, kv = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    c, tp, seq_share = dtypes.compute, split.tp, split.sequence_share
    block_input = Fraction(dtypes.residual * d, seq_share)
    attention_out = Fraction(c * dq + FP32 * heads, tp) + runs_copy(dq, c, split, device_type)
    if mode is RecomputeMode.offload and device_type != "cpu":
        return Fraction(0)
    targets = selective_targets(recompute)
    if mode is RecomputeMode.full or RecomputeTarget.block in targets:
        return block_input
    if RecomputeTarget.ops in targets:
        kept_gemms, _ = ops_policy_split(block_gemms(model, tokens=1, tp=tp, fp8=False),
                                         alternate=recompute.ops_matmuls == OpsMatmuls.alternate)
        reduce_scattered = 2 * Fraction(c * d, tp) if tp > 1 and split.sequence_parallel else 0
        kept = block_input + c * sum(g.n for g in kept_gemms) + reduce_scattered + attention_out
        kept += _moe_instead_of_mlp(model, recompute, targets, dtypes, split) if moe else 0
        return kept - (attention_out if RecomputeTarget.attention in targets else 0)
    gathered_kv = split.cp if RecomputeTarget.attention not in targets else 1
    none = (2 * Fraction(_norm_core(model, dtypes), seq_share)
            + _norm_output(model, dtypes, matmuls=3) + _norm_output(model, dtypes, matmuls=2)
            + Fraction(c * dq + 2 * c * kv * gathered_kv, tp)
            + attention_out + Fraction(4 * c * f, tp)
            + Fraction(qk_norm_bytes_per_token(model, dtypes=dtypes), tp))
    if moe:
        none += _moe_instead_of_mlp(model, recompute, targets, dtypes, split)
    if RecomputeTarget.ffn in targets:
        targets.discard(RecomputeTarget.swiglu)
        # its checkpoint keeps the MLP norm's output itself, not gate's and up's copies of it
        none += dtypes.residual * d - _norm_output(model, dtypes, matmuls=2)
    saved = {RecomputeTarget.ffn: Fraction(4 * c * f, tp),
             RecomputeTarget.swiglu: Fraction(c * f, tp),
             RecomputeTarget.attention: Fraction(FP32 * heads, tp)
             + runs_copy(dq, c, split, device_type)
             - Fraction(qk_norm_fp32_attention_inputs(model, dtypes=dtypes), tp),
             RecomputeTarget.norm: 2 * Fraction(FP32 * d + FP32, seq_share)}
    if split.compiled:
        compiled = compiled_savings(model, dtypes=dtypes, split=split, moe=moe)
        none -= sum(compiled.values())
        for target, gone in compiled.items():  # a target cannot drop what compile dropped
            saved[target] -= gone
        saved[RecomputeTarget.ffn] -= compiled[RecomputeTarget.swiglu]
    return none - sum(saved[target] for target in targets)


def _moe_instead_of_mlp(model: ModelSpec, recompute: RecomputeSpec, targets: set,
                        dtypes: ActivationDtypes, split: ActivationSplit) -> Fraction:
    """An MoE block's feed-forward bytes (expert_activations.moe_bytes_per_token) less the
    dense MLP's that block_bytes_per_token counts: under ops its matmul outputs, else its
    norm output's copies and SwiGLU."""
    if RecomputeTarget.ops in targets:
        mlp = dtypes.compute * sum(g.n for g in mlp_gemms(model, tokens=1, tp=split.tp,
                                                          fp8=False))
    else:
        mlp = (_norm_output(model, dtypes, matmuls=2)
               + Fraction(4 * dtypes.compute * model.ffn_dim, split.tp))
    return moe_bytes_per_token(model, recompute=recompute, targets=targets, dtypes=dtypes,
                               ep=split.ep, ep_imbalance=split.ep_imbalance) - mlp


def runs_copy(dq: int, compute: int, split: ActivationSplit, device_type: str) -> Fraction:
    """Per token: balanced cp on CUDA runs attention once per chunk of a rank's queries
    (parallel/context_parallel.py `attention_by_runs`); SDPA keeps each chunk's output and the
    output projection keeps their join, a second copy (the middle rank's two chunks are one
    run: the busiest ranks are the others)."""
    if split.cp > 1 and split.cp_balanced and device_type != "cpu" and not split.document_mask:
        return Fraction(compute * dq, split.tp)
    return Fraction(0)


def compiled_savings(model: ModelSpec, *, dtypes: ActivationDtypes, split: ActivationSplit,
                     moe: bool = False) -> dict[RecomputeTarget, Fraction]:
    """What a compiled block does not keep beside an eager one, per token, where no
    checkpoint policy decides what is saved (recompute none and module targets; under ops,
    block and full the policy's saves are the same compiled or not): inductor's min-cut
    partitioner (torch/_functorch/partitioners.py, min_cut_rematerialization_partition) saves
    the inputs of a fused pointwise region and re-computes its ops in backward rather than
    saving their outputs -- each RMSNorm's fp32 upcast of its input (the input itself and the
    rsqrt stay), and SwiGLU's silu(gate) (gate and up stay). An MoE block (`moe`) is
    credited its norms only: what inductor keeps of its experts' SwiGLU is not measured, so
    its eager bytes stand (an upper bound)."""
    swiglu = 0 if moe else Fraction(dtypes.compute * model.ffn_dim, split.tp)
    return {RecomputeTarget.norm: 2 * Fraction(FP32 * model.dim, split.sequence_share),
            RecomputeTarget.swiglu: swiglu}


def block_bytes_per_micro_batch(model: ModelSpec, *, recompute: RecomputeSpec, seq: int,
                                device_type: str, dtypes: ActivationDtypes,
                                split: ActivationSplit = FP32_SPLIT, micro_batch: int = 1,
                                moe: bool = False) -> int:
    """Bytes one block keeps per micro-batch that do not scale with its tokens. `seq`: the
    rank's sequence (its cp share).
    RoPE tables: when q/k are not fp32, the attention casts four slices of the fp32 rows
    (re-computed under full / block / ops); FSDP does not cast a block's inputs
    (parallel/fsdp.py), so the tables reach it in fp32 under every regime.
    Context parallelism on CPU: SDPA's additive mask in the compute dtype, [seq, seq x cp],
    made from the bool causal mask (unless attention re-computes); on CUDA the lower-right
    causal bias keeps none (parallel/context_parallel.py); a document mask replaces it (one
    per forward, `document_mask_bytes`). `moe`: an MoE block's router state
    (expert_activations.moe_bytes_per_micro_batch). With q/k norms under autocast, q and k
    leave their norms in fp32 (fp32 norm weights): RoPE casts no table."""
    mode = RecomputeMode(recompute.mode)
    if mode is RecomputeMode.offload and device_type != "cpu":
        return 0
    targets = selective_targets(recompute)
    router = moe_bytes_per_micro_batch(model, recompute=recompute, targets=targets,
                                       micro_batch=micro_batch, dtypes=dtypes,
                                       ep=split.ep) if moe else 0
    rows = _rope_rows(seq, split=split, micro_batch=micro_batch)
    casts_tables = dtypes.compute != FP32 and not (model.qk_norm and dtypes.autocast)
    rope = 4 * (rows or seq) * model.head_dim * dtypes.compute if casts_tables else 0
    if mode is RecomputeMode.full or {RecomputeTarget.block, RecomputeTarget.ops} & targets:
        return router
    reruns_attention = RecomputeTarget.attention in targets
    keeps_mask = (split.cp > 1 and device_type == "cpu" and not reruns_attention
                  and not split.document_mask)
    mask = dtypes.compute * seq * seq * split.cp if keeps_mask else 0
    return rope + mask + router


def _rope_rows(seq: int, *, split: ActivationSplit, micro_batch: int) -> int:
    """RoPE rows the model indexes per forward: micro_batch x seq with document masking
    (positions per token), seq under cp (this rank's positions), else 0 (table slices)."""
    if split.document_mask:
        return micro_batch * seq
    return seq if split.cp > 1 else 0


def document_mask_bytes(*, recompute: RecomputeSpec, layers: list[int], seq: int,
                        micro_batch: int, device_type: str, dtypes: ActivationDtypes,
                        split: ActivationSplit) -> int:
    """The dense document mask of the SDPA path (CPU; CUDA builds a flex BlockMask, tiles
    only): ONE additive mask [micro_batch, seq, seq x cp] in the compute dtype per forward,
    shared by every block (parallel/document_masking.py `DenseDocumentMask`, which SDPA saves); and,
    while a checkpoint holds the mask object as an input to re-run attention, the boolean
    mask too (1 byte an entry)."""
    if not split.document_mask or device_type != "cpu" or not layers:
        return 0
    entries = micro_batch * seq * seq * split.cp
    held = any(_reruns_attention(recompute, layer) for layer in layers)
    return entries * (dtypes.compute + (1 if held else 0))


def _reruns_attention(recompute: RecomputeSpec, layer: int) -> bool:
    return recompute.applies_to(layer) and (
        RecomputeMode(recompute.mode) is RecomputeMode.full
        or bool({RecomputeTarget.block, RecomputeTarget.ops, RecomputeTarget.attention}
                 & selective_targets(recompute)))


def rope_rows_bytes(model: ModelSpec, *, recompute: RecomputeSpec, layers: list[int],
                    seq: int, dtypes: ActivationDtypes, split: ActivationSplit,
                    micro_batch: int = 1) -> int:
    """Under cp (or document masking) the model indexes rows of the fp32 RoPE tables once
    per forward (the module's `rope_tables`, `_rope_rows`); they are kept when fp32
    attention saves them or a checkpointed block keeps them as its inputs."""
    rows = _rope_rows(seq, split=split, micro_batch=micro_batch)
    if not rows or not layers:
        return 0
    checkpointed = any(_checkpoints_block(recompute, layer) for layer in layers)
    if dtypes.compute != FP32 and not checkpointed:
        return 0
    return 2 * rows * model.head_dim * FP32


def embedding_bytes_per_token(model: ModelSpec, *, dtypes: ActivationDtypes,
                              split: ActivationSplit = FP32_SPLIT,
                              recompute: RecomputeSpec | None = None) -> Fraction:
    """Under tp, the vocabulary-parallel embedding's output redistribution (DTensor) keeps
    copies beside the first block's input (measured on gloo ranks, not derived): two of the
    whole sequence without sequence parallel; with it, two of the rank's share, and a third
    unless block 0 is checkpointed whole (full, block, ops: its checkpoint keeps the input it
    was given, not the norm's own view); one more of the rank's share under FSDP. Nothing
    without tp."""
    if split.tp == 1:
        return Fraction(0)
    if not split.sequence_parallel:
        return Fraction(2 * dtypes.residual * model.dim)
    copies = 2 if recompute is not None and _checkpoints_block(recompute, 0) else 3
    return Fraction((copies + split.fsdp) * dtypes.residual * model.dim, split.tp)


def _checkpoints_block(recompute: RecomputeSpec, layer: int) -> bool:
    return recompute.applies_to(layer) and (
        RecomputeMode(recompute.mode) is RecomputeMode.full
        or bool({RecomputeTarget.block, RecomputeTarget.ops} & selective_targets(recompute)))


def head_bytes_per_token(model: ModelSpec, *, dtypes: ActivationDtypes,
                         split: ActivationSplit = FP32_SPLIT) -> Fraction:
    """The final norm (its core ÷ tp with SP; its output whole, all-gathered for the head),
    and the fp32 log-softmax of `logits.float()` that cross entropy keeps (4 bytes a logit,
    ÷ tp with loss_parallel, the whole vocabulary without). The targets are the batch's,
    not activations. In row blocks (loss_chunks > 1, training/loss.py) the head keeps no
    logits and not its input, only the input's gradient, taken in forward (residual dtype),
    and the weight's (`head_bytes_per_micro_batch`)."""
    core = Fraction(_norm_core(model, dtypes), split.sequence_share)
    if split.loss_chunks > 1:
        return core + dtypes.residual * model.dim
    return (core + _norm_output(model, dtypes, matmuls=1)
            + Fraction(FP32 * model.vocab_size, split.vocab_share))


def head_weight_bytes(model: ModelSpec, dtypes: ActivationDtypes) -> int:
    """The output head's weight (or the tied embedding's) as the head computes with it:
    fp32 under autocast (it casts per use), else the compute dtype (FSDP gathers it so)."""
    return model.vocab_size * model.dim * (FP32 if dtypes.autocast else dtypes.compute)


def head_bytes_per_micro_batch(model: ModelSpec, *, dtypes: ActivationDtypes,
                               split: ActivationSplit = FP32_SPLIT) -> int:
    """In row blocks (loss_chunks > 1): the head weight's gradient, taken in forward and kept
    until backward (the weight's dtype as the head computes with it); 0 otherwise."""
    return head_weight_bytes(model, dtypes) if split.loss_chunks > 1 else 0


def stage_output_bytes_per_token(model: ModelSpec, *, last: bool, dtypes: ActivationDtypes,
                                  split: ActivationSplit = FP32_SPLIT) -> Fraction:
    """A pipeline stage's output, which torch's schedule keeps for each micro-batch in flight
    until that micro-batch's backward (PipelineStage.fwd_cache; no block saves it): the last
    block's output (residual dtype, ÷ tp with SP) on a stage that sends it on; the logits
    (compute dtype, ÷ tp with loss_parallel, else the whole vocabulary) on the last stage."""
    if last:
        return Fraction(dtypes.compute * model.vocab_size, split.vocab_share)
    return Fraction(dtypes.residual * model.dim, split.sequence_share)


def loss_peak_bytes(model: ModelSpec, *, tokens: int, dtypes: ActivationDtypes,
                    split: ActivationSplit = FP32_SPLIT) -> int:
    """Bytes alive at the loss beyond what is kept: in backward the fp32 gradient of the
    log-softmax and the gradient of its input (8 bytes a logit), and in forward the logits
    themselves and, below fp32, their fp32 copy; the larger of the two.
    In row blocks (loss_chunks > 1) all of that, with the log-softmax, for one block's rows,
    while the head's input, the weight gradient's fp32 sum, one block's weight gradient and,
    under autocast, the weight's cast are alive too (training/loss.py `_ChunkedHeadLoss`)."""
    per_logit = max(2 * FP32, dtypes.compute + (FP32 if dtypes.compute != FP32 else 0))
    if split.loss_chunks == 1:
        return tokens * per_logit * model.vocab_size // split.vocab_share
    block = -(-tokens // split.loss_chunks)
    weight_cast = model.vocab_size * model.dim * dtypes.compute if dtypes.autocast else 0
    return (block * (FP32 + per_logit) * model.vocab_size + tokens * dtypes.residual * model.dim
            + model.vocab_size * model.dim * FP32 + head_weight_bytes(model, dtypes)
            + weight_cast)


def activation_elements_per_token_per_layer(model: ModelSpec, *, recompute: RecomputeSpec,
                                            device_type: str) -> int:
    """Elements one block keeps per token in fp32 (bytes / 4 of `block_bytes_per_token`;
    measured on CPU for every mode and every combination of targets in
    tests/unit/test_recompute.py, against the storages alive after forward).

    none: per norm its input, x*rsqrt, weight*normed and rsqrt (3d+1); q and k after RoPE; v;
    the attention output and its log-sum-exp (one per head; the output, stored [B, T, heads,
    head_dim], is also the output projection's input as a view); SwiGLU's gate, up, silu and
    product (4f).
    full, or selective with block: only the block input.
    selective ops: the block input, the q/k/v/out/gate/up/down matmul outputs, attention output +
    lse; with attention as well, not the attention output and lse.
    selective module targets, each taken off what none keeps:
      ffn: gate, up, silu and product (4f; its input, the MLP norm's output, is kept either
      way);
      swiglu: silu (f; gate and up are its checkpoint's inputs, the product is down's input);
      attention: only the lse (heads; q, k, v are its inputs, the output is the output
      projection's input);
      norm: x*rsqrt and rsqrt per norm (2(d+1); its output is the next matmul's input).
    offload: what none keeps, in host memory: nothing on a GPU, all of it on a CPU device.
    """
    per_token = block_bytes_per_token(model, recompute=recompute, device_type=device_type,
                                      dtypes=ActivationDtypes.uniform(FP32))
    return int(per_token) // FP32


def activation_bytes(model: ModelSpec, *, tokens: int, recompute: RecomputeSpec,
                     device_type: str, dtype_bytes: int = FP32,
                     dtypes: ActivationDtypes | None = None,
                     split: ActivationSplit = FP32_SPLIT, micro_batch: int = 1,
                     layers: list[int] | None = None, with_head: bool = True,
                     with_embedding: bool = True) -> int:
    """Bytes kept for backward in `device_type` memory by one micro-batch of `tokens` tokens
    (`micro_batch` sequences) in blocks `layers` (default: all), `with_head` the final norm
    and loss, `with_embedding` the embedding's own; `dtypes` (default: every activation `dtype_bytes`).
    The policy covers the blocks `RecomputeSpec.applies_to` picks; the other blocks keep
    what none keeps."""
    dtypes = dtypes or ActivationDtypes.uniform(dtype_bytes)
    none = RecomputeSpec(mode=RecomputeMode.none)
    layers = list(range(model.n_layers)) if layers is None else layers
    seq = tokens // micro_batch
    total = Fraction(0)
    for layer in layers:
        policy = recompute if recompute.applies_to(layer) else none
        moe = is_moe_block(model, layer)
        total += tokens * block_bytes_per_token(model, recompute=policy, device_type=device_type,
                                                dtypes=dtypes, split=split, moe=moe)
        total += block_bytes_per_micro_batch(model, recompute=policy, seq=seq,
                                             device_type=device_type, dtypes=dtypes,
                                             split=split, micro_batch=micro_batch, moe=moe)
    total += rope_rows_bytes(model, recompute=recompute, layers=layers, seq=seq,
                             dtypes=dtypes, split=split, micro_batch=micro_batch)
    total += document_mask_bytes(recompute=recompute, layers=layers, seq=seq,
                                 micro_batch=micro_batch, device_type=device_type,
                                 dtypes=dtypes, split=split)
    if with_head:
        total += tokens * head_bytes_per_token(model, dtypes=dtypes, split=split)
        total += head_bytes_per_micro_batch(model, dtypes=dtypes, split=split)
    if with_embedding:
        total += tokens * embedding_bytes_per_token(model, dtypes=dtypes, split=split,
                                                    recompute=recompute)
    return int(total)


def pipeline_in_flight(p: ParallelSpec, pp_rank: int) -> int:
    """Micro-batches x virtual stages (chunks) whose activations a pipeline rank holds at
    once: all of them under GPipe and looped BFS; under 1F1B the warm-up depth, pp - pp_rank; under
    interleaved 1F1B torch's warm-up (pipelining/schedules.py `_get_warmup_ops`) plus the
    chunk in its first backward: (v - 1) x micro-batches per round + 2 (pp - 1 - pp_rank) + 1.
    Each chunk holds one virtual stage's blocks (`pipeline_layers_per_chunk`)."""
    if p.pp == 1:
        return 1
    v, m = p.pp_virtual_stages, p.pp_microbatches
    if p.pp_schedule in ("gpipe", "looped_bfs"):  # every forward before any backward
        return m * v
    if v == 1:
        return min(m, p.pp - pp_rank)
    per_round = m // max(1, m // p.pp)
    return min(m * v, (v - 1) * per_round + 2 * (p.pp - 1 - pp_rank) + 1)
