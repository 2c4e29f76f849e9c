"""Expert parallelism's rules (parallel.ep): where its ranks come from, what it shards."""
from __future__ import annotations

from conf.errors import ProblemList
from conf.spec import ModelSpec, ParallelSpec


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_expert_parallel(parallel: ParallelSpec, *, model: ModelSpec,
                          problems: ProblemList) -> None:
    """ep borrows dp_shard x cp ranks, needs FSDP, and splits a MoE model's routed experts."""
    ep = parallel.ep
    if not (parallel.ep_imbalance == 0 or parallel.ep_imbalance >= 1.0):
        problems.add("parallel.ep_imbalance", parallel.ep_imbalance,
                     "is the busiest ep rank's token share over the mean, so at least 1.0 "
                     "(or 0: the calibrated value)",
                     "give 1.0 (balanced) or more, e.g. 1.3, or 0 (auto)")
    if ep < 1:
        problems.add("parallel.ep", ep, "must be >= 1", "give 1 (off) or a divisor of the experts")
        return
    if ep == 1:
        return
    borrowed = parallel.dp_shard * parallel.cp
    if borrowed % ep:
        problems.add("parallel.ep", ep,
                     f"borrows its ranks from dp_shard x cp = {parallel.dp_shard} x "
                     f"{parallel.cp} = {borrowed}, which it must divide",
                     f"use ep in {divisors(borrowed)}, or raise parallel.dp_shard")
    if parallel.zero not in (2, 3):
        problems.add("parallel.ep", ep,
                     f"shards the experts as DTensors, which need FSDP (parallel.zero 2 or 3), "
                     f"not zero={parallel.zero}", "set parallel.zero=3 (parallel=ep)")
    _check_experts(ep, model, problems)


def _check_experts(ep: int, model: ModelSpec, problems: ProblemList) -> None:
    from training.models import UnknownFamily, family_of

    try:
        family = family_of(model)
    except UnknownFamily:
        return  # check_model_family names it
    experts = family.routed_experts(model)
    if not family.experts or experts == 0:
        problems.add("parallel.ep", ep,
                     f"splits routed experts, and model.family={model.family} "
                     f"(model {model.name}) is dense: it has none",
                     "set parallel.ep=1, or choose a mixture-of-experts model")
    elif experts % ep:
        problems.add("parallel.ep", ep, f"must divide the {experts} routed experts per block",
                     f"use ep in {divisors(experts)}")
