"""The CPU peak that MFU divides by is measured on rank 0 only, every rank gets it, and a later
run on the host reuses the stored peak instead of measuring again (training/cpu_peak_cache.py)."""
from __future__ import annotations

import pytest

from conf.run_dir.spec_io import spec_to_dict
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec

pytestmark = pytest.mark.distributed


def peak_rank(*, rank: int, world_size: int, spec_dict: dict) -> tuple:
    """Resolve the peak on this rank, counting the matmul timings this rank ran."""
    import torch

    from conf.spec import RunSpec
    from conf.run_dir.spec_io import spec_from_dict
    from training import metrics

    timed = []
    real = metrics.time_matmul_flops

    def counting(n, dtype, **kwargs):
        timed.append(n)
        return real(n, dtype, **kwargs)

    metrics.time_matmul_flops = counting
    peak = metrics.resolve_peak(spec_from_dict(RunSpec, spec_dict), torch.device("cpu"))
    return peak.flops, peak.source, len(timed)


def test_rank_zero_measures_the_cpu_peak_and_every_rank_uses_it(tmp_path, monkeypatch):
    from training.cpu_peak_cache import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "peaks"))  # an empty cache: measured first
    spec = cpu_spec("model=tiny", "cluster.procs_per_node=2")
    first = run_on_ranks(peak_rank, world_size=2, workdir=tmp_path / "first",
                         kwargs={"spec_dict": spec_to_dict(spec)})
    (flops0, source0, timed0), (flops1, source1, timed1) = first
    assert timed0 > 0 and timed1 == 0  # one measurement, on rank 0
    assert (flops1, source1) == (flops0, source0) and flops0 > 0
    assert "host CPU peak" in source0 and "at load" in source0
    again = run_on_ranks(peak_rank, world_size=2, workdir=tmp_path / "again",
                         kwargs={"spec_dict": spec_to_dict(spec)})
    assert again == [(flops0, source0, 0), (flops0, source0, 0)]  # stored: nobody measures
