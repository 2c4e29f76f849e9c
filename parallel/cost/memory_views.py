"""The views of a run spec that the memory terms read, each a small frozen dataclass. Torch-free.

The memory model (memory.py, memory_static.py, kept_activations.py, peak.py,
step_memory_terms.py) is one code path for the plan, the dry run, the sweep preview, the fit
check and `meshrun plan --search`. Each of its terms takes, keyword-only, the spec sections
and views it reads and nothing else, and is memoised on them (functools.lru_cache): a term
cannot read what it is not keyed by, so no cache key is written by hand. The views make those
arguments narrow, so that thousands of candidate layouts share what they have in common:
- `Holds`: what blocks and tensors each pipeline rank holds; `Stages`: that and the
  schedule (the chunks in flight);
- `Sharding`: how parameters and optimizer state are split (tp, FSDP shards, ZeRO-1 owners);
- `Regime`: one micro-batch's activations (tokens, dtypes, tp / cp split, device).
A rank is named by its `Place`: pipeline rank, FSDP shard index, ZeRO-1 owner index.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import NamedTuple

from conf.rules.split_rules import stage_split
from conf.spec import ParallelSpec, PrecisionSpec, TrainingSpec
from parallel.cost.activations import ActivationDtypes, ActivationSplit, activation_dtypes
from parallel.dims import ParallelDims

CACHE = 1 << 15
"""Entries each memoised term keeps (a search of 1,024 GPUs asks about 23,000 layouts)."""


class _HashedOnce:
    """A frozen dataclass view whose hash is computed once (views are memo keys, hashed on
    every lookup); equality stays field by field."""

    __slots__ = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(tuple(
            getattr(self, f.name) for f in fields(self) if f.compare)))

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True, slots=True)
class Holds(_HashedOnce):
    """What decides the blocks and tensors each pipeline rank holds."""

    pp: int
    pp_virtual_stages: int
    split: tuple[int, ...]
    """Blocks per stage (conf.rules.split_rules.stage_split)."""
    _hash: int = field(default=0, init=False, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class Stages(_HashedOnce):
    """The pipeline: its degree, virtual stages, schedule, micro-batches and blocks per stage
    (the field names are ParallelSpec's, so activations.pipeline_in_flight reads it too)."""

    pp: int
    pp_virtual_stages: int
    pp_schedule: str
    pp_microbatches: int
    holds: Holds
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    @property
    def n_stages(self) -> int:
        return self.pp * self.pp_virtual_stages


@dataclass(frozen=True, slots=True)
class Sharding(_HashedOnce):
    """How a rank's parameters, gradients and optimizer state are split."""

    tp: int
    fsdp: bool
    zero: int
    ddp: bool
    shards: int
    """FSDP shards (dp_shard x cp), 1 without FSDP."""
    owners: int
    """ZeRO-1 owners of the optimizer state (dp_shard), 1 without ZeRO-1."""
    ep: int = 1
    """Expert parallelism: the routed experts split over ep ranks (dim 0)."""
    expert_shards: int = 1
    """The routed experts' FSDP shards (dp x cp / ep) under ep > 1."""
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    @property
    def zero1(self) -> bool:
        return self.zero == 1 and self.ddp


@dataclass(frozen=True, slots=True)
class Regime(_HashedOnce):
    """One micro-batch's activations on a rank: its tokens (its pipeline micro-batch, its cp
    share), sequences, device, dtypes and tp / cp split."""

    tokens: int
    micro_batch: int
    device: str
    split: ActivationSplit
    dtypes: ActivationDtypes
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def kwargs(self) -> dict:
        """activations.activation_bytes' arguments (besides the model, layers, policy)."""
        return dict(tokens=self.tokens, micro_batch=self.micro_batch, device_type=self.device,
                    split=self.split, dtypes=self.dtypes)


@dataclass(frozen=True, slots=True)
class Place(_HashedOnce):
    """A rank, as the memory terms tell ranks apart."""

    pp_rank: int
    shard: int = 0
    """FSDP shard index (dp_shard x cp + cp); 0 without FSDP."""
    owner: int = 0
    """ZeRO-1 owner index (dp_shard); 0 without ZeRO-1."""
    _hash: int = field(default=0, init=False, repr=False, compare=False)


class Views(NamedTuple):
    """Every view of one spec (`views_of`)."""

    stages: Stages
    sharding: Sharding
    kept: Regime
    """The kept activations' regime (with data.document_mask)."""
    phase: Regime
    """The step phases' regime: as `kept`, without the document mask (peak.py's terms)."""
    accumulates: bool
    """training.grad_accum_steps > 1."""


@lru_cache(maxsize=CACHE)
def views_of(*, n_layers: int, parallel: ParallelSpec, training: TrainingSpec,
             precision: PrecisionSpec, document_mask: bool) -> Views:
    """The views of a spec whose model has `n_layers` blocks."""
    p, t = parallel, training
    stages, sharding, kept_split, phase_split, dtypes = _layout_views(
        n_layers=n_layers, parallel=p, precision=precision,
        document_mask=document_mask, loss_chunks=t.loss_chunks, compiled=t.compile)
    micro_batch = t.micro_batch_size // p.pp_microbatches
    tokens = micro_batch * t.seq_len // p.cp
    phase = _regime(tokens, micro_batch, t.device, phase_split, dtypes)
    kept = _regime(tokens, micro_batch, t.device, kept_split, dtypes)
    return Views(stages, sharding, kept, phase, t.grad_accum_steps > 1)


@lru_cache(maxsize=CACHE)
def _layout_views(*, n_layers: int, parallel: ParallelSpec, precision: PrecisionSpec,
                  document_mask: bool, loss_chunks: int, compiled: bool = False) -> tuple:
    p = parallel
    stages = Stages(p.pp, p.pp_virtual_stages, p.pp_schedule, p.pp_microbatches,
                    _holds(p.pp, p.pp_virtual_stages, tuple(stage_split(p, n_layers))))
    fsdp, zero1 = p.uses_fsdp, p.zero == 1 and p.uses_ddp
    sharding = Sharding(p.tp, fsdp, p.zero, p.uses_ddp, p.dp_shard * p.cp if fsdp else 1,
                        p.dp_shard if zero1 else 1, p.ep, p.expert_fsdp_shards if fsdp else 1)
    phase_split = ActivationSplit.of(p, loss_chunks=loss_chunks, compiled=compiled)
    kept_split = ActivationSplit.of(p, document_mask=True, loss_chunks=loss_chunks,
                                    compiled=compiled) \
        if document_mask else phase_split
    return stages, sharding, kept_split, phase_split, activation_dtypes(precision,
                                                                       uses_fsdp=fsdp)


@lru_cache(maxsize=CACHE)
def _holds(pp: int, virtual_stages: int, split: tuple[int, ...]) -> Holds:
    return Holds(pp, virtual_stages, split)


@lru_cache(maxsize=CACHE)
def _regime(tokens: int, micro_batch: int, device: str, split: ActivationSplit,
            dtypes: ActivationDtypes) -> Regime:
    """One Regime object per value (the memo keys of thousands of layouts share it)."""
    return Regime(tokens, micro_batch, device, split, dtypes)


def spec_views(spec) -> Views:
    """views_of a RunSpec."""
    return views_of(n_layers=spec.model.n_layers, parallel=spec.parallel, training=spec.training,
                    precision=spec.precision, document_mask=spec.data.document_mask)


def place_of(parallel: ParallelSpec, coords: dict[str, int]) -> Place:
    """The Place of the rank at mesh coordinates `coords` (parallel.dims.ParallelDims)."""
    shard = coords["dp_shard"] * parallel.cp + coords["cp"] if parallel.uses_fsdp else 0
    owner = coords["dp_shard"] if parallel.zero == 1 and parallel.uses_ddp else 0
    return Place(coords["pp"], shard, owner)


def rank_place(spec, rank: int) -> Place:
    """The Place of `rank` of a RunSpec's mesh."""
    return place_of(spec.parallel, ParallelDims.from_spec(spec.parallel).coordinates(rank))
