"""Bytes per rank under a parallel layout: parameters, gradients, optimizer state, weight
copies, activations and the step's fullest phase. Torch-free.

The one memory model: the plan, the dry run, the sweep preview, the fit check and
`meshrun plan --search` all ask `estimate_memory` (or `LayoutMemory`, the same for spec
sections the search has not put together into a RunSpec). Its terms are in
memory_static.py (parameters, gradients, AdamW state, weight copies), kept_activations.py,
peak.py and step_memory_terms.py (the step's phases); each takes the views of the spec it
reads (memory_views.py) and is memoised on them, so thousands of layouts share what they
have in common and no cache key is written by hand. tests/distributed compare the static
bytes, the activations and the peak with what gloo ranks really hold;
tests/unit/test_memory_cache.py compares the memoised model with itself uncached.
"""
from __future__ import annotations

from dataclasses import dataclass

from conf.spec import (
    ModelSpec, ParallelSpec, PrecisionSpec, RecomputeSpec, RunSpec, TrainingSpec,
)
from parallel.cost import kept_activations, memory_static, memory_views, params, peak
from parallel.cost import step_memory_terms
from parallel.cost.activations import DTYPE_BYTES
from parallel.cost.kept_activations import activation_rows
from parallel.cost.memory_static import (
    StaticBytes,
    representative_places,
    static_of,
    static_rows,
    weight_copies,
)
from parallel.cost.memory_views import Place, rank_place, spec_views, views_of
from parallel.cost.optimizer_state import uses_muon
from parallel.cost.peak import phase_rows, phase_terms_of
from parallel.cost.step_memory_terms import rope_table_bytes
from parallel.dims import ParallelDims


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """Bytes per rank. Parameters stay fp32 (they are the master weights under autocast)."""

    params: int
    grads: int
    optimizer: int
    master_weights: int
    weight_copies: int
    """Compute-dtype copies of the weights held from forward to backward (weight_copy_bytes)."""
    activations: int
    loss_peak: int = 0
    """Transient bytes at the loss beyond the kept activations (activations.loss_peak_bytes)."""
    in_step: int
    """Bytes alive at the step's fullest phase beyond parameters, optimizer state and weight
    copies: gradients, activations, transients, recompute working set, collective buffers
    (parallel.cost.peak.step_peak_bytes)."""

    @property
    def static(self) -> int:
        """What stays between steps: parameters, gradients, optimizer state."""
        return self.params + self.grads + self.optimizer + self.master_weights

    @property
    def total(self) -> int:
        """The peak: parameters, optimizer state and weight copies, plus the fullest phase
        of the step (the loss, a block's backward or the optimizer step)."""
        return self.params + self.optimizer + self.master_weights + self.weight_copies \
            + self.in_step


def estimate_memory(spec: RunSpec, *, rank: int | None = None) -> MemoryEstimate:
    """Bytes `rank` holds under the run's layout (default: the rank that holds the most).

    Parameters, gradients and optimizer state are exact (`static_bytes`; checked on every
    rank in tests/distributed). Activations: the per-block counts measured on one process,
    for this rank's tokens (micro-batch / pipeline micro-batches / cp), its blocks, and the
    pipeline chunks in flight, in the run's dtype regime and tp/sp/cp split."""
    layout = layout_memory(spec)
    return layout.fullest() if rank is None else layout.at(rank_place(spec, rank))


