"""The ranks' run-dir guard: the same folder, still holding spec.json, or RunDirGone naming
what happened (a removed dir is covered end to end by tests/distributed/test_e2e_outputs.py)."""
from __future__ import annotations

import shutil

import pytest

from conf.run_dir.paths import SPEC_FILE
from training.run_dir_guard import RunDirGone, RunDirGuard


def _run_dir(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / SPEC_FILE).write_text("{}")
    return run_dir


def test_the_untouched_run_dir_passes(tmp_path):
    RunDirGuard(_run_dir(tmp_path)).check(before="step 1")


def test_a_run_dir_replaced_by_another_folder_of_its_name_stops_the_run(tmp_path):
    run_dir = _run_dir(tmp_path)
    guard = RunDirGuard(run_dir)
    run_dir.rename(tmp_path / "moved")
    shutil.copytree(tmp_path / "moved", run_dir)  # same name, same files, another folder
    with pytest.raises(RunDirGone, match="was replaced by another folder"):
        guard.check(before="step 2")


@pytest.mark.parametrize("damage", ["removed", "spec gone"])
def test_a_removed_run_dir_or_spec_stops_the_run(tmp_path, damage):
    run_dir = _run_dir(tmp_path)
    guard = RunDirGuard(run_dir)
    if damage == "removed":
        shutil.rmtree(run_dir)
    else:
        (run_dir / SPEC_FILE).unlink()
    with pytest.raises(RunDirGone, match="was removed|lost its spec.json"):
        guard.check(before="step 3")
    assert run_dir.exists() is (damage != "removed")  # nothing recreated
