"""The README's test command shares the suite between two pytest-xdist workers
(launcher/bootstrap.py, tests/support/worker_groups.py): a module's tests stay together (its
module fixtures run once), all Slurm tests stay together (one test cluster), the repository's
probe-writing and file-walking tests stay together, and the long directories go first."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from launcher.bootstrap import XDIST_ARGS, pytest_args
from tests.support.worker_groups import file_scheduler, order, unit_of_work


def test_slurm_modules_share_one_unit_and_other_modules_are_their_own():
    assert unit_of_work("tests/slurm/test_slurm_runs.py") == unit_of_work(
        "tests/slurm/test_slurm_hang.py")
    assert unit_of_work("tests/unit/test_import_layers.py") == unit_of_work(
        "tests/unit/test_file_names.py")
    assert unit_of_work("tests/distributed/test_e2e_runs.py") == "tests/distributed/test_e2e_runs.py"
    assert len({unit_of_work("tests/slurm/test_cluster.py"),
                unit_of_work("tests/unit/test_file_names.py"),
                unit_of_work("tests/unit/test_spec.py")}) == 3


def test_the_scheduler_splits_node_ids_into_those_units():
    two_workers = SimpleNamespace(getvalue={"tx": ["2*popen"]}.get)  # what `-n 2` sets
    split = file_scheduler(two_workers, None)._split_scope
    assert split("tests/slurm/test_slurm_runs.py::test_one_node_job_runs_to_completion") == \
        split("tests/slurm/test_cluster.py::test_x[a::b]")
    assert split("tests/unit/test_spec.py::test_a[x]") == split("tests/unit/test_spec.py::test_b")
    assert split("tests/unit/test_spec.py::test_a") != split("tests/unit/test_data.py::test_a")


def test_the_long_directories_are_handed_out_first_in_a_stable_order():
    ids = ["tests/config/test_recipes.py::a", "tests/unit/test_spec.py::a",
           "tests/distributed/test_e2e_runs.py::a", "tests/slurm/test_cluster.py::a",
           "tests/unit/test_data.py::a", "tests/distributed/test_checkpoint.py::a",
           "tests/sweeps/test_compare.py::a"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    order(items)
    assert [i.nodeid for i in items] == [
        "tests/slurm/test_cluster.py::a", "tests/distributed/test_e2e_runs.py::a",
        "tests/distributed/test_checkpoint.py::a", "tests/sweeps/test_compare.py::a",
        "tests/config/test_recipes.py::a", "tests/unit/test_spec.py::a",
        "tests/unit/test_data.py::a"]


@pytest.mark.parametrize("args", [[], ["tests/unit", "-x"], ["-k", "not slow"]])
def test_the_test_command_adds_two_workers(args):
    assert pytest_args(args) == [*XDIST_ARGS, *args]


@pytest.mark.parametrize("args", [["-n", "0"], ["-n4"], ["--numprocesses=3"], ["--dist", "load"],
                                  ["-p", "no:xdist", "tests/unit"]])
def test_pytest_args_that_choose_workers_are_kept_as_given(args):
    assert pytest_args(args) == args
