"""The dry-run sbatch script for a Slurm spec equals a reviewed golden file.

Paths that differ between machines (the run dir, the Python executable) are replaced by
placeholders; everything else — every #SBATCH line, setup, srun — must match byte for byte.
Regenerate after an intended change with MESHRUN_UPDATE_GOLDEN=1 and review the diff.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from launcher.backends.slurm_submit import render_sbatch, sbatch_parameters
from tests.support.specs import cpu_spec

GOLDEN_DIR = Path(__file__).parent / "golden"
EVERYTHING = ["cluster=slurm", "cluster.nodes=2", "cluster.gpus_per_node=4",
              "cluster.partition=gpu", "cluster.account=team-a", "cluster.qos=high",
              "cluster.cpus_per_task=8", "cluster.mem_gb=480", "cluster.time_limit_min=120",
              "cluster.constraint=h100", "cluster.exclusive=true",
              "cluster.extra_sbatch=['--reservation=big','--mail-type=END']",
              "cluster.setup=['module load cuda/12.4','source /opt/venv/bin/activate']",
              "cluster.container_image='nvcr.io#nvidia/pytorch:24.05-py3'",
              "cluster.container_mounts=/data:/data", "model=llama3_1b", "precision=bf16",
              "training.seq_len=2048", "training.micro_batch_size=1"]
SMALL = ["cluster=slurm", "cluster.nodes=2", "cluster.partition=gpu", "model=llama3_1b",
         "precision=bf16", "training.seq_len=2048", "training.micro_batch_size=1"]
CASES = {
    # Every knob set by hand.
    "sbatch_2x4_gpu.sh": EVERYTHING,
    # Nothing resource-related set: 8 CPUs per rank and whole nodes on 8-GPU nodes.
    "sbatch_2x8_gpu_defaults.sh": SMALL,
    # All of each node's memory (--mem=0), shared nodes, Slurm's CPU default.
    "sbatch_2x8_gpu_mem0_shared.sh": [*SMALL, "cluster.mem_gb=0", "cluster.exclusive=false",
                                      "cluster.cpus_per_task=0"],
    # A CPU-only cluster: no GPU options, no --exclusive, no --cpus-per-task unless asked.
    "sbatch_2x2_cpu.sh": ["cluster=slurm", "cluster.nodes=2", "cluster.gpus_per_node=0",
                          "cluster.procs_per_node=2", "model=tiny"],
}


def rendered(overrides: list[str]) -> str:
    run_dir = Path("/shared/runs/llama3_1b-20260101-000000")
    text = render_sbatch(cpu_spec(*overrides), run_dir)
    return text.replace(str(run_dir), "<RUN_DIR>").replace(sys.executable, "<PYTHON>")


@pytest.mark.parametrize("golden", sorted(CASES))
def test_dry_run_sbatch_script_matches_the_golden_file(golden: str):
    text = rendered(CASES[golden])
    if os.environ.get("MESHRUN_UPDATE_GOLDEN"):
        (GOLDEN_DIR / golden).write_text(text)
    assert text == (GOLDEN_DIR / golden).read_text()


def sbatch_lines(*overrides: str) -> set[str]:
    return {line for line in rendered(list(overrides)).splitlines()
            if line.startswith(("#SBATCH --mem", "#SBATCH --cpus", "#SBATCH --exclusive"))}


@pytest.mark.parametrize(("overrides", "expected"), [
    ((), {"#SBATCH --cpus-per-task=8", "#SBATCH --exclusive"}),
    (("cluster.mem_gb=0",), {"#SBATCH --cpus-per-task=8", "#SBATCH --exclusive",
                             "#SBATCH --mem=0"}),
    (("cluster.mem_gb=-1", "cluster.exclusive=false"), {"#SBATCH --cpus-per-task=8"}),
    (("cluster.mem_gb=64", "cluster.cpus_per_task=12"),
     {"#SBATCH --cpus-per-task=12", "#SBATCH --exclusive", "#SBATCH --mem=64GB"}),
    (("cluster.gpus_per_node=1",), {"#SBATCH --cpus-per-task=8"}),  # one GPU: nodes shared
    (("cluster.gpus_per_node=0", "cluster.procs_per_node=2"), set()),
    (("cluster.gpus_per_node=0", "cluster.procs_per_node=2", "cluster.exclusive=true",
      "cluster.cpus_per_task=4"), {"#SBATCH --cpus-per-task=4", "#SBATCH --exclusive"}),
])
def test_cpus_mem_and_exclusive_lines(overrides: tuple[str, ...], expected: set[str]):
    assert sbatch_lines(*SMALL, *overrides) == expected


def test_mem_zero_reaches_submitit_as_zero_not_unset():
    params = sbatch_parameters(cpu_spec(*SMALL, "cluster.mem_gb=0"), job_name="x")
    assert params["mem"] == "0"
    assert "mem" not in sbatch_parameters(cpu_spec(*SMALL), job_name="x")
