"""Submit a run dir to Slurm through submitit: one task per rank, on `cluster.nodes` nodes.

Why one task per rank: Slurm's warning signal and preemption SIGTERM then reach the training
processes directly (a torchrun in between would die on them), and submitit's maintainers
advise against torchrun inside submitit tasks. MASTER_ADDR is the first node of the allocation
unless cluster.rdzv_host says otherwise.
"""
from __future__ import annotations

import contextlib
import io
import json
import shlex
import time
from pathlib import Path

from conf.errors import ConfigError, Problem
from conf.run_dir.paths import RunDir
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
    return submitit_sbatch_text(build_executor(spec, run_dir))


def submitit_sbatch_text(executor) -> str:
    """The sbatch script submitit writes for `executor`'s next single-job submission.

    submitit 1.5 has no public way to render it: this is the one place meshrun reaches into
    its private API (`_make_submission_file_text`, `_submitit_command_str`, the same two calls
    `SlurmExecutor._submit_command` makes). tests/unit/test_slurm_submit.py fails with a
    pointer here if a submitit upgrade renames them.
    """
    return executor._make_submission_file_text(executor._submitit_command_str, uid="dry-run")


class SubmissionFailed(ConfigError):
    """sbatch refused the job (most often: unknown partition or account)."""


def submit(spec: RunSpec, run_dir: Path, *, preflight_only: bool = False) -> str:
    """Submit the run; record the job id and its log paths in <run_dir>/slurm/jobs.json.

    Raises SubmissionFailed, carrying sbatch's own words, when sbatch refuses the job.
    """
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    task = SlurmRankTask(str(run_dir), preflight_only=preflight_only)
    executor = build_executor(spec, run_dir)
    echoed = io.StringIO()  # submitit prints sbatch's stderr itself; it goes in our message
    try:
        with contextlib.redirect_stderr(echoed):
            job = executor.submit(task)
    except (FailedJobError, FailedSubmissionError) as err:
        raise submission_failed(spec, str(err) or echoed.getvalue()) from None
    record_job(run_dir, {"job_id": job.job_id, "submitted": time.strftime("%Y-%m-%dT%H:%M:%S"),
                         "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr)})
    return job.job_id


def submission_failed(spec: RunSpec, sbatch_error: str) -> SubmissionFailed:
    c = spec.cluster
    said = "; ".join(line.strip() for line in sbatch_error.strip().splitlines() if line.strip())
    where = (f"partition {c.partition or '(the default)'}, account {c.account or '(your default)'}"
             + (f", qos {c.qos}" if c.qos else ""))
    return SubmissionFailed([Problem(
        "sbatch", "", f"refused the job for {where}: {said or 'no message'}",
        "check cluster.partition / cluster.account / cluster.qos: `sinfo -s` lists partitions, "
        "`sacctmgr show assoc user=$USER format=account,partition,qos` what you may use")],
        "Slurm submission failed")


def record_job(run_dir: Path, job: dict) -> None:
    path = RunDir(run_dir).jobs_file
    path.parent.mkdir(parents=True, exist_ok=True)
    jobs = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps(jobs + [job], indent=2) + "\n")


def recorded_jobs(run_dir: Path) -> list[dict]:
    path = RunDir(run_dir).jobs_file
    return json.loads(path.read_text()) if path.exists() else []
