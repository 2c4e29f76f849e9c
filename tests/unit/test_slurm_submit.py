"""Submitting to Slurm when sbatch refuses: one message, exit 2, no run dir left behind.

sbatch is faked by a script on PATH that fails the way a real one does for an unknown
partition, so submitit's own submission path (CommandFunction -> FailedJobError) runs for real.
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path

import submitit

from launcher import cli

SBATCH_SAYS = ("sbatch: error: invalid partition specified: nope\n"
               "sbatch: error: Batch job submission failed: Invalid partition name specified")
RUN = ["run", "cluster=slurm", "cluster.partition=nope", "cluster.account=team-a",
       "cluster.gpus_per_node=0", "cluster.procs_per_node=2", "model=tiny", "data=synthetic",
       "logging=disabled"]


def fake_slurm_bin(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"sbatch": f"cat >&2 <<'EOF'\n{SBATCH_SAYS}\nEOF\nexit 1\n",
                       "srun": "exit 0\n"}.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_refused_sbatch_is_one_message_exit_2_and_no_run_dir(tmp_path, monkeypatch, capsys):
    fake_slurm_bin(tmp_path, monkeypatch)
    runs = tmp_path / "runs"
    status = cli.main([*RUN, f"runs_dir={runs}"])
    out, err = capsys.readouterr()
    assert status == 2
    assert "Traceback" not in out + err
    assert "Slurm submission failed" in err
    assert "partition nope" in err and "account team-a" in err
    assert "invalid partition specified: nope" in err  # sbatch's own words
    assert err.count("invalid partition specified") == 1  # submitit's raw echo is absorbed
    assert "nothing was submitted" in out
    assert not runs.exists() or not any(runs.iterdir())


def test_the_private_submitit_calls_of_the_dry_run_still_exist():
    """launcher.backends.slurm_submit.submitit_sbatch_text uses these; if this fails after a
    submitit upgrade,
    look for a public renderer there (or the new private names) and update that one function."""
    executor = submitit.SlurmExecutor
    assert callable(getattr(executor, "_make_submission_file_text", None))
    assert list(inspect.signature(executor._make_submission_file_text).parameters) == [
        "self", "command", "uid"]
    assert isinstance(inspect.getattr_static(executor, "_submitit_command_str"), property)
