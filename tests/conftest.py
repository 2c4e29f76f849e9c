"""Fixtures shared by several test folders."""
from __future__ import annotations

import datetime

import pytest


@pytest.fixture
def one_rank_group():
    """A real gloo group of one rank in this process (a HashStore), torn down afterwards."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        yield
    finally:
        dist.barrier()
        dist.destroy_process_group()
