"""Fixtures shared by several test folders."""
from __future__ import annotations

import datetime
import os
import signal

import pytest

from tests.support import worker_groups


def pytest_collection_modifyitems(items):
    worker_groups.order(items)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: only called under `-n N`
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadfile":
        return worker_groups.file_scheduler(config, log)
    return None


@pytest.fixture(scope="session", autouse=True)
def cpu_peak_cache(tmp_path_factory):
    """Runs started by the tests store the host's CPU peak in a folder of the session, never
    in the user's cache (training/cpu_peak_cache.py); the first run measures it, the rest
    reuse it, as on a user's machine."""
    from training.cpu_peak_cache import CACHE_ENV

    yield from _session_folder(tmp_path_factory, CACHE_ENV, "cpu_peak_cache")


@pytest.fixture(scope="session", autouse=True)
def inductor_cache(tmp_path_factory):
    """torch.compile's caches (inductor's kernels, FX graphs) in a folder of the session, shared
    by its tests and the processes they start, never the machine's /tmp/torchinductor_<user>:
    a kernel left truncated there by a killed process on this shared machine failed every later
    compile of the same graph ("ImportError: ... .so: file too short"). A test that sets its own
    folder (test_compile_layouts) still does."""
    yield from _session_folder(tmp_path_factory, "TORCHINDUCTOR_CACHE_DIR", "inductor_cache")


def _session_folder(tmp_path_factory, key: str, name: str):
    """Set environment variable `key` to a new folder of the session (yielded) for the
    session's tests and the processes they start, then restore it."""
    before = os.environ.get(key)
    os.environ[key] = str(tmp_path_factory.mktemp(name))
    yield os.environ[key]
    if before is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = before


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


def pytest_configure(config) -> None:
    """pytest-xdist starts its workers with SIGINT ignored, and a process started with SIGINT
    ignored passes that on: a `meshrun run` a test starts would then never see the Ctrl-C the
    test sends it (test_run_lifetime: the second-Ctrl-C test timed out in CI under two
    workers). Put the default KeyboardInterrupt handler back, so children start with it."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
