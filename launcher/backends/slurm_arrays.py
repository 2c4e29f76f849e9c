"""Many run dirs as Slurm job arrays (a sweep's points): points whose sbatch resources are
identical share one array (submitit's `executor.batch()`), `array_parallelism` capping how many
of its tasks run at once. Each array task is one run, exactly as `meshrun run cluster=slurm`
submits it: one Slurm task per rank unpickling training.slurm_entry.SlurmRankTask(run_dir)."""
from __future__ import annotations

import json
import time
from pathlib import Path

from conf.spec import RunSpec
from launcher.backends.slurm_submit import build_executor, record_job, sbatch_parameters
from training.slurm_entry import SlurmRankTask


def resources_key(spec: RunSpec) -> str:
    """Points with the same key can share a job array."""
    params = sbatch_parameters(spec, job_name="")
    return json.dumps({"sbatch": params, "python": spec.cluster.python}, sort_keys=True,
                      default=str)


def group_by_resources(items: list, spec_of=lambda item: item.spec) -> list[list]:
    """`items` (prepared points, or anything with a spec) grouped into job arrays, in order."""
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(resources_key(spec_of(item)), []).append(item)
    return list(groups.values())


def describe_arrays(specs: list[RunSpec], *, array_parallelism: int) -> list[str]:
    """One line per job array the points would be submitted as."""
    lines = []
    for group in group_by_resources(specs, spec_of=lambda spec: spec):
        c = group[0].cluster
        gpus = f", {c.gpus_per_node} GPU(s) per node" if c.gpus_per_node else ""
        lines.append(f"job array of {len(group)} point(s): {c.nodes} node(s) x "
                     f"{c.procs_per_node} task(s){gpus}, {c.time_limit_min} min, at most "
                     f"{min(array_parallelism, len(group))} at once")
    return lines


def submit_array(spec: RunSpec, run_dirs: list[Path], *, folder: Path, job_name: str,
                 array_parallelism: int) -> list[str]:
    """Submit `run_dirs` (same resources as `spec`) as one array; record each task's job in its
    run dir (slurm/jobs.json) and return the job ids, in order. Raises what submitit raises."""
    executor = build_executor(spec, folder)
    executor.update_parameters(job_name=job_name, array_parallelism=array_parallelism)
    with executor.batch():
        jobs = [executor.submit(SlurmRankTask(str(run_dir))) for run_dir in run_dirs]
    for run_dir, job in zip(run_dirs, jobs):
        record_job(run_dir, {"job_id": job.job_id,
                             "submitted": time.strftime("%Y-%m-%dT%H:%M:%S"),
                             "stdout": str(job.paths.stdout),
                             "stderr": str(job.paths.stderr), "array": str(folder)})
    return [job.job_id for job in jobs]
