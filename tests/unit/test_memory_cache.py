"""The memory model's caches change nothing, byte for byte: every term of parallel.cost.memory is
memoised on the spec views it reads (memory_views.py), and thousands of layouts share the
entries. For every sampled candidate of a search, every field of MemoryEstimate (and so the
peak, and which rank holds it) as `meshrun plan --search` computes it - LayoutMemory of the
candidate's sections, with the caches the candidates before it filled - equals
estimate_memory of the candidate's spec evaluated from empty caches (a term that read
something it is not keyed by would return another layout's bytes here).

The cases cover what the per-rank terms branch on: untied and tied embeddings, a Qwen-type
model with q/k/v biases, zero 0-3 (FSDP, DDP, ZeRO-1 owners), tp with sequence parallel,
loss parallel, pp with every schedule and virtual stages, cp, fp32 / bf16 / fp16 compute, bf16
AdamW moments, a CPU device (offload keeps its copies there), recompute policies that
cover every block, every other or every third block, and each selective target, and the head
and loss in row blocks (training.loss_chunks: no tp or pp candidates then), and a
mixture-of-experts model (dense and MoE blocks apart; ep candidates)."""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from conf.compose import compose_config
from conf.resolve import resolve
from conf.schema import RecomputeConfig, RecomputeMode
from conf.spec import HostSpec
from launcher.plan.plan_search import neutral_layout, recompute_policies
from parallel.cost.memory import (
    LayoutMemory, clear_memory_caches, estimate_memory, representative_ranks,
)
from parallel.cost.search_space import enumerate_candidates
from parallel.dims import zero1_owners

HOST = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=2)
GPUS = ["cluster=slurm", "cluster.gpus_per_node=8", "cluster.gpu_name=H100",
        "cluster.gpu_compute_capability=9.0", "data=synthetic"]
SELECTIVE = RecomputeMode.selective
EXTRA_POLICIES = {
    "full_every3": RecomputeConfig(mode=RecomputeMode.full, every_n_layers=3),
    "ffn_every2": RecomputeConfig(mode=SELECTIVE, every_n_layers=2, targets=["ffn"]),
    "norm_swiglu": RecomputeConfig(mode=SELECTIVE, targets=["norm", "swiglu"]),
    "block_every2": RecomputeConfig(mode=SELECTIVE, every_n_layers=2, targets=["block"]),
    "ops_attention": RecomputeConfig(mode=SELECTIVE, targets=["ops", "attention"]),
    "offload_every2": RecomputeConfig(mode=RecomputeMode.offload, every_n_layers=2),
}
CASES = {
    # (overrides, global batch in sequences, every how many-th candidate is checked)
    "debug-bf16-pp-cp": (["model=debug", "model.max_seq_len=4096", "training.seq_len=4096",
                          "precision=bf16", "cluster.nodes=2", *GPUS], 32, 1),
    "qwen-tied-biased-bf16": (["model=qwen2_5_0_5b", "training.seq_len=4096",
                               "precision=bf16", "cluster.nodes=1", *GPUS], 16, 29),
    "qwen-untied-biased-fp32-pp": (["model=qwen2_5_0_5b", "model.tie_embeddings=false",
                                    "training.seq_len=4096", "precision=fp32",
                                    "parallel.loss_parallel=true", "cluster.nodes=1", *GPUS],
                                   16, 7),
    "llama-tied-fp16-bf16-moments": (["model=llama3_1b", "training.seq_len=2048",
                                      "precision=fp16", "precision.optimizer_state_dtype=bf16",
                                      "cluster.nodes=2", *GPUS], 32, 149),
    "llama3_70b-bf16-32-gpus": (["model=llama3_70b", "training.seq_len=8192", "precision=bf16",
                                 "cluster.nodes=4", *GPUS], 64, 41),
    "debug-cpu-fp32": (["model=debug", "training.seq_len=1024", "cluster=local",
                        "cluster.procs_per_node=8", "data=synthetic"], 16, 1),
    "debug-cpu-bf16": (["model=debug", "training.seq_len=1024", "cluster=local",
                        "cluster.procs_per_node=8", "precision=bf16", "data=synthetic"], 16, 1),
    "llama-untied-bf16-loss-chunks": (["model=llama3_1b", "model.tie_embeddings=false",
                                       "training.seq_len=2048", "precision=bf16",
                                       "training.loss_chunks=8", "cluster.nodes=1", *GPUS],
                                      16, 1),
    "tiny-moe-cpu-bf16-ep": (["model=tiny_moe", "training.seq_len=64", "cluster=local",
                              "cluster.procs_per_node=8", "precision=bf16", "data=synthetic"],
                             16, 7),
    "debug-cpu-bf16-loss-chunks": (["model=debug", "training.seq_len=1024", "cluster=local",
                                    "cluster.procs_per_node=8", "precision=bf16",
                                    "training.loss_chunks=4", "data=synthetic"], 16, 1),
}


