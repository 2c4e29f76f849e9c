"""`meshrun run --dry-run`: prints the resolved config, the plan and the launch command, writes
nothing, and never imports torch."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conf.compose import compose_config, config_yaml
from conf.resolve import resolve
from conf.spec import HostSpec
from parallel.cost.flops import FLOPS_CONVENTION
from parallel.cost.plan import make_plan
from tests.support.meshrun_cli import meshrun

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e

# Pinned so the output is the same on a GPU machine: 2 CPU ranks.
PINNED = ["training.device=cpu", "cluster.procs_per_node=2"]
QUOTED = ["name='my run'", 'logging.wandb_entity="team \\"x\\" y"']


def _env() -> dict[str, str]:
    # Wide enough that rich does not wrap the plan table.
    return {**os.environ, "COLUMNS": "250", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("dry") / "runs"
    args = ["run", "--dry-run", *PINNED, *QUOTED, f"runs_dir={runs_dir}"]
    proc = meshrun(*args, env=_env(), timeout=60)
    return proc, runs_dir


def test_exits_0_and_writes_nothing(dry_run):
    proc, runs_dir = dry_run
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not runs_dir.exists()


def test_prints_the_resolved_config(dry_run):
    proc, runs_dir = dry_run
    out = proc.stdout
    assert "resolved config" in out
    # The whole composed config, exactly as config.yaml in a run dir would hold it.
    want = config_yaml(compose_config([*PINNED, *QUOTED, f"runs_dir={runs_dir}"]))
    assert want.strip() in out
    for line in ("model:", "  name: debug", "training:", "  device: cpu", "parallel:",
                 "  name: ddp", "cluster:", "  procs_per_node: 2"):
        assert f"\n{line}\n" in out, line


def test_quoted_overrides_reach_the_config_intact(dry_run):
    out = dry_run[0].stdout
    assert "\nname: my run\n" in out
    assert '  wandb_entity: team "x" y\n' in out
    assert "Plan: my run" in out
    assert "/my_run-" in out  # the run dir name is made safe, the config keeps the name


def test_prints_the_plan_numbers(dry_run):
    out = dry_run[0].stdout
    cpu = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=2)
    plan = make_plan(resolve(compose_config(PINNED), host=cpu))
    assert plan.world_size == 2 and plan.tokens_per_step == 16 * 2 * 128
    for label, value in (("world size", "2 = 1 node(s) x 2 process(es); dp=2"),
                         ("tokens per step", f"{plan.tokens_per_step:,}"),
                         ("parameters", f"{plan.params.total:,} total"),
                         ("FLOPs per token", FLOPS_CONVENTION)):
        assert _row(out, label) and value in _row(out, label), (label, value)
    assert "6N + 12*L*H*Q*T" in _row(out, "FLOPs per token")
    for label in ("parameters", "gradients", "optimizer state", "master weights",
                  "activations"):
        assert "MiB" in _row(out, f"  {label}"), label
    assert "memory per rank" in out
    assert "weight copies" in out
    assert "fits: " in _row(out, "fits device") and "CPU: 2 rank(s)" in _row(out, "fits device")


def test_dry_run_says_when_a_run_does_not_fit_and_what_would(tmp_path):
    """The README's 8B example (DDP, 8 x H100 80GB): the verdict and re-planned suggestions."""
    args = ["run", "--dry-run", "model=llama3_8b", "precision=bf16", "cluster=slurm",
            "cluster.nodes=1", "cluster.gpus_per_node=8", "cluster.gpu_name=H100",
            f"runs_dir={tmp_path}"]
    proc = meshrun(*args, env=_env(), timeout=60)
    assert proc.returncode == 2, proc.stderr  # the dry run shows all, then refuses: no --force
    assert "DOES NOT FIT" in _row(proc.stdout, "fits device")
    assert "Does not fit: what would (each re-planned)" in proc.stdout
    assert "parallel.zero=2" in proc.stdout
    assert "Cannot launch" in proc.stderr and "--force" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_prints_the_launch_command(dry_run):
    proc, runs_dir = dry_run
    out = proc.stdout
    assert "launch command:" in out
    command = out.split("launch command:")[1].strip().splitlines()[0]
    assert "-m torch.distributed.run --standalone" in command
    assert "--nnodes=1 --nproc_per_node=2 -m training" in command
    assert str(runs_dir / "my_run-") in command


def _row(out: str, label: str) -> str:
    """The table row whose first cell is `label` ('' when absent)."""
    for line in out.splitlines():
        cells = [c for c in line.split("│")]
        if len(cells) >= 3 and cells[1].rstrip() == f" {label}".rstrip():
            return cells[2]
    return ""


def test_dry_run_and_plan_never_import_torch(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from launcher.cli import main
        assert main(['run', '--dry-run', 'runs_dir={tmp_path}/runs']) == 0
        assert 'torch' not in sys.modules, 'run --dry-run imported torch'
        assert main(['plan', 'model=llama3_8b']) == 0
        assert 'torch' not in sys.modules, 'plan imported torch'
        assert main(['plan', '--json', 'model=llama3_8b', 'cluster=slurm',
                     'cluster.gpus_per_node=8', 'cluster.gpu_name=H100']) == 0
        assert 'torch' not in sys.modules, 'the verdict or its suggestions imported torch'
        print('NO-TORCH-OK')
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "NO-TORCH-OK" in proc.stdout
    assert not (tmp_path / "runs").exists()


def test_dry_run_shows_each_ranks_coordinates_groups_and_memory(tmp_path):
    """pp2 x dp2 x tp2 on 8 ranks: rank 5 is pp 1, dp 0, tp 1; it shares tp with 4, dp with
    7 and pp with 1; the rank table shows its static memory from the cost model."""
    from parallel.cost.memory import estimate_memory
    from tests.support.specs import cpu_spec

    args = ["run", "--dry-run", "training.device=cpu", "parallel=3d", "model=tiny",
            "cluster.procs_per_node=8", f"runs_dir={tmp_path}"]
    proc = meshrun(*args, env=_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "3d: pp 2 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 2" in _row(proc.stdout, "layout")
    rows = {cells[0]: cells for cells in _table_rows(proc.stdout) if cells[0].isdigit()}
    assert sorted(rows, key=int) == [str(r) for r in range(8)]
    spec = cpu_spec("parallel=3d", "model=tiny", "cluster.procs_per_node=8")
    m = estimate_memory(spec, rank=5)
    static = f"{(m.params + m.grads + m.optimizer) / 1024**2:.2f}M"
    assert rows["5"][1:7] == ["1,0,0,1", "4-5", "5,7", "1,5", "-", static]


def _table_rows(out: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("│ ").split("│")]
            for line in out.splitlines() if line.startswith("│")]
