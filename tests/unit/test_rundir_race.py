"""Run-dir creation never races: processes creating run dirs of one name at once all succeed."""
from __future__ import annotations

import multiprocessing

from launcher import run_dir_writer
from tests.support.specs import cpu_spec

N = 12


def _create(args) -> str:
    spec, barrier = args
    # all in the same second
    run_dir_writer.time.localtime = lambda *_: run_dir_writer.time.gmtime(0)
    barrier.wait()
    return str(run_dir_writer.create_run_dir(spec, overrides=[], config_yaml="a: 1\n",
                                             command=["python", "-m", "training",
                                                      "<run_dir>"]))


def test_twelve_processes_creating_one_name_get_twelve_dirs(tmp_path):
    spec = cpu_spec(f"runs_dir={tmp_path}", "name=same")
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Manager().Barrier(N)
    with ctx.Pool(N) as pool:
        made = pool.map(_create, [(spec, barrier)] * N)
    assert len(set(made)) == N
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.rsplit("/", 1)[1] for p in made)  # no temporary folders left behind
    for path in made:
        text = (tmp_path / path.rsplit("/", 1)[1] / "command.txt").read_text()
        assert text.strip().endswith(f"training {path}")
