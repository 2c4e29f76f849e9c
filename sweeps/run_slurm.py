"""Submit a sweep's points to Slurm as job arrays, through the Slurm launch backend.

Points whose sbatch resources are identical share one array (SlurmBackend.array_groups);
`array_parallelism` caps how many of its tasks run at once. Every array task is one point, run
exactly like `meshrun run cluster=slurm` (launcher/backends/slurm_arrays.py). Each point's job
id is recorded in its run dir (slurm/jobs.json), so `meshrun status <run dir>` and
`meshrun resume <run dir>` work on a point as on any run.
"""
from __future__ import annotations

import time

from rich.console import Console

from conf.run_dir.paths import safe_name
from sweeps.run_local import Prepared
from sweeps.state import SweepState

ARRAYS_DIR = "arrays"


def submit_arrays(state: SweepState, prepared: list[Prepared], *, backend, array_parallelism: int,
                  sweep_name: str, console: Console) -> list[str]:
    """Submit one array per resource group through `backend` (a SlurmBackend); return the job
    ids. A group that cannot be submitted is recorded as failed on its points and the other
    groups still go."""
    job_ids = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for k, group in enumerate(backend.array_groups(prepared)):
        folder = state.dir / ARRAYS_DIR / f"{stamp}-{k}"
        try:
            ids = backend.submit_array(group[0].spec, [p.run_dir for p in group], folder=folder,
                                       job_name=f"meshrun-{safe_name(sweep_name)}",
                                       array_parallelism=array_parallelism)
        except Exception as err:  # noqa: BLE001 - reported per point; other groups go on
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            for p in group:
                state.finish_attempt(p.index, error=f"submission failed: {first}")
            console.print(f"could not submit {len(group)} point(s): {first}", markup=False,
                          soft_wrap=True)
            continue
        for p, job_id in zip(group, ids):
            state.finish_attempt(p.index, job_id=job_id)
        job_ids += ids
        spec = group[0].spec
        kind = "array" if len(group) > 1 else "job"  # submitit submits a lone point plainly
        console.print(f"submitted {len(group)} point(s) as {kind} {ids[0].split('_')[0]} "
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