def _candidates(overrides, global_batch_size):
    cfg = compose_config(overrides)
    base = resolve(neutral_layout(cfg), host=HOST, check_paths=False)
    policies = {**recompute_policies(), **EXTRA_POLICIES}
    return base, list(enumerate_candidates(cfg, base, global_batch_size=global_batch_size,
                                           policies=policies, rejected=Counter()))


def _layout(base, candidate) -> LayoutMemory:
    """The candidate's memory as parallel.cost.search.search asks it (no RunSpec made)."""
    return LayoutMemory(model=base.model, parallel=candidate.parallel,
                        training=candidate.training(base), precision=base.precision,
                        recompute=candidate.recompute, document_mask=base.data.document_mask)


@pytest.mark.parametrize("case", CASES)
def test_memoised_memory_equals_memory_from_empty_caches_byte_for_byte(case):
    overrides, global_batch_size, stride = CASES[case]
    base, candidates = _candidates(overrides, global_batch_size)
    checked = candidates[::stride]
    clear_memory_caches()
    memoised = [(_layout(base, c).fullest(), _layout(base, c).floor()) for c in checked]
    for candidate, (memory, floor) in zip(checked, memoised):
        clear_memory_caches()
        expected = estimate_memory(candidate.spec(base))
        assert memory == expected, (case, candidate)
        # the search skips a misfit whose floor cannot beat the smallest misfit: a true floor
        assert floor <= expected.total, (case, candidate)
    assert any(floor == memory.total for memory, floor in memoised)
    seen = {(c.parallel.zero, c.parallel.pp > 1, c.parallel.pp_virtual_stages > 1,
             c.parallel.tp > 1, c.parallel.cp > 1) for c in checked}
    assert {z for z, *_ in seen} == {0, 1, 2, 3}, seen  # every ZeRO stage was compared
    assert len({c.recompute_name for c in checked}) >= 8


def test_memoised_memory_with_a_document_mask_equals_memory_from_empty_caches():
    """data.document_mask (RoPE rows per token, one dense mask per forward on a CPU device)
    is read by the kept activations and not by the step's phases: both regimes memoised."""
    base, candidates = _candidates(*CASES["debug-cpu-bf16"][:2])
    base = replace(base, data=replace(base.data, document_mask=True))
    clear_memory_caches()
    memoised = [_layout(base, c).fullest() for c in candidates]
    for candidate, memory in zip(candidates[::3], memoised[::3]):
        clear_memory_caches()
        assert memory == estimate_memory(candidate.spec(base)), candidate


def test_the_cases_reach_every_branch():
    """The layouts compared above include pipelines with virtual stages, tp, cp, and ZeRO-1
    with unequal owner shares (more than one representative rank per pipeline rank)."""
    base, candidates = _candidates(*CASES["debug-bf16-pp-cp"][:2])
    kinds = {(c.parallel.pp > 1 and c.parallel.pp_virtual_stages > 1, c.parallel.tp > 1,
              c.parallel.cp > 1) for c in candidates}
    assert (True, False, False) in kinds and (False, True, True) in kinds
    assert any(len(representative_ranks(c.spec(base))) > c.parallel.pp for c in candidates
               if c.parallel.zero == 1)
    assert {c.parallel.pp_schedule for c in candidates if c.parallel.pp > 1} >= {
        "gpipe", "1f1b", "interleaved_1f1b"}
    _, qwen = _candidates(*CASES["qwen-untied-biased-fp32-pp"][:2])
    assert any(c.parallel.pp > 1 for c in qwen)


def _owners_by_scan(sizes, n):
    """zero1_owners' rule written as a scan over every rank (what the heap must reproduce)."""
    load, owners = [0] * n, [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(n), key=lambda r: (load[r], r))
        owners[index], load[rank] = rank, load[rank] + sizes[index]
    return owners


def test_zero1_owners_are_the_greedy_rule():
    """The heap in parallel.dims.zero1_owners gives each tensor the owner the rule names:
    largest first, to the least-loaded rank, ties to the lower rank (many equal sizes, as a
    model's blocks have, make ties frequent)."""
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 40)
        sizes = [rng.choice([1, 7, 64, 64, 4096, rng.randint(1, 5000)])
                 for _ in range(rng.randint(0, 120))]
        assert zero1_owners(sizes, n) == _owners_by_scan(sizes, n), (sizes, n)
