"""Bad input through the real `meshrun` command: exit status 2, one message on stderr, no
traceback, and nothing written (no run dir)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.meshrun_cli import start_meshrun

REPO = Path(__file__).resolve().parents[2]
EXIT_BAD_INPUT = 2
pytestmark = pytest.mark.e2e

BAD_RUNS = {
    # id: (arguments after `run`, substrings stderr must hold)
    "unknown-group-option": (["--dry-run", "model=llama4"],
                             ["model=llama4", "unknown model option", "llama3_8b"]),
    "two-override-problems": (["--dry-run", "training.steps=abc", "trainng.seed=1"],
                              ["2 problems", "training.steps=abc", "must be an integer",
                               "trainng.seed=1", "did you mean training?"]),
    # without --dry-run: a refused config must not leave a run dir behind
    "rule-world-size": (["training.device=cpu", "parallel.dp_replicate=3",
                         "cluster.procs_per_node=2", "training.steps=1"],
                        ["Invalid run config", "dp_replicate(3)", "!= world size 2"]),
    "hydra-interpolation-error": (["--dry-run", "training.steps=${nope}"],
                                  ["Invalid overrides", "Interpolation key 'nope' not found"]),
}


NARROW = "unknown-group-option"  # run at a plain 80-column terminal width; the rest run wide


def _start(args: list[str], columns: int = 1000) -> subprocess.Popen:
    return start_meshrun(*args, env={**os.environ, "PYTHONPATH": str(REPO)}, columns=columns,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Start every bad command at once (they are independent), then collect them."""
    base = tmp_path_factory.mktemp("cli")
    started = {}
    for name, (args, _) in BAD_RUNS.items():
        runs_dir = base / name / "runs"
        started[name] = (_start(["run", *args, f"runs_dir={runs_dir}"],
                                columns=80 if name == NARROW else 1000), runs_dir)
    not_a_run = base / "not-a-run"
    (not_a_run / "checkpoints").mkdir(parents=True)
    (not_a_run / "notes.txt").write_text("hello\n")
    started["resume-not-a-run"] = (_start(["resume", str(not_a_run)]), not_a_run)
    out = {}
    for name, (proc, path) in started.items():
        stdout, stderr = proc.communicate(timeout=60)
        out[name] = (subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr),
                     path)
    return out


def _flat(text: str) -> str:
    """Collapse whitespace: rich wraps long lines at the terminal width."""
    return " ".join(text.split())


@pytest.mark.parametrize("name", list(BAD_RUNS))
def test_bad_run_exits_2_with_message_and_writes_nothing(name: str, results):
    proc, runs_dir = results[name]
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    stderr = _flat(proc.stderr)
    for want in BAD_RUNS[name][1]:
        assert want in stderr, f"{want!r} not in stderr:\n{proc.stderr}"
    assert "resolved config" not in proc.stdout  # refused before anything is printed
    assert not runs_dir.exists()


def test_resume_of_a_folder_that_is_not_a_run(results):
    proc, folder = results["resume-not-a-run"]
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    stderr = _flat(proc.stderr)
    for want in ("Cannot resume", f"run_dir={folder}", "is not a meshrun run dir",
                 "spec.json", "meshrun run"):
        assert want in stderr, f"{want!r} not in stderr:\n{proc.stderr}"
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoints", "notes.txt"]


def test_each_problem_is_one_line_on_stderr(results):
    proc, _ = results[NARROW]
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "Invalid overrides (1 problem):"
    assert len(lines) == 2 and lines[1].startswith("  model=llama4:") and "tiny" in lines[1]
