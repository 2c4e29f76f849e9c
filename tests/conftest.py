"""Fixtures shared by several test folders."""
from __future__ import annotations

import datetime

import pytest

from tests.support import worker_groups


def pytest_collection_modifyitems(items):
    worker_groups.order(items)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: only called under `-n N`
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadfile":
        return worker_groups.file_scheduler(config, log)
    return None


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