class LayoutMemory:
    """The memory of one spec's ranks, from its sections (a search asks thousands of layouts
    without putting each into a RunSpec): every term memoised on the views it reads; the
    rows of a layout's representative ranks are read once, for `floor` and `fullest`."""

    __slots__ = ("model", "views", "precision", "recompute", "muon", "statics", "copies",
                 "kept")

    def __init__(self, *, model: ModelSpec, parallel: ParallelSpec, training: TrainingSpec,
                 precision: PrecisionSpec, recompute: RecomputeSpec,
                 document_mask: bool, muon: bool = False) -> None:
        self.model, self.precision, self.recompute = model, precision, recompute
        self.muon = muon
        """optim=muon: its matrices keep one buffer, not two moments (optimizer_state.py)."""
        v = self.views = views_of(n_layers=model.n_layers, parallel=parallel, training=training,
                                  precision=precision, document_mask=document_mask)
        moment = 2 if precision.optimizer_state_dtype.value == "bf16" else 4
        self.statics: tuple[tuple[Place, StaticBytes], ...] = static_rows(
            model=model, holds=v.stages.holds, sharding=v.sharding, moment_bytes=moment,
            muon=muon)
        """(place, static bytes) of each representative rank, in rank order."""
        self.copies: tuple[int, ...] = weight_copies(
            model=model, stages=v.stages, sharding=v.sharding,
            compute_bytes=DTYPE_BYTES[precision.compute_dtype.value], recompute=recompute,
            device_type=v.phase.device, loss_chunks=v.phase.split.loss_chunks)
        """Weight copy bytes of each pipeline rank."""
        self.kept: tuple[tuple[int, int], ...] = activation_rows(
            model=model, stages=v.stages, kept=v.kept, phase=v.phase, recompute=recompute)
        """(kept activations, the loss's transient) of each pipeline rank."""

    def fullest(self) -> MemoryEstimate:
        """The rank that holds the most: of the representative ranks (memory_static.
        representative_places, in rank order) the first with the largest total."""
        best, most = None, -1
        terms = phase_rows(model=self.model, views=self.views, precision=self.precision,
                           recompute=self.recompute,
                           places=tuple(place for place, _ in self.statics))
        for (place, static), phases in zip(self.statics, terms):
            activations, loss_peak = self.kept[place.pp_rank]
            in_step = phases.peak(grads=static.grads, optimizer=static.optimizer,
                                  activations=activations, loss_peak=loss_peak)
            total = static.params + static.optimizer + self.copies[place.pp_rank] + in_step
            if total > most:
                best, most = (place, static, in_step), total
        return self.at(*best)

    def floor(self) -> int:
        """A lower bound of fullest().total without the step's phases: on each
        representative rank parameters, optimizer state, weight copies and RoPE tables, plus
        the larger of the kept activations with the loss's transient and the gradients (the
        loss's and the optimizer step's phases hold at least those: peak.PhaseTerms.phases).
        A search skips a layout whose floor already exceeds what it can use."""
        tables = rope_table_bytes(self.model, self.views.stages)  # resident in every phase
        return max(static.params + static.optimizer + self.copies[place.pp_rank] + tables
                   + max(sum(self.kept[place.pp_rank]), static.params)
                   for place, static in self.statics)

    def in_step(self, place: Place, static: StaticBytes) -> int:
        """The fullest phase of the rank's step beyond parameters, optimizer state and
        weight copies (peak.py)."""
        terms = phase_terms_of(model=self.model, views=self.views, precision=self.precision,
                               recompute=self.recompute, place=place)
        activations, loss_peak = self.kept[place.pp_rank]
        return terms.peak(grads=static.grads, optimizer=static.optimizer,
                          activations=activations, loss_peak=loss_peak)

    def at(self, place: Place, static: StaticBytes | None = None,
           in_step: int | None = None) -> MemoryEstimate:
        """The rank at `place`."""
        if static is None:
            static = self.static(place)
        if in_step is None:
            in_step = self.in_step(place, static)
        activations, loss_peak = self.kept[place.pp_rank]
        return MemoryEstimate(params=static.params, grads=static.grads,
                              optimizer=static.optimizer, master_weights=0,
                              weight_copies=self.copies[place.pp_rank],
                              activations=activations, loss_peak=loss_peak, in_step=in_step)

    def static(self, place: Place) -> StaticBytes:
        moment = 2 if self.precision.optimizer_state_dtype.value == "bf16" else 4
        return static_of(model=self.model, holds=self.views.stages.holds,
                         sharding=self.views.sharding, moment_bytes=moment, place=place,
                         muon=self.muon)


def layout_memory(spec: RunSpec) -> LayoutMemory:
    """The LayoutMemory of a RunSpec."""
    return LayoutMemory(model=spec.model, parallel=spec.parallel, training=spec.training,
                        precision=spec.precision, recompute=spec.recompute,
                        document_mask=spec.data.document_mask, muon=uses_muon(spec.optim))


def representative_ranks(spec: RunSpec) -> list[int]:
    """Ranks among which the fullest is (memory_static.representative_places)."""
    views, dims = spec_views(spec), ParallelDims.from_spec(spec.parallel)
    places = representative_places(model=spec.model, holds=views.stages.holds,
                                   sharding=views.sharding)
    return sorted(dims.rank_of({"pp": place.pp_rank, "dp_replicate": 0,
                                "dp_shard": place.owner, "cp": 0, "tp": 0})
                  for place in places)


# One rank's terms, as the plan's per-rank views and the distributed tests ask them.

def static_bytes(spec: RunSpec, rank: int) -> StaticBytes:
    """Parameters, gradients and optimizer state `rank` holds after an optimizer step."""
    return layout_memory(spec).static(rank_place(spec, rank))


def weight_copy_bytes(spec: RunSpec, rank: int) -> int:
    """Bytes of compute-dtype weight copies `rank` holds from forward to backward
    (memory_static.weight_copies)."""
    return layout_memory(spec).copies[rank_place(spec, rank).pp_rank]


def layout_activation_bytes(spec: RunSpec, rank: int) -> int:
    """Activation bytes `rank` keeps at its fullest (kept_activations.py)."""
    return layout_memory(spec).kept[rank_place(spec, rank).pp_rank][0]


def loss_peak_bytes_of(spec: RunSpec, rank: int) -> int:
    """The transient at the loss (activations.loss_peak_bytes) on the last pipeline rank."""
    return layout_memory(spec).kept[rank_place(spec, rank).pp_rank][1]


def clear_memory_caches() -> None:
    """Empty every memoised term of the memory model (and what they memoise beneath them:
    parameter shapes and placements), as tests/unit/test_memory_cache.py does to compare
    the memoised model with an evaluation from empty caches."""
    for module in (memory_views, memory_static, kept_activations, peak, step_memory_terms,
                   params):
        for value in vars(module).values():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()
