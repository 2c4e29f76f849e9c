"""Submit a run dir to Slurm through submitit: one task per rank, on `cluster.nodes` nodes.

Why one task per rank: Slurm's warning signal and preemption SIGTERM then reach the training
processes directly (a torchrun in between would die on them), and submitit's maintainers
advise against torchrun inside submitit tasks. MASTER_ADDR is the first node of the allocation
unless cluster.rdzv_host says otherwise.
"""
from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

from conf.rundir import RunDir
from conf.spec import ClusterSpec, RunSpec
from training.slurm_entry import SlurmRankTask


def sbatch_parameters(spec: RunSpec, *, job_name: str) -> dict:
    """submitit's update_parameters() arguments for this spec."""
    c = spec.cluster
    params: dict = {"job_name": job_name, "nodes": c.nodes, "ntasks_per_node": c.procs_per_node,
                    "time": c.time_limit_min, "additional_parameters": _additional(c)}
    if c.setup:
        params["setup"] = list(c.setup)
    optional = {"partition": c.partition, "account": c.account, "qos": c.qos,
                "constraint": c.constraint, "cpus_per_task": c.cpus_per_task,
                "gpus_per_node": c.gpus_per_node, "mem": _mem(c.mem_gb)}
    params.update({k: v for k, v in optional.items() if v})
    if c.exclusive:
        params["exclusive"] = True
    srun_args = _container_args(c)
    if srun_args:
        params["srun_args"] = srun_args
    return params


def _mem(mem_gb: int) -> str:
    """--mem's value: -1 = none (the partition decides), 0 = all of the node's memory."""
    if mem_gb < 0:
        return ""
    return "0" if mem_gb == 0 else f"{mem_gb}GB"


def _additional(c: ClusterSpec) -> dict:
    """Our warning signal replaces submitit's USR2 one; requeue allowed; extra sbatch lines."""
    extra = {"signal": c.warning_signal, "requeue": True}
    for option in c.extra_sbatch:
        key, sep, value = option[2:].partition("=")
        extra[key] = value if sep else True
    return extra


def _container_args(c: ClusterSpec) -> list[str]:
    if not c.container_image:
        return []
    args = [f"--container-image={c.container_image}"]
    if c.container_mounts:
        args.append(f"--container-mounts={c.container_mounts}")
    return args


def build_executor(spec: RunSpec, run_dir: Path):
    import submitit

    python = spec.cluster.python or None
    executor = submitit.SlurmExecutor(folder=RunDir(run_dir).slurm_dir / "%j",
                                      python=shlex.quote(python) if python else None)
    # The job name comes from the run dir's name, which is already reduced to safe characters:
    # spec.name may hold anything (quotes, newlines) and sbatch reads #SBATCH lines literally.
    executor.update_parameters(**sbatch_parameters(spec, job_name=f"meshrun-{run_dir.name}"))
    return executor


def render_sbatch(spec: RunSpec, run_dir: Path) -> str:
    """The exact sbatch script `submit` would hand to Slurm (nothing is submitted)."""
    executor = build_executor(spec, run_dir)
    return executor._make_submission_file_text(executor._submitit_command_str, uid="dry-run")


def submit(spec: RunSpec, run_dir: Path, *, preflight_only: bool = False) -> str:
    """Submit the run; record the job id and its log paths in <run_dir>/slurm/jobs.json."""
    task = SlurmRankTask(str(run_dir), preflight_only=preflight_only)
    job = build_executor(spec, run_dir).submit(task)
    record_job(run_dir, {"job_id": job.job_id, "submitted": time.strftime("%Y-%m-%dT%H:%M:%S"),
                         "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr)})
    return job.job_id


def record_job(run_dir: Path, job: dict) -> None:
    path = RunDir(run_dir).jobs_file
    path.parent.mkdir(parents=True, exist_ok=True)
    jobs = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps(jobs + [job], indent=2) + "\n")


def recorded_jobs(run_dir: Path) -> list[dict]:
    path = RunDir(run_dir).jobs_file
    return json.loads(path.read_text()) if path.exists() else []
