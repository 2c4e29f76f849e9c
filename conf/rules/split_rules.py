"""Rules between the parallel layout and the model, batch, precision and recompute sections.

Each rule names the key, the value, what it must satisfy and a fix; all are collected at once.
"""
from __future__ import annotations

from conf.errors import ProblemList
from conf.rules.field_rules import divisors
from conf.schema import RecomputeConfig, RecomputeMode, RecomputeTarget
from conf.spec import ModelSpec, ParallelSpec, TrainingSpec

RECOMPUTE_TARGETS = tuple(RecomputeTarget)


def check_model_split(p: ParallelSpec, *, model: ModelSpec, training: TrainingSpec,
                      problems: ProblemList) -> None:
    check_tensor_parallel(p, model=model, problems=problems)
    check_pipeline_split(p, model=model, training=training, problems=problems)
    check_sequence_split(p, seq_len=training.seq_len, problems=problems)
    check_loss_chunks(p, training=training, problems=problems)


def check_tensor_parallel(p: ParallelSpec, *, model: ModelSpec, problems: ProblemList) -> None:
    if p.tp == 1:
        return
    valid = ", ".join(map(str, divisors(model.n_kv_heads)))
    for key, count in (("n_heads", model.n_heads), ("n_kv_heads", model.n_kv_heads)):
        if count % p.tp:
            problems.add("parallel.tp", p.tp,
                         f"must divide model.{key}={count} (heads are split over tp ranks; "
                         "kv heads are not replicated)", f"use parallel.tp in {valid}")
    if model.vocab_size % p.tp:
        problems.add("parallel.tp", p.tp,
                     f"must divide model.vocab_size={model.vocab_size} (embedding and output "
                     "head are sharded over the vocabulary)",
                     f"use parallel.tp in {', '.join(map(str, divisors(model.vocab_size)[:8]))}")


def stage_split(p: ParallelSpec, n_layers: int) -> list[int]:
    """Blocks per stage (p.n_stages of them): the explicit split, or as even as possible
    (earlier stages +1). The one split every stage builder and the cost model use."""
    if p.pp_layer_split:
        return list(p.pp_layer_split)
    base, extra = divmod(n_layers, p.n_stages)
    return [base + (1 if s < extra else 0) for s in range(p.n_stages)]


def check_pipeline_split(p: ParallelSpec, *, model: ModelSpec, training: TrainingSpec,
                         problems: ProblemList) -> None:
    if p.pp == 1:
        if p.pp_layer_split:
            problems.add("parallel.pp_layer_split", list(p.pp_layer_split),
                         "only applies with parallel.pp>1", "remove it, or set parallel.pp")
        return
    stages = p.n_stages
    split = p.pp_layer_split
    if split and (len(split) != stages or sum(split) != model.n_layers or min(split) < 1):
        problems.add("parallel.pp_layer_split", list(split),
                     f"needs {stages} entries (pp x pp_virtual_stages), each >= 1, summing to "
                     f"model.n_layers={model.n_layers}", "fix the list, or leave it empty")
    if not split and model.n_layers % stages:
        problems.add("parallel.pp", p.pp,
                     f"pp({p.pp}) x pp_virtual_stages({p.pp_virtual_stages})={stages} stages "
                     f"must divide model.n_layers={model.n_layers}",
                     "change the degrees, or give parallel.pp_layer_split explicitly")
    if training.micro_batch_size % p.pp_microbatches:
        problems.add("parallel.pp_microbatches", p.pp_microbatches,
                     f"must divide training.micro_batch_size={training.micro_batch_size} "
                     "(each micro-batch is split into pipeline micro-batches)",
                     f"use training.micro_batch_size={p.pp_microbatches * max(1, training.micro_batch_size // p.pp_microbatches)}")


def check_sequence_split(p: ParallelSpec, *, seq_len: int, problems: ProblemList) -> None:
    """CP splits the sequence (into 2*cp chunks when balanced); SP splits each cp shard by tp."""
    chunks = p.cp * (2 if p.cp_balanced and p.cp > 1 else 1)
    sp = p.tp if p.sequence_parallel and p.tp > 1 else 1
    need = chunks * sp
    if need > 1 and seq_len % need:
        parts = []
        if p.cp > 1:
            parts.append(f"{'2 x ' if chunks > p.cp else ''}cp({p.cp})")
        if sp > 1:
            parts.append(f"tp({p.tp}) for sequence parallel")
        problems.add("training.seq_len", seq_len, f"must be divisible by {need} "
                     f"({' x '.join(parts)})", f"use training.seq_len={need * max(1, seq_len // need)}")


def check_loss_chunks(p: ParallelSpec, *, training: TrainingSpec,
                      problems: ProblemList) -> None:
    """training.loss_chunks: the head and loss in row blocks of one rank's micro-batch (the
    model's own forward, training/loss.py): not on a tensor-parallel head (loss_parallel
    splits those logits over tp instead) nor a pipeline's last stage (its schedule takes the
    whole logits)."""
    chunks, key = training.loss_chunks, "training.loss_chunks"
    if chunks < 1:
        problems.add(key, chunks, "must be >= 1 (1 = the whole logits at once)",
                     "give 1, or e.g. 8 to run the head and loss in 8 row blocks")
        return
    if chunks == 1:
        return
    if p.tp > 1:
        problems.add(key, chunks, f"needs parallel.tp=1 (here {p.tp}): the tensor-parallel "
                     "head is not run in row blocks", "use training.loss_chunks=1 with "
                     "parallel.loss_parallel=true (it splits the logits over tp instead)")
    if p.pp > 1:
        problems.add(key, chunks, f"needs parallel.pp=1 (here {p.pp}): the pipeline schedule "
                     "takes the last stage's whole logits", "use training.loss_chunks=1")
    rows = training.micro_batch_size * training.seq_len // p.cp
    if chunks > rows > 0:
        problems.add(key, chunks, f"must not exceed the {rows} token rows of one rank's "
                     f"micro-batch (micro_batch_size x seq_len / cp)",
                     f"use training.loss_chunks<={rows}")


def check_recompute(r: RecomputeConfig, problems: ProblemList) -> None:
    if r.every_n_layers < 1:
        problems.add("recompute.every_n_layers", r.every_n_layers, "must be >= 1",
                     "give 1 (every block) or N (every N-th block)")
    unknown = [t for t in r.targets if t not in RECOMPUTE_TARGETS]
    if unknown and r.mode is not RecomputeMode.selective:  # a typo, even where unused
        problems.add("recompute.targets", list(r.targets),
                     f"unknown target(s) {', '.join(unknown)} (targets apply to "
                     f"recompute.mode=selective; this run has mode={r.mode.value})",
                     f"choose from {', '.join(RECOMPUTE_TARGETS)}, or leave the default")
    if r.mode is not RecomputeMode.selective:
        return
    if unknown or not r.targets:
        problems.add("recompute.targets", list(r.targets),
                     "must name what to recompute" if not r.targets else
                     f"unknown target(s) {', '.join(unknown)}",
                     f"choose from {', '.join(RECOMPUTE_TARGETS)}")
    if RecomputeTarget.ops in r.targets and RecomputeTarget.ffn in r.targets:
        problems.add("recompute.targets", list(r.targets),
                     "ops already keeps every matmul output and cannot tell MLP matmuls from "
                     "attention ones, so ffn inside it would save nothing",
                     "use [ffn] (with swiglu/norm/attention if wanted) or [ops]")
