"""training.profile_* and training.memory_snapshot_*: bad values refused before launch (key,
value, rule, fix; exit 2, nothing made), the auto start step, and the window itself in one
process: torch.profiler's trace holds exactly the window's steps (ProfilerStep#N = training
step N), also for a leg that resumes inside the window or ends in it. Profiling off builds
nothing (training/step_probes.py); the real loop on 2 ranks: tests/distributed/
test_profile_traces.py; snapshots on CUDA: tests/gpu/test_memory_snapshot_cuda.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conf.errors import ConfigError
from conf.rules.profile_rules import profile_start_step
from conf.schema import TrainingConfig
from launcher.cli import main
from tests.support.profile_traces import traced_steps
from tests.support.specs import cpu_spec
from training.step_probes import build_step_probes

BASE = ("model=tiny", "data=synthetic", "training.steps=6")


@pytest.mark.parametrize("overrides, wants", [
    (["training.profile_steps=-1", "training.profile_warmup_steps=-2",
      "training.profile_ranks=[0,2,2]", "training.memory_snapshot_step=7",
      "training.memory_snapshot_on_oom=true"],
     [("training.profile_steps=-1", "must be >= 0"),
      ("training.profile_warmup_steps=-2", "must be >= 0"),
      ("training.profile_ranks=[0, 2, 2]", "ranks [2] do not exist: this run has ranks 0..1"),
      ("training.profile_ranks=[0, 2, 2]", "names a rank twice"),
      ("training.memory_snapshot_step=7", "must be within [0, training.steps=6]"),
      ("training.memory_snapshot_step=7", "this run is on CPU (no CUDA: nothing to snapshot)"),
      ("training.memory_snapshot_on_oom=true", "reads the CUDA caching allocator")]),
    (["training.profile_steps=3", "training.profile_start_step=5",
      "training.profile_ranks=[-1]"],
     [("training.profile_start_step=5", "(steps 5..7, training.profile_steps=3) ends after "
                                        "the last step (training.steps=6)"),
      ("training.profile_ranks=[-1]", "ranks [-1] do not exist")]),
    (["training.profile_steps=2", "training.profile_start_step=0"],
     [("training.profile_start_step=0", "steps count from 1")]),
    (["training.profile_steps=9"], [("training.profile_start_step=2", "ends after the last")]),
    (["training.profile_steps=1", "training.profile_start_step=2",
      "training.profile_warmup_steps=3"],
     [("training.profile_warmup_steps=3", "only 1 step(s) do")]),
])
def test_bad_values_are_refused_with_key_rule_and_fix(overrides, wants):
    """One resolve per case: resolve() lists every problem at once."""
    with pytest.raises(ConfigError) as error:
        cpu_spec(*BASE, *overrides)
    lines = str(error.value).splitlines()
    for key, says in wants:
        assert any(line.strip().startswith(key + ":") and says in line and "(fix: " in line
                   for line in lines), (key, says, lines)


def test_the_command_line_refuses_before_anything_is_made(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    runs = tmp_path / "runs"
    assert main(["run", *BASE, "training.profile_steps=4", "training.profile_start_step=5",
                 f"runs_dir={runs}"]) == 2
    err = capsys.readouterr().err
    assert "training.profile_start_step=5: the window (steps 5..8" in err and "fix:" in err
    assert "Traceback" not in err and not runs.exists()


@pytest.mark.parametrize("steps, profile_steps, warmup, start", [
    (6, 2, 1, 3), (3, 1, 1, 3), (2, 1, 1, 2), (6, 1, 0, 2), (6, 2, 3, 5)])
def test_auto_start_skips_step_one_and_fits_short_runs(steps, profile_steps, warmup, start):
    t = TrainingConfig(steps=steps, profile_steps=profile_steps, profile_warmup_steps=warmup)
    assert profile_start_step(t) == start


def test_resolve_fills_the_auto_start():
    spec = cpu_spec(*BASE, "training.profile_steps=2")
    assert spec.training.profile_start_step == 3 and spec.training.profile_ranks == (0,)


def test_profiling_off_builds_nothing(tmp_path):
    """No probes object (so no profiler) when off, on a rank not listed, or past the window:
    the loop's `tr.probes is not None` is all a step pays."""
    cpu = torch.device("cpu")
    off = cpu_spec(*BASE).training
    on = cpu_spec(*BASE, "training.profile_steps=2", "training.profile_start_step=3").training
    assert build_step_probes(off, run_dir=tmp_path, rank=0, device=cpu, done_step=0) is None
    assert build_step_probes(on, run_dir=tmp_path, rank=1, device=cpu, done_step=0) is None
    assert build_step_probes(on, run_dir=tmp_path, rank=0, device=cpu, done_step=4) is None
    assert build_step_probes(on, run_dir=tmp_path, rank=0, device=cpu, done_step=0) is not None
    assert not (tmp_path / "profile").exists()


def run_steps(tmp_path: Path, name: str, *, done_step: int, last_step: int,
              overrides=("training.profile_steps=2", "training.profile_start_step=3")):
    """A stand-in loop on one process: a matmul per step, the probes after each."""
    t = cpu_spec(*BASE, *overrides).training
    run_dir = tmp_path / name
    probes = build_step_probes(t, run_dir=run_dir, rank=0, device=torch.device("cpu"),
                               done_step=done_step)
    x = torch.randn(32, 32)
    for step in range(done_step + 1, last_step + 1):
        x = (x @ x).tanh()
        if probes is not None:
            probes = probes.after_step(step)
    if probes is not None:
        probes.close()
    return run_dir


def test_the_trace_holds_the_window_steps_only(tmp_path):
    assert traced_steps(run_steps(tmp_path, "whole", done_step=0, last_step=6)) == [{3, 4}]
    # a leg resumed inside the window traces what is left; one that ends in it, what it ran
    assert traced_steps(run_steps(tmp_path, "resumed", done_step=3, last_step=6)) == [{4}]
    assert traced_steps(run_steps(tmp_path, "paused", done_step=0, last_step=3)) == [{3}]
