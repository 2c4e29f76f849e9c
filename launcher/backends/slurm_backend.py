"""cluster=slurm: submit through submitit (one Slurm task per rank), follow the job through
sacct, stop it with scancel; and, for sweeps, submit many run dirs as job arrays."""
from __future__ import annotations

import subprocess
from pathlib import Path

from rich.console import Console

from conf.errors import ConfigError, Problem
from conf.spec import RunSpec
from launcher.backends import slurm_arrays
from launcher.backends.interface import LaunchBackend
from launcher.backends.slurm_state import SlurmJobHandle, job_state, state_from_scheduler
from launcher.backends.slurm_submit import recorded_jobs, render_sbatch, submit
from launcher.views.progress import watch_run


class SlurmBackend(LaunchBackend):
    kind = "slurm"
    where = "on Slurm"
    on_this_machine = False
    detached = True
    sweepable = True

    def launch_command(self, spec: RunSpec) -> list[str]:
        return ["sbatch", "<run_dir>/slurm/<job>/<job>_submission.sh"]

    def render(self, spec: RunSpec, run_dir: Path, command: list[str], console: Console) -> None:
        console.rule("sbatch script (submitted through submitit; nothing is submitted now)")
        console.print(render_sbatch(spec, run_dir), markup=False, highlight=False, soft_wrap=True)
        console.print(f"each of the {spec.world_size} tasks unpickles "
                      f"training.slurm_entry.SlurmRankTask({str(run_dir)!r}) and trains one rank "
                      "(RANK=SLURM_PROCID); MASTER_ADDR = "
                      f"{spec.cluster.rdzv_host or 'the first node of the allocation'}",
                      markup=False, soft_wrap=True)
        env = " ".join(f"{k}={v}" for k, v in sorted(spec.cluster.env.items()))
        console.print(f"environment set in every rank: {env or '(none)'}", markup=False,
                      soft_wrap=True)

    def launch(self, spec: RunSpec, run_dir: Path, *, console: Console, show_progress: bool,
               wait: bool = False, preflight_only: bool = False, lock=None,
               warm=None) -> int | None:
        """Submit; with `wait` (always for a preflight) follow the job to its end."""
        job_id = submit(spec, run_dir, preflight_only=preflight_only)
        console.print(f"submitted Slurm job {job_id}; follow it with: meshrun status {run_dir}",
                      markup=False)
        if not (wait or preflight_only):
            return None
        return watch_run(SlurmJobHandle(job_id), run_dir=run_dir, spec=spec,
                         show_progress=show_progress)

    def state(self, run_dir: Path, *, scheduler: dict | None = None) -> dict:
        """The newest submission's job as sacct sees it, or squeue without accounting (then
        `scheduler_note` says so); nothing before the first submission."""
        jobs = recorded_jobs(run_dir)
        if not jobs:
            return {}
        job_id = jobs[-1]["job_id"]
        job = (scheduler or {}).get(job_id) or job_state(job_id)
        found = {"job_id": job.job_id, "state": state_from_scheduler(job.state, run_dir),
                 "scheduler_state": job.state, "elapsed": job.elapsed, "nodes": job.nodes,
                 "submissions": len(jobs)}
        return {**found, "scheduler_note": job.note} if job.note else found

    def stop(self, run_dir: Path) -> str:
        """scancel the newest job: Slurm sends its tasks SIGTERM; the ranks checkpoint first."""
        jobs = recorded_jobs(run_dir)
        if not jobs:
            raise ConfigError([Problem("run_dir", str(run_dir), "has no Slurm job",
                                       "nothing to stop")], "Cannot stop")
        job_id = jobs[-1]["job_id"]
        out = subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise ConfigError([Problem("scancel", job_id, out.stderr.strip() or "failed",
                                       "is SLURM_CONF set? `squeue -j JOB` shows the job")],
                              "Cannot stop")
        return f"cancelled Slurm job {job_id} of {run_dir} (its ranks checkpoint first)"

    # Job arrays (sweeps): several run dirs with the same resources in one submission.
    def describe_points(self, specs: list[RunSpec], *, array_parallelism: int) -> list[str]:
        return [f"slurm: {line}" for line in
                slurm_arrays.describe_arrays(specs, array_parallelism=array_parallelism)]

    def array_groups(self, items: list) -> list[list]:
        """`items` (each with a `.spec`) grouped into the job arrays they can share."""
        return slurm_arrays.group_by_resources(items)

    def submit_array(self, spec: RunSpec, run_dirs: list[Path], *, folder: Path,
                     job_name: str, array_parallelism: int) -> list[str]:
        return slurm_arrays.submit_array(spec, run_dirs, folder=folder, job_name=job_name,
                                         array_parallelism=array_parallelism)
