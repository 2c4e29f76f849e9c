"""Context-parallel attention on gloo ranks against full single-process causal attention.

For contiguous and load-balanced sharding, MHA and GQA, contiguous and non-contiguous
incoming gradients, one masked SDPA call (CPU's path) and per-run lower-right causal calls
(CUDA's path, `by_runs`): the output rows and dq, dk, dv at each rank's positions must match full
`F.scaled_dot_product_attention(is_causal=True)` on the same global q, k, v (fp32).
"""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from parallel.context_parallel import (all_gather_sequence, context_parallel_attention,
                                       shard_positions, shard_sequence)
from tests.support.spawn import run_on_ranks

pytestmark = pytest.mark.distributed

ATOL, RTOL = 1e-6, 1e-5
B, T, D = 2, 16, 8
HEADS = ((2, 2), (4, 2))  # (Hq, Hkv): plain multi-head, grouped-query


def _global_inputs(hq: int, hkv: int, seed: int) -> dict[str, torch.Tensor]:
    """The same global q, k, v and output weighting on every rank."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"q": (B, hq, T, D), "k": (B, hkv, T, D), "v": (B, hkv, T, D), "w": (B, hq, T, D)}
    return {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def _weighted_loss(out: torch.Tensor, w: torch.Tensor, *, transposed: bool) -> torch.Tensor:
    """(out * w).sum(); `transposed` routes it through a transpose so out's grad is
    non-contiguous (the documented gloo pitfall of torch.distributed.nn's all_gather)."""
    if transposed:
        return (out.transpose(1, 2) * w.transpose(1, 2).contiguous()).sum()
    return (out * w).sum()


def _check_attention(group, *, cp: int, cp_rank: int, balanced: bool, hq: int, hkv: int,
                     transposed: bool, by_runs: bool) -> dict:
    """One case on this rank: assert closeness, return positions and max abs errors."""
    full = _global_inputs(hq, hkv, seed=1000 * hq + hkv)
    q, k, v = (full[n].clone().requires_grad_() for n in "qkv")
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    _weighted_loss(ref, full["w"], transposed=transposed).backward()

    positions = shard_positions(seq_len=T, cp=cp, cp_rank=cp_rank, balanced=balanced)
    local = {n: shard_sequence(full[n], positions=positions, dim=2) for n in "qkvw"}
    lq, lk, lv = (local[n].requires_grad_() for n in "qkv")
    out = context_parallel_attention(lq, lk, lv, q_positions=torch.tensor(positions),
                                     group=group, by_runs=by_runs)
    _weighted_loss(out, local["w"], transposed=transposed).backward()

    pairs = {"out": (out, ref), "dq": (lq.grad, q.grad), "dk": (lk.grad, k.grad),
             "dv": (lv.grad, v.grad)}
    errors = {}
    for name, (got, want) in pairs.items():
        want = shard_sequence(want.detach(), positions=positions, dim=2)
        torch.testing.assert_close(got.detach(), want, atol=ATOL, rtol=RTOL, msg=lambda m: (
            f"{name} cp={cp} rank={cp_rank} balanced={balanced} hq={hq} hkv={hkv} "
            f"transposed={transposed} by_runs={by_runs}: {m}"))
        errors[name] = (got.detach() - want).abs().max().item()
    return {"positions": positions, "errors": errors}


def _check_gather_noncontiguous_grad(group, *, cp: int, cp_rank: int) -> dict:
    """all_gather_sequence alone, fed a non-contiguous gradient: x.grad must be the sum over
    ranks of their gradient for this rank's slice."""
    x = (torch.arange(6.0).reshape(2, 3) + 10 * cp_rank).requires_grad_()
    y = all_gather_sequence(x, dim=1, group=group)  # [2, 3 * cp]
    seen = {}
    y.register_hook(lambda g: seen.update(contiguous=g.is_contiguous()))  # returns None
    weight = torch.arange(3.0 * cp * 2).reshape(3 * cp, 2) * (cp_rank + 1)  # per-rank weight
    (y.transpose(0, 1) * weight).sum().backward()
    total = sum(r + 1 for r in range(cp))  # the weights of all ranks, summed
    expected = (torch.arange(3.0 * cp * 2).reshape(3 * cp, 2) * total).t()[:, 3 * cp_rank:
                                                                             3 * (cp_rank + 1)]
    gathered = torch.cat([torch.arange(6.0).reshape(2, 3) + 10 * r for r in range(cp)], dim=1)
    torch.testing.assert_close(y.detach(), gathered, atol=0, rtol=0)
    torch.testing.assert_close(x.grad, expected, atol=0, rtol=0)
    return {"incoming_contiguous": seen["contiguous"]}


def _cp_rank_main(*, rank: int, world_size: int, layouts: list[list[list[int]]]) -> list[dict]:
    """For each layout (a partition of the world into cp groups), run every case."""
    results = []
    for layout in layouts:
        groups = [dist.new_group(ranks) for ranks in layout]  # every rank creates every group
        (ranks,) = [r for r in layout if rank in r]
        group = groups[layout.index(ranks)]
        cp, cp_rank = len(ranks), dist.get_rank(group)
        for balanced in (False, True):
            for hq, hkv in HEADS:
                for transposed, by_runs in itertools.product((False, True), repeat=2):
                    case = _check_attention(group, cp=cp, cp_rank=cp_rank, balanced=balanced,
                                            hq=hq, hkv=hkv, transposed=transposed,
                                            by_runs=by_runs)
                    results.append({"ranks": ranks, "cp_rank": cp_rank, "balanced": balanced,
                                    "hq": hq, "transposed": transposed, "by_runs": by_runs,
                                    **case})
        results.append({"ranks": ranks, "cp_rank": cp_rank, "gather":
                        _check_gather_noncontiguous_grad(group, cp=cp, cp_rank=cp_rank)})
    return results


def _assert_rank_results(results: list[list[dict]], *, world_size: int, n_layouts: int) -> None:
    """Every case ran on every rank, errors are in tolerance, and each cp group's positions
    cover the sequence exactly once."""
    per_layout = 2 * len(HEADS) * 4 + 1
    assert [len(r) for r in results] == [n_layouts * per_layout] * world_size
    cases = [c for rank_results in results for c in rank_results if "errors" in c]
    assert len(cases) == world_size * n_layouts * (per_layout - 1)
    # assert_close already ran on the ranks; this re-checks the reported errors (|values| are
    # O(1), so atol + rtol bounds them; seen: max 9.5e-7 at cp=2, 1.4e-6 at cp=4, in dk/dv).
    assert all(err <= ATOL + RTOL for c in cases for err in c["errors"].values())
    gathers = [c["gather"] for rank_results in results for c in rank_results if "gather" in c]
    assert gathers and not any(g["incoming_contiguous"] for g in gathers)
    coverage: dict[tuple, list[int]] = {}
    for c in cases:
        key = (tuple(c["ranks"]), c["balanced"], c["hq"], c["transposed"], c["by_runs"])
        coverage.setdefault(key, []).extend(c["positions"])
    assert all(sorted(p) == list(range(T)) for p in coverage.values())


def test_cp_attention_matches_full_attention(tmp_path):
    """One 2-rank spawn: cp=2 over both ranks, then cp=1 groups {0}, {1} (rank 1's group
    rank is 0, so using the global rank instead of the group rank would fail). A 4-rank
    spawn (cp=4, subgroups {0,2}, {1,3}) passed too but took 9-16 s here, so it is left out;
    cp=4 sharding is covered by the shard_positions unit tests."""
    results = run_on_ranks(_cp_rank_main, world_size=2, workdir=tmp_path,
                           kwargs={"layouts": [[[0, 1]], [[0], [1]]]})
    _assert_rank_results(results, world_size=2, n_layouts=2)


def test_shard_positions_balanced_example():
    assert shard_positions(seq_len=8, cp=2, cp_rank=0, balanced=True) == [0, 1, 6, 7]
    assert shard_positions(seq_len=8, cp=2, cp_rank=1, balanced=True) == [2, 3, 4, 5]
    assert shard_positions(seq_len=8, cp=2, cp_rank=1, balanced=False) == [4, 5, 6, 7]


@pytest.mark.parametrize("balanced", [False, True])
@pytest.mark.parametrize("seq_len,cp", [(8, 1), (8, 2), (16, 4), (24, 3)])
def test_shard_positions_cover_each_position_once(seq_len, cp, balanced):
    shards = [shard_positions(seq_len=seq_len, cp=cp, cp_rank=r, balanced=balanced)
              for r in range(cp)]
    assert sorted(p for shard in shards for p in shard) == list(range(seq_len))
    assert {len(shard) for shard in shards} == {seq_len // cp}


def test_shard_positions_rejects_indivisible_lengths():
    with pytest.raises(AssertionError):
        shard_positions(seq_len=6, cp=2, cp_rank=0, balanced=True)  # needs 2*cp | seq_len
    with pytest.raises(AssertionError):
        shard_positions(seq_len=7, cp=2, cp_rank=0, balanced=False)


def test_shard_sequence_selects_positions_contiguously():
    x = torch.arange(2 * 8 * 3).reshape(2, 8, 3).transpose(0, 2)  # non-contiguous input
    out = shard_sequence(x, positions=[0, 1, 6, 7], dim=1)
    assert out.is_contiguous()
    assert torch.equal(out, x[:, [0, 1, 6, 7], :])
