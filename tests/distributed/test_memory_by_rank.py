"""Per-rank memory is gathered from every rank in rank order (one all_gather), on real gloo
ranks: rank 1 touches 512 MiB more than rank 0, and the gathered lists say so on every rank."""
from __future__ import annotations

import resource

import pytest
import torch

from tests.support.spawn import run_on_ranks

pytestmark = pytest.mark.distributed
EXTRA_MIB = 512


def gather_after_touching(*, rank: int, world_size: int) -> dict:
    from training.metrics import memory_by_rank, memory_fields

    if rank == 1:
        # ru_maxrss survives exec: a spawned rank starts at the spawning (pytest) process's
        # peak, which late in a suite is large; touch that much more, so rank 1's own peak is
        # above it by EXTRA_MIB whatever it was
        inherited_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        torch.ones((inherited_mib + EXTRA_MIB) * 2**20 // 8, dtype=torch.float64)  # freed
    return memory_fields(memory_by_rank(torch.device("cpu")))


def test_every_rank_gets_every_ranks_memory_in_rank_order(tmp_path):
    results = run_on_ranks(gather_after_touching, world_size=2, workdir=tmp_path)
    assert results[0] == results[1]  # the same gathered lists on each rank
    peaks = results[0]["mem_by_rank"]["mem_peak_gib"]
    assert len(peaks) == 2
    # rank 1's own value, in its place (the ranks' baselines differ by up to ~0.1 GiB)
    assert peaks[1] - peaks[0] > 0.6 * EXTRA_MIB / 1024, peaks
    assert results[0]["mem_peak_gib"] == max(peaks)
