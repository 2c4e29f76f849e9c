"""How the suite is shared between two pytest-xdist workers (`-n 2 --dist loadfile`, the README's
test command): each test module is one unit of work, so its module-scoped fixtures (one launch
shared by several checks) run once; all the Slurm tests are one unit, so one worker starts the
session's test cluster and runs its jobs one after another; the tests that write probe files
into the repository and those that walk its files are one unit, so no walk sees a probe.

Units are handed out in the collection's order, which `order` sets: the long directories
first (Slurm, whose jobs mostly wait, beside the multi-process runs), the many short unit-test
modules last, where they even out the two workers' ends. Without xdist only the order applies.
(xdist's own `loadgroup` marks do not work with pytest 9.2: it renames `item._nodeid`, which
pytest no longer reads.)"""
from __future__ import annotations

from pathlib import PurePosixPath

FIRST_TO_LAST = ("tests/slurm", "tests/distributed", "tests/sweeps", "tests/config",
                 "tests/unit", "tests/gpu")
"""Directories in the order their modules are handed out: the long ones first."""
REPO_FILE_TESTS = frozenset({
    "tests/unit/test_import_layers.py",  # writes conf/_wrong_arrow_probe.py for a moment
    "tests/unit/test_file_names.py",  # writes sweeps/resolve.py for a moment
    "tests/unit/test_hydra_in_one_room.py",  # walks every package's files
    "tests/unit/test_launch_backends.py",  # walks launcher/ and sweeps/
})


def unit_of_work(module: str) -> str:
    """The unit a test module (path from the repo root) belongs to; one worker runs a unit."""
    if module.startswith("tests/slurm/"):
        return "tests/slurm"
    if module in REPO_FILE_TESTS:
        return "tests/unit (files of the repository)"
    return module


def _rank(nodeid: str) -> int:
    parents = {str(p) for p in PurePosixPath(nodeid.split("::", 1)[0]).parents}
    return next((i for i, d in enumerate(FIRST_TO_LAST) if d in parents), len(FIRST_TO_LAST))


def order(items: list) -> None:
    """Sort pytest `items` in place (stably): the long directories' modules first."""
    items.sort(key=lambda item: _rank(item.nodeid))


def file_scheduler(config, log):
    """xdist's `loadfile` scheduler with the units above in place of single files."""
    from xdist.scheduler import LoadFileScheduling

    class UnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(super()._split_scope(nodeid))

    return UnitScheduling(config, log)
