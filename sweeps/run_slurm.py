"""Submit a sweep's points to Slurm as job arrays, through submitit.

Points whose sbatch resources are identical (nodes, tasks, GPUs, partition, time, ...) share
one array (`executor.batch()`); `array_parallelism` caps how many of its tasks run at once.
Every array task is one point, run exactly like `meshrun run cluster=slurm`: one Slurm task
per rank unpickling training.slurm_entry.SlurmRankTask(run_dir), multi-node points included.
Each point's job id is recorded in its run dir (slurm/jobs.json), so `meshrun status <run dir>`
and `meshrun resume <run dir>` work on a point as on any run.
"""
from __future__ import annotations

import json
import time

from rich.console import Console

from conf.spec import RunSpec
from conf.rundir import safe_name
from launcher.backends.slurm_submit import build_executor, record_job, sbatch_parameters
from sweeps.run_local import Prepared
from sweeps.state import SweepState
# the rank entry point, as the launcher submits it
from launcher.backends.slurm_submit import SlurmRankTask

ARRAYS_DIR = "arrays"

def resources_key(spec: RunSpec) -> str:
    """Points with the same key can share a job array."""
    params = sbatch_parameters(spec, job_name="")
    return json.dumps({"sbatch": params, "python": spec.cluster.python}, sort_keys=True,
                      default=str)

def group_by_resources(items: list, spec_of=lambda item: item.spec) -> list[list]:
    """`items` (Prepared points, or anything with a spec) grouped into job arrays, in order."""
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

def submit_arrays(state: SweepState, prepared: list[Prepared], *, array_parallelism: int,
                  sweep_name: str, console: Console) -> list[str]:
    """Submit one array per resource group; return the job ids. A group that cannot be
    submitted is recorded as failed on its points and the other groups still go."""
    job_ids = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for k, group in enumerate(group_by_resources(prepared)):
        folder = state.dir / ARRAYS_DIR / f"{stamp}-{k}"
        executor = build_executor(group[0].spec, folder)
        executor.update_parameters(job_name=f"meshrun-{safe_name(sweep_name)}",
                                   array_parallelism=array_parallelism)
        try:
            with executor.batch():
                jobs = [executor.submit(SlurmRankTask(str(p.run_dir))) for p in group]
        except Exception as err:  # noqa: BLE001 - reported per point; other groups go on
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            for p in group:
                state.finish_attempt(p.index, error=f"submission failed: {first}")
            console.print(f"could not submit {len(group)} point(s): {first}", markup=False,
                          soft_wrap=True)
            continue
        for p, job in zip(group, jobs):
            record_job(p.run_dir, {"job_id": job.job_id,
                                   "submitted": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                   "stdout": str(job.paths.stdout),
                                   "stderr": str(job.paths.stderr), "array": str(folder)})
            state.finish_attempt(p.index, job_id=job.job_id)
            job_ids.append(job.job_id)
        spec = group[0].spec
        kind = "array" if len(group) > 1 else "job"  # submitit submits a lone point plainly
        console.print(f"submitted {len(group)} point(s) as {kind} {jobs[0].job_id.split('_')[0]} "
                      f"({spec.cluster.nodes} node(s) x {spec.cluster.procs_per_node} task(s) "
                      f"each, at most {min(array_parallelism, len(group))} at once)",
                      markup=False, soft_wrap=True)
    return job_ids

def wait_for_points(state: SweepState, indices: list[int], *, console: Console,
                    timeout_s: float | None = None) -> None:
    """Poll the points' states until none is pending or running; print changes of counts."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        _poll(state, indices, console, deadline)
    except KeyboardInterrupt:
        console.print(f"detached; the jobs run on: meshrun sweep status {state.dir}", markup=False)

def _poll(state: SweepState, indices: list[int], console: Console, deadline: float | None) -> None:
    """One sacct call per poll for all the points' jobs; the polls grow apart (poll_intervals)."""
    from launcher.backends.slurm_state import poll_intervals
    from sweeps.track import ACTIVE, counts, point_status, scheduler_states

    last = None
    intervals = poll_intervals()
    while True:
        scheduler = scheduler_states(state, indices)
        rows = [point_status(state, state.record(i), runner_alive=False, scheduler=scheduler)
                for i in indices]
        now = counts(rows)
        if now != last:
            console.print("  " + ", ".join(f"{n} {s}" for s, n in now.items()), markup=False)
            last = now
        if not any(r["state"] in ACTIVE for r in rows):
            return
        if deadline is not None and time.monotonic() > deadline:
            return
        time.sleep(next(intervals))

