"""Run dirs are written whole or not at all, and never overwrite each other."""
from __future__ import annotations

import json

import pytest

from launcher import run_dir_writer
from tests.support.specs import cpu_spec


def make(spec, **kwargs):
    return run_dir_writer.create_run_dir(spec, overrides=["model=tiny"], config_yaml="a: 1\n",
                                         command=["python", "-m", "training", "<run_dir>"],
                                         **kwargs)


def test_two_runs_in_the_same_second_get_two_dirs(tmp_path, monkeypatch):
    spec = cpu_spec(f"runs_dir={tmp_path}", "name=same")
    monkeypatch.setattr(run_dir_writer.time, "localtime",
                        lambda *_: run_dir_writer.time.gmtime(0))
    first, second = make(spec), make(spec)
    assert first != second and first.is_dir() and second.is_dir()
    assert second.name == first.name + "-2"
    assert json.loads((first / "overrides.json").read_text()) == ["model=tiny"]
    assert (first / "command.txt").read_text().strip().endswith(f"training {first}")
    assert len((first / "wandb_id.txt").read_text().strip()) == 8


def test_a_failure_while_writing_leaves_no_run_dir(tmp_path, monkeypatch):
    spec = cpu_spec(f"runs_dir={tmp_path}")

    def broken() -> dict:
        raise OSError("disk full")

    monkeypatch.setattr(run_dir_writer, "environment_record", broken)
    with pytest.raises(OSError):
        make(spec)
    assert list(tmp_path.iterdir()) == []


def test_leg_overrides_follow_the_newest_resume(tmp_path):
    """A plain resume continues with the newest leg's overrides, not the first run's."""
    import json as _json

    from conf.run_dir.paths import LEG_UNPAUSE, RunDir

    rd = RunDir(tmp_path)
    rd.overrides_file.write_text(_json.dumps(["training.steps=20", "training.stop_at_step=5"]))
    assert rd.leg_overrides() == ["training.steps=20", "training.stop_at_step=5"]
    effective = rd.leg_overrides() + [LEG_UNPAUSE, "training.steps=40", "training.stop_at_step=10"]
    rd.append_resume(time="t1", overrides=["training.steps=40", "training.stop_at_step=10"],
                     effective=effective)
    assert rd.leg_overrides() == effective
    with open(rd.resumes_file, "a") as f:  # a line written before effective was recorded
        f.write(_json.dumps({"time": "t2", "overrides": ["optim.lr=1e-3"]}) + "\n{torn")
    assert rd.leg_overrides() == effective + [LEG_UNPAUSE, "optim.lr=1e-3"]
    assert [r["time"] for r in rd.read_resumes()] == ["t1", "t2"]
