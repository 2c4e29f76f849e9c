"""The dry-run sbatch script for a Slurm spec equals a reviewed golden file.

Paths that differ between machines (the run dir, the Python executable) are replaced by
placeholders; everything else — every #SBATCH line, setup, srun — must match byte for byte.
Regenerate after an intended change with MESHRUN_UPDATE_GOLDEN=1 and review the diff.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from launcher.slurm import render_sbatch
from tests.support.specs import cpu_spec

GOLDEN = Path(__file__).parent / "golden" / "sbatch_2x4_gpu.sh"
OVERRIDES = ["cluster=slurm", "cluster.nodes=2", "cluster.gpus_per_node=4",
             "cluster.partition=gpu", "cluster.account=team-a", "cluster.qos=high",
             "cluster.cpus_per_task=8", "cluster.mem_gb=480", "cluster.time_limit_min=120",
             "cluster.constraint=h100", "cluster.exclusive=true",
             "cluster.extra_sbatch=['--reservation=big','--mail-type=END']",
             "cluster.setup=['module load cuda/12.4','source /opt/venv/bin/activate']",
             "cluster.container_image='nvcr.io#nvidia/pytorch:24.05-py3'",
             "cluster.container_mounts=/data:/data", "model=llama3_1b", "precision=bf16",
             "training.seq_len=2048", "training.micro_batch_size=1"]


def rendered() -> str:
    run_dir = Path("/shared/runs/llama3_1b-20260101-000000")
    text = render_sbatch(cpu_spec(*OVERRIDES), run_dir)
    return text.replace(str(run_dir), "<RUN_DIR>").replace(sys.executable, "<PYTHON>")


def test_dry_run_sbatch_script_matches_the_golden_file():
    text = rendered()
    if os.environ.get("MESHRUN_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
