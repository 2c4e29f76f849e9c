"""Point states from run dirs and scheduler words, which points run together locally, and the
package's import rules (sweeps builds on conf and launcher; nothing below imports sweeps)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conf.run_dir.run_states import state_after_exit, state_from_files
from conf.spec import HostSpec
from launcher.backends.slurm_state import state_from_scheduler
from sweeps.expand import expand
from sweeps.run_local import Slots
from sweeps.spec_file import inline_sweep
from sweeps.validate import validate

REPO = Path(__file__).resolve().parents[2]
MINE = ("sweep_command", "expand", "naming", "preview", "run_local", "run_slurm",
        "spec_file", "state", "submit", "track", "validate", "watch")
TORCH_FREE_TRAINING = ("training.slurm_entry",)
TORCH_FREE_PARALLEL = "parallel.cost"  # the cost model; the rest of parallel needs torch


@pytest.mark.parametrize(("scheduler", "tail", "summary", "want"), [
    ("PENDING", "", False, "pending"), ("RUNNING", "", False, "running"),
    ("COMPLETED", "", True, "completed"), ("COMPLETED", "", False, "stopped"),
    ("FAILED", "ValueError: bad", False, "failed"),
    ("FAILED", "torch.OutOfMemoryError: CUDA out of memory.", False, "out of memory"),
    ("OUT_OF_MEMORY", "", False, "out of memory"), ("TIMEOUT", "", False, "timed out"),
    ("PREEMPTED", "", False, "preempted"), ("CANCELLED", "", False, "cancelled"),
    ("NODE_FAIL", "", False, "failed"),
])
def test_slurm_states(tmp_path, scheduler, tail, summary, want):
    (tmp_path / "logs").mkdir()
    if tail:
        (tmp_path / "logs" / "rank0.log").write_text(f"Traceback\n{tail}\n")
    if summary:
        (tmp_path / "summary.json").write_text("{}")
    assert state_from_scheduler(scheduler, tmp_path) == want


def test_local_states(tmp_path):
    (tmp_path / "logs").mkdir()

    def state(exit_status, *, alive=False):
        return state_after_exit(tmp_path, exit_status=exit_status, launcher_alive=alive)

    assert state_from_files(tmp_path) == "created"
    assert state(None, alive=True) == "running"
    assert state(None) == "failed"
    assert state(130) == "stopped"
    assert state(-9) == "out of memory"
    (tmp_path / "metrics.jsonl").write_text('{"kind": "event", "event": "paused", "step": 3}\n')
    assert state_from_files(tmp_path) == "paused" and state(0) == "paused"
    (tmp_path / "metrics.jsonl").unlink()
    (tmp_path / "logs" / "rank0.log").write_text("Traceback\nRuntimeError: CUDA out of memory\n")
    assert state_from_files(tmp_path) == "running"
    assert state(1) == "out of memory"
    (tmp_path / "summary.json").write_text("{}")
    assert state(0) == "completed" and state_from_files(tmp_path) == "completed"


def _specs(overrides: list[str], host: HostSpec):
    return [c.spec for c in validate(expand(inline_sweep(overrides)), host=host)]


def test_points_share_the_gpus_of_this_machine():
    gpus = HostSpec(gpu_name="NVIDIA H100 80GB HBM3", gpu_count=8, compute_capability=9.0,
                    cpu_count=64)
    specs = _specs(["cluster.procs_per_node=4", "optim.lr=1,2,3"], gpus)
    slots = Slots(gpus, parallel=4, sizes=[s.world_size for s in specs])
    assert not slots.serial_reason
    assert slots.take(specs[0], busy=0)
    first = slots.env_for(specs[0])
    assert slots.take(specs[1], busy=1)
    second = slots.env_for(specs[1])
    assert (first, second) == ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
                               {"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert not slots.take(specs[2], busy=2)  # no GPU left: it waits
    slots.give_back(specs[0], first)
    assert slots.take(specs[2], busy=1) and slots.env_for(specs[2]) == first


def test_points_that_do_not_fit_together_run_one_at_a_time():
    cpu = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=2)
    specs = _specs(["cluster.procs_per_node=2", "optim.lr=1,2"], cpu)
    slots = Slots(cpu, parallel=2, sizes=[s.world_size for s in specs])
    assert "two points need 4 of this machine's 2 CPU cores" in slots.serial_reason
    assert slots.take(specs[0], busy=0) and not slots.take(specs[1], busy=1)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module)
    return found


def test_sweeps_builds_on_conf_and_launcher_only():
    for name in MINE:
        for module in _imports(REPO / "sweeps" / f"{name}.py"):
            top = module.split(".")[0]
            if top == "training":
                assert module in TORCH_FREE_TRAINING, (name, module)
            if top == "parallel":
                assert module.startswith(TORCH_FREE_PARALLEL + "."), (name, module)
            assert top != "torch", (name, module)
    for package in ("conf", "launcher", "training", "parallel"):
        for path in (REPO / package).rglob("*.py"):
            assert not any(m.split(".")[0] == "sweeps" for m in _imports(path)), path


def test_the_sweep_modules_never_import_torch():
    code = ("import sys; " + "; ".join(f"import sweeps.{m}" for m in MINE) +
            "; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
