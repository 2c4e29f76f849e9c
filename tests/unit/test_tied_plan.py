"""Tied embeddings in the rules and the plan (torch-free): a tied model resolves under tp and pp;
the last pipeline stage holds a copy of the embedding (the first stage the other) and the
middle stages none; the copy under tp is the vocabulary-sharded one; the step's collectives
carry the copies' gradient all-reduce; and which ranks hold the copies is the first and the
last of every pipeline group. The gloo proof that the plan's bytes are each rank's is
tests/distributed/test_tied_layouts.py."""
from __future__ import annotations

from parallel.cost.comm import Link, step_collectives
from parallel.cost.memory import static_bytes
from parallel.cost.params import held_parameters, tp_local_shape
from parallel.dims import ParallelDims
from parallel.tied_embeddings import tied_copy_ranks
from tests.support.specs import cpu_spec

TIED = ("model=tiny", "model.n_layers=4", "model.tie_embeddings=true", "data=synthetic",
        "training.seq_len=32", "training.micro_batch_size=4")
EMBEDDING = "tok_embeddings.weight"
LINK = Link(name="x", gbps=1.0, latency_s=0.0)


def _spec(*overrides: str, world: int = 4):
    return cpu_spec(*TIED, f"cluster.procs_per_node={world}", *overrides)


def test_a_tied_model_resolves_under_tp_and_pp():
    spec = _spec("parallel=3d", "parallel.pp=2", "parallel.tp=2", "parallel.dp_shard=1", world=4)
    assert spec.model.tie_embeddings and (spec.parallel.pp, spec.parallel.tp) == (2, 2)


def test_the_first_and_last_stage_hold_the_tied_weight_and_no_other():
    spec = _spec("parallel=pp")  # pp=4, one block a stage
    held = [[name for name, _ in held_parameters(spec, pp_rank)] for pp_rank in range(4)]
    assert [EMBEDDING in names for names in held] == [True, False, False, True]
    assert held[3] == [EMBEDDING, "layers.3.attention_norm.weight", *held[3][2:]]
    embedding_bytes = 4 * spec.model.vocab_size * spec.model.dim
    untied = cpu_spec(*TIED, "model.tie_embeddings=false", "cluster.procs_per_node=4",
                      "parallel=pp")
    # the last stage: the untied head's weight is gone, the embedding's copy there instead
    assert static_bytes(spec, 3).params == static_bytes(untied, 3).params
    assert static_bytes(spec, 0).params == static_bytes(untied, 0).params == \
        static_bytes(spec, 1).params + embedding_bytes


def test_under_tp_each_copy_is_the_vocabulary_shard():
    """Each stage's copy weighs what the untied model holds there under tp=2 (the embedding
    on the first stage, the vocabulary-sharded head on the last)."""
    layout = ("cluster.procs_per_node=4", "parallel=pp", "parallel.pp=2", "parallel.tp=2")
    tied = cpu_spec(*TIED, *layout)
    untied = cpu_spec(*TIED, "model.tie_embeddings=false", *layout)
    assert [static_bytes(tied, rank) for rank in range(4)] == \
        [static_bytes(untied, rank) for rank in range(4)]
    model = tied.model
    assert tp_local_shape(EMBEDDING, (model.vocab_size, model.dim), 2, model.family) == \
        (model.vocab_size // 2, model.dim)


def test_the_step_all_reduces_the_copies_gradient_once():
    def tied_reductions(spec):
        return [c for c in step_collectives(spec, ranks_per_node=8, intra=LINK, inter=LINK)
                if c.axis == "pp" and c.op == "all_reduce"]

    spec = _spec("parallel=pp", "parallel.pp=2", "parallel.dp_shard=2", "parallel.zero=3")
    [reduction] = tied_reductions(spec)
    assert (reduction.group, reduction.calls) == (2, 1)
    assert reduction.size_bytes == 4 * spec.model.vocab_size * spec.model.dim / 2  # an FSDP shard
    assert not tied_reductions(cpu_spec(*TIED, "model.tie_embeddings=false",
                                        "cluster.procs_per_node=4", "parallel=pp"))


def test_the_copies_live_on_the_first_and_last_rank_of_every_pipeline():
    spec = _spec("parallel=pp", "parallel.pp=4", "parallel.dp_replicate=2", world=8)
    assert tied_copy_ranks(ParallelDims.from_spec(spec.parallel)) == [[0, 6], [1, 7]]
