"""The activations a pipeline rank keeps at its fullest, and the loss's transient. Torch-free.

Per pipeline rank: the chunks in flight, each with one virtual stage's blocks (the rank's
blocks / virtual stages), in the run's dtype regime and tp/sp/cp split (activations.py); the
head on the last pipeline rank, for one micro-batch (for all of them under GPipe); the
embedding's on the first; and the stage outputs the schedule keeps. A rank's blocks differ
only in whether the recompute policy covers them, so each kind's bytes are counted once x
its blocks (exact fractions, rounded once, as activations.activation_bytes rounds). Each term
is memoised on its keyword arguments (memory_views.py).
"""
from __future__ import annotations

from collections import Counter
from fractions import Fraction
from functools import lru_cache

from conf.schema import RecomputeMode
from conf.spec import ModelSpec, RecomputeSpec
from parallel.cost.activations import (
    ActivationDtypes,
    ActivationSplit,
    activation_bytes,
    block_bytes_per_micro_batch,
    block_bytes_per_token,
    document_mask_bytes,
    loss_peak_bytes,
    pipeline_in_flight,
    rope_rows_bytes,
    stage_output_bytes_per_token,
)
from parallel.cost.expert_activations import is_moe_block
from parallel.cost.memory_static import holding
from parallel.cost.memory_views import CACHE, Regime, Stages

NO_RECOMPUTE = RecomputeSpec(mode=RecomputeMode.none)
"""What the blocks a policy does not cover keep (as activations.activation_bytes has it)."""


@lru_cache(maxsize=CACHE)
def activation_rows(*, model: ModelSpec, stages: Stages, kept: Regime, phase: Regime,
                    recompute: RecomputeSpec) -> tuple[tuple[int, int], ...]:
    """(kept activations, the loss's transient: on the last rank, in the `phase` regime) of
    each pipeline rank."""
    loss = loss_transient_bytes(model=model, regime=phase)
    return tuple((kept_activation_bytes(model=model, stages=stages, regime=kept,
                                        recompute=recompute, pp_rank=pp_rank),
                  loss if pp_rank == stages.pp - 1 else 0) for pp_rank in range(stages.pp))


def kept_activation_bytes(*, model: ModelSpec, stages: Stages, regime: Regime,
                          recompute: RecomputeSpec, pp_rank: int) -> int:
    """Activation bytes pipeline rank `pp_rank` keeps at its fullest (module docstring)."""
    s = stages
    layers = holding(model=model, holds=s.holds, tp=regime.split.tp, pp_rank=pp_rank).layers
    blocks = blocks_kept_bytes(model=model, layers=layers, regime=regime, recompute=recompute)
    chunks = pipeline_in_flight(s, pp_rank)
    gpipe = s.pp > 1 and s.pp_schedule == "gpipe"
    total = blocks * chunks // s.pp_virtual_stages if s.pp > 1 else blocks
    heads = 0
    if pp_rank == s.pp - 1:
        heads = s.pp_microbatches if gpipe else 1
        total += heads * end_kept_bytes(model=model, regime=regime, recompute=recompute,
                                        head=True)
    if pp_rank == 0:
        first = s.pp_microbatches if gpipe else chunks
        total += first * end_kept_bytes(model=model, regime=regime, recompute=recompute,
                                        head=False)
    if s.pp > 1:
        total += pipeline_output_bytes(model, chunks=chunks, heads=heads, tokens=regime.tokens,
                                       dtypes=regime.dtypes, split=regime.split)
    return total


@lru_cache(maxsize=CACHE)
def blocks_kept_bytes(*, model: ModelSpec, layers: tuple[int, ...], regime: Regime,
                      recompute: RecomputeSpec) -> int:
    """activations.activation_bytes of blocks `layers` alone (no head, no embedding): the
    blocks the policy covers count its per-block bytes, the others NO_RECOMPUTE's; dense
    and mixture-of-experts blocks apart."""
    kinds = Counter((recompute.applies_to(layer), is_moe_block(model, layer))
                    for layer in layers)
    total = Fraction(0)
    for (covered, moe), count in kinds.items():
        total += count * one_block_bytes(model=model, regime=regime, moe=moe,
                                         policy=recompute if covered else NO_RECOMPUTE)
    seq = regime.tokens // regime.micro_batch
    total += rope_rows_bytes(model, recompute=recompute, layers=list(layers), seq=seq,
                             dtypes=regime.dtypes, split=regime.split,
                             micro_batch=regime.micro_batch)
    total += document_mask_bytes(recompute=recompute, layers=list(layers), seq=seq,
                                 micro_batch=regime.micro_batch, device_type=regime.device,
                                 dtypes=regime.dtypes, split=regime.split)
    return int(total)


@lru_cache(maxsize=CACHE)
def one_block_bytes(*, model: ModelSpec, regime: Regime, policy: RecomputeSpec,
                    moe: bool = False) -> Fraction:
    """Bytes one block (`moe`: a mixture-of-experts one) under `policy` keeps for one
    micro-batch (exact: per token x tokens, plus per micro-batch)."""
    seq = regime.tokens // regime.micro_batch
    return (regime.tokens * block_bytes_per_token(model, recompute=policy,
                                                  device_type=regime.device,
                                                  dtypes=regime.dtypes, split=regime.split,
                                                  moe=moe)
            + block_bytes_per_micro_batch(model, recompute=policy, seq=seq,
                                          device_type=regime.device, dtypes=regime.dtypes,
                                          split=regime.split, micro_batch=regime.micro_batch,
                                          moe=moe))


@lru_cache(maxsize=CACHE)
def end_kept_bytes(*, model: ModelSpec, regime: Regime, recompute: RecomputeSpec,
                   head: bool) -> int:
    """activations.activation_bytes of the head alone (`head`) or of the embedding alone."""
    return activation_bytes(model, recompute=recompute, layers=[], with_head=head,
                            with_embedding=not head, **regime.kwargs())


def pipeline_output_bytes(model: ModelSpec, *, chunks: int, heads: int, tokens: int,
                          dtypes: ActivationDtypes, split: ActivationSplit) -> int:
    """The stage outputs a pipeline rank's schedule keeps (activations.stage_output_bytes_
    per_token): of its `chunks` in flight, `heads` ran the last stage (logits), the others
    send their output on."""
    return (heads * stage_output_bytes(model, last=True, tokens=tokens, dtypes=dtypes,
                                       split=split)
            + (chunks - heads) * stage_output_bytes(model, last=False, tokens=tokens,
                                                    dtypes=dtypes, split=split))


@lru_cache(maxsize=CACHE)
def stage_output_bytes(model: ModelSpec, *, last: bool, tokens: int, dtypes: ActivationDtypes,
                       split: ActivationSplit) -> int:
    """One micro-batch's stage output (the logits on the last stage), whole bytes."""
    return int(tokens * stage_output_bytes_per_token(model, last=last, dtypes=dtypes,
                                                     split=split))


@lru_cache(maxsize=CACHE)
def loss_transient_bytes(*, model: ModelSpec, regime: Regime) -> int:
    """The transient at the loss (activations.loss_peak_bytes) of one micro-batch."""
    return loss_peak_bytes(model, tokens=regime.tokens, split=regime.split,
                           dtypes=regime.dtypes)
