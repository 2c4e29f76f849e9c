"""The layouts `meshrun plan --search` tries: every combination of the parallel degrees, ZeRO
stage, sequence parallel, pipeline schedule / virtual stages / pipeline micro-batches,
micro-batch size and recompute policy that resolve()'s own rules accept. Torch-free, no Hydra.

No rule is restated here: each candidate goes through the functions resolve() itself calls
(conf.rules.parallel_rules.check_zero / check_pipeline_options,
conf.rules.split_rules.check_model_split / check_pipeline_split / check_recompute,
conf.rules.training_rules.resolve_batch),
each asked as soon as its inputs are known (degrees, then schedule, then batch), so a
candidate is dropped at the first rule it breaks; what each rule dropped is counted by its
key. tests/unit/test_plan_search.py checks the result against resolve() itself, point by point. The domains tried:
- degrees: every ordered factorisation of the world size into dp_replicate, dp_shard, tp, pp, cp;
- ep (parallel.ep) for a mixture-of-experts model: every divisor of dp_shard x cp that
  conf.rules.expert_rules.check_expert_parallel accepts (sequence parallel off with it);
- zero 0-3; sequence_parallel on when tp > 1 (off keeps more activations for the same
  communication volume, so it is never the better layout; the base config's value at tp=1);
  loss_parallel on when tp > 1 for the same reason (the logits and their gradient stay split
  over tp instead of gathered: a tp-th of the loss's memory, no all-gather; torchtitan's
  70B on 256 H100s is FSDP 32 x TP 8 with it, 215 GiB planned without, about 51 with);
- pp > 1: every schedule of PP_SCHEDULES, virtual stages 1 (flat schedules) or
  VIRTUAL_STAGES (interleaved ones); the micro-batch is all the sequences a dp rank reads per step
  (grad_accum_steps=1: accumulating over pipeline flushes adds a bubble per flush and keeps
  no fewer micro-batches in flight), split into one pipeline micro-batch per sequence (the
  most micro-batches: the smallest bubble, and the least each in-flight micro-batch keeps);
- cp: degrees that leave each cp rank at least MIN_CP_TOKENS tokens of the sequence;
- pp = 1: micro_batch_size every divisor of the sequences each dp rank reads per step
  (grad_accum_steps derived); the global batch is fixed by the caller;
- recompute: the policies the caller passes (the recompute group's options).
training.loss_chunks is the base's, except that parallel.cost.search retries a layout that does
not fit with the head and loss in row blocks (tp = pp = 1; SEARCH_LOSS_CHUNKS). Everything else
(cp_balanced, precision, compile, ...) is the base config's; launcher.plan.knob_refine tries
compile and fp8 on the top layouts.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterator

from conf.errors import ProblemList
from conf.rules.expert_rules import check_expert_parallel
from conf.rules.family_rules import check_family_recompute
from conf.rules.parallel_rules import PP_SCHEDULES, check_pipeline_options, check_zero
from conf.rules.field_rules import divisors
from conf.rules.training_rules import resolve_batch
from conf.schema import RecomputeConfig, RunConfig
from conf.degrees import DEGREES
from conf.spec import (ModelSpec, ParallelSpec, RecomputeSpec, RunSpec, TrainingSpec,
                       spec_from_config)
from conf.rules.split_rules import check_model_split, check_pipeline_split, check_recompute
from training.models import family_of

MIN_CP_TOKENS = 2048
"""Context parallel below this many tokens per rank spends more on the K/V ring than it saves."""
VIRTUAL_STAGES = (2, 4)
"""Stages per rank tried with the interleaved schedules (each more shrinks the bubble and adds
a round of point-to-point sends)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One layout resolve() accepts: the spec sections that differ from the base spec."""

    parallel: ParallelSpec
    micro_batch_size: int
    grad_accum_steps: int
    recompute_name: str
    """The recompute group option (a sweep point selects it as `recompute=<name>`)."""
    recompute: RecomputeSpec
    loss_chunks: int = 0
    """training.loss_chunks when the search chose it (a layout that fits only with the head
    and loss in row blocks); 0 = the base's."""

    def with_loss_chunks(self, chunks: int) -> "Candidate":
        return replace(self, loss_chunks=chunks)

    def spec(self, base: RunSpec, trainings: dict | None = None) -> RunSpec:
        """The run spec of this candidate: the base spec with its sections replaced.
        `trainings`: training sections already built from `base`, by batch (the search builds
        thousands of specs from a few batches)."""
        return replace(base, parallel=self.parallel, training=self.training(base, trainings),
                       recompute=self.recompute)

    def training(self, base: RunSpec, trainings: dict | None = None) -> TrainingSpec:
        """The training section of `spec`: the base's with this candidate's batch."""
        chunks = self.loss_chunks or base.training.loss_chunks
        batch = (self.micro_batch_size, self.grad_accum_steps,
                 self.micro_batch_size * self.grad_accum_steps * self.parallel.dp, chunks)
        trainings = {} if trainings is None else trainings
        if batch not in trainings:
            trainings[batch] = replace(base.training, micro_batch_size=batch[0],
                                       grad_accum_steps=batch[1], global_batch_size=batch[2],
                                       loss_chunks=chunks)
        return trainings[batch]


def factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every ordered tuple of `parts` positive integers whose product is `n`."""
    if parts == 1:
        return [(n,)]
    return [(d, *rest) for d in divisors(n) for rest in factorizations(n // d, parts - 1)]


def pipeline_shapes(pp: int, base_schedule: str) -> list[tuple[str, int]]:
    """(schedule, virtual stages) to try for `pp`: the base schedule alone without pipelining."""
    if pp == 1:
        return [(base_schedule, 1)]
    return [(schedule, v) for schedule, interleaved in PP_SCHEDULES.items()
            for v in (VIRTUAL_STAGES if interleaved else (1,))]


def valid_policies(policies: dict[str, RecomputeConfig], rejected: Counter, *,
                   model: ModelSpec) -> dict[str, RecomputeSpec]:
    """The recompute policies check_recompute and the model's family (its recompute targets,
    its matmul order) accept, as specs."""
    kept = {}
    for name, policy in policies.items():
        problems = ProblemList()
        check_recompute(policy, problems)
        check_family_recompute(model, policy, problems)
        if _count(problems, rejected):
            kept[name] = spec_from_config(RecomputeSpec, policy)
    return kept


def enumerate_candidates(cfg: RunConfig, base: RunSpec, *, global_batch_size: int,
                         policies: dict[str, RecomputeConfig],
                         rejected: Counter) -> Iterator[Candidate]:
    """Every candidate resolve() accepts for `cfg` (composed) whose other sections resolved
    into `base`, at `global_batch_size` sequences per step; `rejected` counts, by rule key,
    the combinations the rules dropped (each rule is asked as soon as its inputs are known)."""
    recompute = valid_policies(policies, rejected, model=base.model)
    shapes: dict[int, list[tuple[str, int]]] = {}
    for degrees in factorizations(base.world_size, len(DEGREES)):
        given = dict(zip(DEGREES, degrees))
        if not _degrees_pass(given, cfg, base, global_batch_size, rejected):
            continue
        if given["pp"] not in shapes:
            shapes[given["pp"]] = _valid_shapes(given["pp"], cfg, base, rejected)
        for zero in range(4):
            problems = ProblemList()
            check_zero(zero, given, problems)
            if not _count(problems, rejected):
                continue
            for ep in ep_degrees(replace(base.parallel, **given, zero=zero), base, rejected):
                for schedule, virtual in shapes[given["pp"]]:
                    sp = ((given["tp"] > 1 or cfg.parallel.sequence_parallel)
                          and not (ep > 1 and given["tp"] > 1))
                    yield from _batch_choices(
                        replace(base.parallel, **given, zero=zero, pp_schedule=schedule,
                                sequence_parallel=sp, ep=ep,
                                loss_parallel=given["tp"] > 1 or cfg.parallel.loss_parallel,
                                pp_virtual_stages=virtual, pp_layer_split=()),
                        cfg, base, global_batch_size, recompute, rejected)


def ep_degrees(layout: ParallelSpec, base: RunSpec, rejected: Counter) -> list[int]:
    """The expert-parallel degrees to try: 1, and for a mixture-of-experts model every divisor
    of dp_shard x cp > 1 that check_expert_parallel accepts (with sequence parallel off when
    tp > 1, as that rule asks)."""
    if not family_of(base.model).routed_experts(base.model):
        return [1]
    kept = [1]
    for ep in divisors(layout.dp_shard * layout.cp)[1:]:
        problems = ProblemList()
        check_expert_parallel(replace(layout, ep=ep, sequence_parallel=False), model=base.model,
                              problems=problems)
        if _count(problems, rejected):
            kept.append(ep)
    return kept


def _degrees_pass(given: dict[str, int], cfg: RunConfig, base: RunSpec,
                  global_batch_size: int, rejected: Counter) -> bool:
    """The rules on the degrees alone (tp against the model and precision, cp/sp against the
    sequence, pp against the layers, dp against the global batch), and the search's cp floor.
    check_model_split is asked on a probe with one stage per rank and as many pipeline
    micro-batches as stages, so only the schedule-free rules can fire."""
    if given["cp"] > 1 and base.training.seq_len < given["cp"] * MIN_CP_TOKENS:
        rejected["search: cp leaves fewer than MIN_CP_TOKENS tokens per rank"] += 1
        return False
    if global_batch_size % (given["dp_replicate"] * given["dp_shard"]):
        rejected["training.global_batch_size"] += 1
        return False
    probe = replace(base.parallel, **given, pp_virtual_stages=1, pp_microbatches=given["pp"],
                    pp_layer_split=(),
                    sequence_parallel=given["tp"] > 1 or cfg.parallel.sequence_parallel)
    problems = ProblemList()
    check_model_split(probe, model=base.model, problems=problems,
                      training=replace(base.training, micro_batch_size=given["pp"]))
    return _count(problems, rejected)


def _valid_shapes(pp: int, cfg: RunConfig, base: RunSpec,
                  rejected: Counter) -> list[tuple[str, int]]:
    """The (schedule, virtual stages) of `pp` that the schedule and stage rules accept
    (asked once per pp, on a probe with as many pipeline micro-batches as stages)."""
    kept = []
    for schedule, virtual in pipeline_shapes(pp, cfg.parallel.pp_schedule):
        layout = replace(cfg.parallel, pp=pp, pp_schedule=schedule, pp_virtual_stages=virtual,
                         pp_microbatches=pp * virtual, pp_layer_split=[])
        probe = replace(base.parallel, pp=pp, pp_schedule=schedule, pp_virtual_stages=virtual,
                        pp_microbatches=pp * virtual, pp_layer_split=())
        problems = ProblemList()
        check_pipeline_options(layout, probe, microbatches=pp * virtual, problems=problems)
        check_pipeline_split(probe, model=base.model, problems=problems,
                             training=replace(base.training, micro_batch_size=pp * virtual))
        if _count(problems, rejected):
            kept.append((schedule, virtual))
    return kept


def _batch_choices(layout: ParallelSpec, cfg: RunConfig, base: RunSpec,
                   global_batch_size: int, recompute: dict[str, RecomputeSpec],
                   rejected: Counter) -> Iterator[Candidate]:
    """The micro-batch sizes (and pipeline micro-batches) of one layout that pass the rules
    that read them: the pipeline micro-batch rules and the batch rule."""
    dp = layout.dp
    per_rank = global_batch_size // dp
    for micro in ([per_rank] if layout.pp > 1 else divisors(per_rank)):
        problems = ProblemList()
        parallel = replace(layout, pp_microbatches=micro if layout.pp > 1 else 1)
        as_config = replace(cfg.parallel, pp=layout.pp, pp_schedule=layout.pp_schedule,
                            pp_virtual_stages=layout.pp_virtual_stages,
                            pp_microbatches=parallel.pp_microbatches)
        check_pipeline_options(as_config, parallel, microbatches=parallel.pp_microbatches,
                               problems=problems)
        training_cfg = replace(cfg.training, micro_batch_size=micro, grad_accum_steps=-1,
                               global_batch_size=global_batch_size)
        accum, _ = resolve_batch(training_cfg, dp, problems)
        if not _count(problems, rejected):
            continue
        for name, policy in recompute.items():
            yield Candidate(parallel=parallel, micro_batch_size=micro,
                            grad_accum_steps=accum, recompute_name=name, recompute=policy)


def _count(problems: ProblemList, rejected: Counter) -> bool:
    """True when there is no problem; else counts the first problem's key."""
    if problems:
        rejected[problems.items[0].key] += 1
        return False
    return True
