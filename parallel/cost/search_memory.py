"""Per-rank memory of thousands of candidate layouts, as `meshrun plan --search` needs it:
exactly what parallel.cost.memory.estimate_memory returns for each candidate's spec, computed
from one transformer block's tensors x the blocks a pipeline rank holds (every block has the
same tensors), with each term memoised by what it reads. Torch-free.

memory.py is the reference: each function here names the one it mirrors, and calls the same
per-tensor and per-block primitives (params.tp_local_shape / fsdp_local_numel,
memory.autocast_keeps_copy / zero1_shares, the activations.py per-token terms); only the sums
over tensors and blocks are regrouped (a pipeline rank's L blocks count L times one block, the
blocks a recompute policy covers apart from the others). tests/unit/test_search_memory.py
compares every field with estimate_memory, byte for byte, over models, precisions, ZeRO
stages, tp / pp (virtual stages, every schedule) / cp and recompute policies; a new term in
memory.py must be mirrored here (that test fails until it is).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from conf.parallel_rules import SPLIT_BACKWARD_SCHEDULES
from conf.schema import RecomputeMode
from conf.spec import ParallelSpec, RecomputeSpec, RunSpec
from parallel.cost.activations import (
    DTYPE_BYTES, ActivationSplit, activation_dtypes, block_bytes_per_micro_batch,
    block_bytes_per_token, embedding_bytes_per_token, head_bytes_per_micro_batch,
    head_bytes_per_token, loss_peak_bytes,
    pipeline_in_flight, rope_rows_bytes,
)
from parallel.cost.memory import (
    PARAM_BYTES, STEP_BYTES, MemoryEstimate, autocast_cache_policy, autocast_keeps_copy,
    pipeline_output_bytes,
    zero1_shares,
)
from parallel.cost.params import (
    embedding_param, fsdp_local_numel, held_layers, held_parameters, numel, parameter_shapes,
    tp_local_shape,
)
from parallel.cost.peak import PhaseTerms, phase_terms
from parallel.cost.step_terms import rope_table_bytes
from parallel.cost.search_space import Candidate
from parallel.dims import ParallelDims
from training.models.family import block_index, block_param, block_path

NO_RECOMPUTE = RecomputeSpec(mode=RecomputeMode.none)
"""What the blocks a policy does not cover keep (as activations.activation_bytes has it)."""


@dataclass(frozen=True, slots=True)
class _Holding:
    """What one pipeline rank holds: its blocks, and the tensors outside them, in order."""

    layers: tuple[int, ...]
    root: tuple[tuple[str, tuple[int, ...]], ...]


class MemoryTable:
    """estimate_memory of candidates of one base spec (search_space.Candidate), memoised."""

    def __init__(self, base: RunSpec) -> None:
        self.base, self.model = base, base.model
        self.compute = DTYPE_BYTES[base.precision.compute_dtype.value]
        self.moment = 2 if base.precision.optimizer_state_dtype.value == "bf16" else 4
        self.device = base.training.device
        self.block = tuple((block_path(name), shape)
                           for name, shape in parameter_shapes(self.model)
                           if block_index(name) == 0)
        """One block's tensors: (name inside the block, shape)."""
        self._cache: dict[tuple, object] = {}
        self._last: tuple = (None, None)
        self._layout_keys: tuple = (None,)
        """The last candidate and its _pieces (the search asks floor, then peak, of one)."""

    def floor(self, candidate: Candidate) -> int:
        """A lower bound of peak(candidate).total without the step's phases: on each
        representative rank parameters, optimizer state, weight copies and RoPE tables, plus the larger of
        the kept activations with the loss's transient and the gradients (the loss's and the
        optimizer step's phases hold at least those: peak.PhaseTerms.phases)."""
        copies, kept, statics = self._pieces(candidate)
        tables = rope_table_bytes(self.model, candidate.parallel)  # resident in every phase
        return max(params + optimizer + copies[pp_rank] + tables
                   + max(sum(kept[pp_rank]), params) for pp_rank, params, optimizer in statics)

    def _pieces(self, candidate: Candidate) -> tuple:
        """(weight copies, (activations, loss peak)) per pipeline rank, and the statics."""
        if self._last[0] is candidate:
            return self._last[1]
        p, recompute = candidate.parallel, candidate.recompute
        if self._layout_keys[0] is not p:  # the candidates of one layout come one after another
            self._layout_keys = (p, *self._keys_of(p))
        _, copies_key, kept_key, statics = self._layout_keys
        copies = self._memo((*copies_key, None if p.uses_fsdp or self.compute >= PARAM_BYTES
                             else recompute), self._copies, p, recompute)
        kept = self._memo((*kept_key, candidate.micro_batch_size, recompute),
                          self._activations, p, candidate.micro_batch_size, recompute)
        self._last = (candidate, (copies, kept, statics))
        return copies, kept, statics

    def _keys_of(self, p: ParallelSpec) -> tuple[tuple, tuple, tuple]:
        """What the weight copies and the kept activations of layout `p` read of it (their
        memo keys, less the recompute policy and the micro-batch), and its statics."""
        fsdp = p.uses_fsdp
        copies = ("copies", *_layout(p), p.tp, fsdp, p.zero if fsdp else None,
                  p.pp_schedule in SPLIT_BACKWARD_SCHEDULES if fsdp else None)
        kept = ("act", *_layout(p), p.pp_schedule, p.pp_microbatches, p.tp,
                p.sequence_parallel, p.loss_parallel, p.cp, fsdp)
        statics = self._memo(("static", *_layout(p), p.tp, *_sharding(p)), self._statics, p)
        return copies, kept, statics

    def peak(self, candidate: Candidate) -> MemoryEstimate:
        """estimate_memory(candidate.spec(base)): of the representative ranks (pipeline-rank
        major, as memory.representative_ranks sorts them), the first with the largest total."""
        copies, kept, statics = self._pieces(candidate)
        terms = self._memo(self._phase_reads(candidate), self._phase_terms, candidate)
        best, most = None, -1
        for pp_rank, params, optimizer in statics:
            activations, loss_peak = kept[pp_rank]
            counts = dict(grads=params, optimizer=optimizer, activations=activations,
                          loss_peak=loss_peak)
            in_step = terms[pp_rank].peak(**counts)
            total = params + optimizer + copies[pp_rank] + in_step
            if total > most:
                best, most = (params, optimizer, copies[pp_rank], in_step, counts), total
        params, optimizer, copies, in_step, counts = best
        return MemoryEstimate(params=params, grads=params, optimizer=optimizer, master_weights=0,
                              weight_copies=copies, activations=counts["activations"],
                              loss_peak=counts["loss_peak"], in_step=in_step)

    def _phase_reads(self, candidate: Candidate) -> tuple:
        """What peak.phase_terms reads of a candidate besides the base spec (the key its terms
        are memoised by), generously: the blocks each pipeline rank holds, the schedule and
        its pipeline micro-batches (the chunks in flight); whether gradients outlive backward
        (DDP, accumulation); one pipeline micro-batch's sequences and the activation split
        (tp, sequence / loss parallel, cp, FSDP); whether zero 3 gathers the next unit; the
        recompute policy; and FSDP's shard count without a pipeline (the blocks' gradients)
        or off CUDA (where AdamW's temporaries can follow the rank's own tensors). Not keyed:
        how the data-parallel ranks otherwise split into replicas and shards. A term of
        peak.py that reads more must be keyed here (tests/unit/test_search_memory.py fails
        until it is)."""
        p = candidate.parallel
        shards = p.dp_shard * p.cp if p.uses_fsdp and (p.pp == 1 or self.device != "cuda") \
            else None
        return ("terms", *_layout(p), p.pp_schedule, p.pp_microbatches, p.uses_fsdp,
                p.zero == 3, p.tp, p.cp, p.sequence_parallel, p.loss_parallel,
                candidate.micro_batch_size // p.pp_microbatches, candidate.recompute,
                p.uses_ddp or candidate.grad_accum_steps > 1, shards)

    def _phase_terms(self, candidate: Candidate) -> tuple[PhaseTerms, ...]:
        """peak.phase_terms of each pipeline rank's representative rank (shard 0: what they
        read of the rank besides the pipeline stage is FSDP's shard index)."""
        spec = candidate.spec(self.base)
        dims = ParallelDims.from_spec(spec.parallel)
        return tuple(phase_terms(spec, dims.rank_of(
            {"pp": pp_rank, "dp_replicate": 0, "dp_shard": 0, "cp": 0, "tp": 0}))
            for pp_rank in range(spec.parallel.pp))

    def _memo(self, key: tuple, compute, *args):
        if key not in self._cache:
            self._cache[key] = compute(*args)
        return self._cache[key]

    def _holding(self, p: ParallelSpec, pp_rank: int) -> _Holding:
        key = ("holding", *_layout(p), pp_rank)
        if key not in self._cache:
            spec = replace(self.base, parallel=p)
            self._cache[key] = _Holding(
                layers=tuple(held_layers(spec, pp_rank)),
                root=tuple((n, s) for n, s in held_parameters(spec, pp_rank)
                           if block_index(n) is None))
        return self._cache[key]

    def _local(self, p: ParallelSpec, pp_rank: int) -> tuple[list, list]:
        """(root, one block): (name, full shape, tp-local shape) of each tensor."""
        held = self._holding(p, pp_rank)
        family = self.model.family
        return ([(n, s, tp_local_shape(n, s, p.tp, family)) for n, s in held.root],
                [(n, s, tp_local_shape(block_param(0, n), s, p.tp, family))
                 for n, s in self.block])

    def _statics(self, p: ParallelSpec) -> tuple[tuple[int, int, int], ...]:
        """(pp rank, parameter bytes, optimizer bytes) of each representative rank
        (memory.static_bytes of memory.representative_ranks)."""
        kind, shards = _sharding(p)
        # shard 0 of FSDP: the ceil-sized chunks
        size = ((lambda shape: fsdp_local_numel(shape, shards=shards, index=0))
                if kind == "fsdp" else numel)
        out = []
        for pp_rank in range(p.pp):
            if kind == "zero1":
                out += self._zero1_statics(p, pp_rank)
                continue
            root, block = self._local(p, pp_rank)
            blocks = len(self._holding(p, pp_rank).layers)
            elements = (sum(size(local) for _, _, local in root)
                        + blocks * sum(size(local) for _, _, local in block))
            tensors = len(root) + blocks * len(block)
            out.append((pp_rank, PARAM_BYTES * elements,
                        2 * self.moment * elements + STEP_BYTES * tensors))
        return tuple(out)

    def _zero1_statics(self, p: ParallelSpec, pp_rank: int) -> list[tuple[int, int, int]]:
        """ZeRO-1: one rank per distinct owner share, the first shard with it (the owners
        depend on the tensors' order: the rank's tensors are listed as memory.py lists them)."""
        spec = replace(self.base, parallel=p)
        sizes = tuple(numel(tp_local_shape(n, s, p.tp, self.model.family))
                      for n, s in held_parameters(spec, pp_rank))
        params = PARAM_BYTES * sum(sizes)
        first: dict[tuple[int, int], None] = {}
        for share in zero1_shares(sizes, p.dp_shard):
            first.setdefault(share, None)
        return [(pp_rank, params, 2 * self.moment * optimized + STEP_BYTES * tensors)
                for optimized, tensors in first]

    def _copies(self, p: ParallelSpec, recompute: RecomputeSpec) -> tuple[int, ...]:
        """memory.weight_copy_bytes of each pipeline rank."""
        return tuple(self._rank_copies(p, recompute, pp_rank) for pp_rank in range(p.pp))

    def _rank_copies(self, p: ParallelSpec, recompute: RecomputeSpec, pp_rank: int) -> int:
        root, block = self._local(p, pp_rank)
        layers = self._holding(p, pp_rank).layers
        block_size = sum(numel(local) for _, _, local in block)
        if p.uses_fsdp:
            if p.zero == 2 or p.pp > 1 and p.pp_schedule in SPLIT_BACKWARD_SCHEDULES:
                root_size = sum(numel(local) for _, _, local in root)
                return self.compute * (root_size + len(layers) * block_size)
            head_unit = sum(numel(local) for name, _, local in root
                            if name != embedding_param(self.model) or self.model.tie_embeddings)
            return self.compute * (head_unit + min(1, len(layers)) * block_size)
        if self.compute >= PARAM_BYTES:
            return 0
        recompute = autocast_cache_policy(recompute, pp=p.pp)
        keeps = (lambda name, shape: autocast_keeps_copy(
            name, shape, self.model, recompute, device_type=self.device,
            loss_chunks=self.base.training.loss_chunks))
        total = sum(numel(local) for name, shape, local in root if keeps(name, shape))
        for covered in (True, False):
            same = [layer for layer in layers if recompute.applies_to(layer) is covered]
            if same:
                total += len(same) * sum(numel(local) for name, shape, local in block
                                         if keeps(block_param(same[0], name), shape))
        return self.compute * total

    def _activations(self, p: ParallelSpec, micro_batch_size: int,
                     recompute: RecomputeSpec) -> tuple[tuple[int, int], ...]:
        """(memory.layout_activation_bytes, memory.loss_peak_bytes_of) of each pipeline rank."""
        micro_batch = micro_batch_size // p.pp_microbatches
        tokens = micro_batch * self.base.training.seq_len // p.cp
        split = ActivationSplit.of(p, loss_chunks=self.base.training.loss_chunks)
        dtypes = activation_dtypes(self.base.precision, uses_fsdp=p.uses_fsdp)
        gpipe = p.pp > 1 and p.pp_schedule == "gpipe"
        out = []
        for pp_rank in range(p.pp):
            blocks = self._memo(("blocks", *_layout(p), pp_rank, tokens, micro_batch,
                                 recompute, split, dtypes), self._blocks,
                                self._holding(p, pp_rank).layers, tokens, micro_batch,
                                recompute, split, dtypes)
            chunks = pipeline_in_flight(p, pp_rank)
            total = blocks * chunks // p.pp_virtual_stages if p.pp > 1 else blocks
            loss, heads = 0, 0
            if pp_rank == p.pp - 1:
                head, loss = self._memo(("head", tokens, split, dtypes), self._head, tokens,
                                        split, dtypes)
                heads = p.pp_microbatches if gpipe else 1
                total += heads * head
            if p.pp > 1:
                total += pipeline_output_bytes(self.model, chunks=chunks, heads=heads,
                                               tokens=tokens, dtypes=dtypes, split=split)
            if pp_rank == 0:
                total += (p.pp_microbatches if gpipe else chunks) * self._memo(
                    ("embedding", tokens, split, dtypes, recompute), self._embedding, tokens,
                    split, dtypes, recompute)
            out.append((total, loss))
        return tuple(out)

    def _head(self, tokens: int, split: ActivationSplit, dtypes) -> tuple[int, int]:
        """activation_bytes of the head alone (layers=[]), and the loss's transient."""
        return (int(tokens * head_bytes_per_token(self.model, dtypes=dtypes, split=split))
                + head_bytes_per_micro_batch(self.model, dtypes=dtypes, split=split),
                loss_peak_bytes(self.model, tokens=tokens, split=split, dtypes=dtypes))

    def _embedding(self, tokens: int, split: ActivationSplit, dtypes,
                   recompute: RecomputeSpec) -> int:
        """activation_bytes of the embedding alone (layers=[], with_head=False)."""
        return int(tokens * embedding_bytes_per_token(self.model, dtypes=dtypes, split=split,
                                                      recompute=recompute))

    def _blocks(self, layers: tuple[int, ...], tokens: int, micro_batch: int,
                recompute: RecomputeSpec, split: ActivationSplit, dtypes) -> int:
        """activations.activation_bytes of blocks `layers` (no head, no embedding): the blocks
        the policy covers count its per-block bytes, the others NO_RECOMPUTE's."""
        seq = tokens // micro_batch
        covered = sum(1 for layer in layers if recompute.applies_to(layer))
        per_block = self._memo(("block", recompute, tokens, seq, split, dtypes),
                               self._per_block, recompute, tokens, seq, split, dtypes)
        total = (covered * per_block[0] + (len(layers) - covered) * per_block[1]
                 + rope_rows_bytes(self.model, recompute=recompute, layers=list(layers),
                                   seq=seq, dtypes=dtypes, split=split))
        return int(total)

    def _per_block(self, recompute: RecomputeSpec, tokens: int, seq: int,
                   split: ActivationSplit, dtypes) -> tuple[Fraction, Fraction]:
        """Bytes one block keeps (per token x tokens + per micro-batch), under `recompute`
        and under NO_RECOMPUTE (exact fractions: activation_bytes rounds only the sum)."""
        return tuple(
            tokens * block_bytes_per_token(self.model, recompute=policy, device_type=self.device,
                                           dtypes=dtypes, split=split)
            + block_bytes_per_micro_batch(self.model, recompute=policy, seq=seq,
                                          device_type=self.device, dtypes=dtypes, split=split)
            for policy in (recompute, NO_RECOMPUTE))


def _layout(p: ParallelSpec) -> tuple:
    """What decides the blocks and tensors each pipeline rank holds."""
    return (p.pp, p.pp_virtual_stages, p.pp_layer_split)


def _sharding(p: ParallelSpec) -> tuple[str, int]:
    """What decides how a rank's parameter and optimizer bytes are split (memory.static_bytes):
    FSDP over dp_shard x cp, ZeRO-1 owners over dp_shard, or whole."""
    if p.uses_fsdp:
        return "fsdp", p.dp_shard * p.cp
    if p.zero == 1 and p.uses_ddp:
        return "zero1", p.dp_shard
    return "whole", 1
