"""`meshrun sweep status <dir>`: where each point of a sweep stands.

A point's state is a `conf.run_dir.run_states.RunState` word (the vocabulary `meshrun status` and
`meshrun compare` use too). It comes from its latest run dir
(launcher.views.run_status.run_status: the scheduler's word for Slurm jobs) and, for local runs,
from points.json (the exit status of the attempt, whether the local sweep runner is still alive)
through `conf.run_dir.run_states.state_after_exit`. A local point is "running" only while a
live process holds its run dir's lock (`point_owner`); one whose processes all died under a
runner that died too is "stopped" (interrupted: `sweep retry` continues it in its run dir).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from conf.errors import ConfigError
from conf.run_dir.paths import RunDir
from conf.run_dir.run_states import (ACTIVE_STATES, FAILED_STATES, FINISHED_STATES,
                                     RETRYABLE_STATES, RunState, state_after_exit,
                                     state_from_files)
from sweeps.narrow_table import column_width, print_fitted, wrapped_header
from sweeps.state import SweepState

INTERRUPTED_FILE_STATES = (RunState.paused, RunState.stopped, *FAILED_STATES)
"""What a point's own files may say when its processes are gone and no exit was recorded."""
STATES = tuple(RunState)
"""Counting order."""
ACTIVE = ACTIVE_STATES
RETRYABLE = RETRYABLE_STATES
STYLES = {"completed": "green", "preflight passed": "green", "running": "cyan", "pending": "dim", "created": "dim",
          "paused": "yellow", "requeued": "cyan", "stopped": "yellow", "missing": "yellow",
          "unknown": "yellow"}
"""Any other state (a failure) is red."""


def sweep_status(state: SweepState) -> list[dict]:
    """One row per point: index, name, values, state, step, steps, loss, mfu (after warm-up,
    conf.run_dir.outcomes.mfu_after_warmup, as compare shows it), run_dir."""
    alive = state.runner_alive()
    scheduler = scheduler_states(state, [r["index"] for r in state.records])
    return [point_status(state, record, runner_alive=alive, scheduler=scheduler)
            for record in state.records]


def scheduler_states(state: SweepState, indices: list[int]) -> dict:
    """The Slurm states of the points' latest jobs, from one sacct call for all of them ({} for
    a local sweep: no sacct call at all)."""
    from launcher.backends.slurm_submit import recorded_jobs
    from launcher.backends.slurm_state import job_states

    job_ids = []
    for index in indices:
        run_dir = state.latest_run_dir(index)
        jobs = recorded_jobs(run_dir) if run_dir is not None and run_dir.is_dir() else []
        job_ids += [jobs[-1]["job_id"]] if jobs else []
    try:
        return job_states(job_ids)
    except RuntimeError:
        return {}  # each point then asks on its own and reports the failure in its row


def point_status(state: SweepState, record: dict, *, runner_alive: bool,
                 scheduler: dict | None = None) -> dict:
    row = {"index": record["index"], "name": record["name"], "values": record["values"],
           "run_dir": None, "state": RunState.pending if runner_alive else RunState.missing,
           "step": 0,
           "steps": None, "loss": None, "mfu": None, "attempts": len(record["attempts"])}
    run_dir = state.latest_run_dir(record["index"])
    if run_dir is None:
        return row
    row["run_dir"] = str(run_dir)
    attempt = record["attempts"][-1] if record["attempts"] else {}
    if attempt.get("error"):
        return {**row, "state": RunState.failed, "error": attempt["error"]}
    if not RunDir(run_dir).is_run_dir:
        return {**row, "state": RunState.missing}
    try:
        from launcher.views.run_status import run_status

        status = run_status(run_dir, scheduler=scheduler)
    except (ConfigError, RuntimeError, OSError, ValueError) as err:
        return {**row, "state": RunState.unknown, "error": str(err).splitlines()[0]}
    latest = status.get("latest") or {}
    row.update(step=status["step"], loss=latest.get("loss"), mfu=status.get("mfu"),
               val_loss=status.get("val_loss"), steps=_steps(run_dir))
    if "job_id" in status:  # the scheduler's word, already a RunState
        row.update(job_id=status["job_id"], state=status["state"])
    else:
        row["state"] = local_state(run_dir, exit_status=attempt.get("exit_status"),
                                   runner_alive=runner_alive)
    return row


def local_state(run_dir: Path, *, exit_status: int | None, runner_alive: bool) -> RunState:
    """A point run on this machine: running only while a live process holds its run dir's
    lock (or, before its launcher has taken it, while the sweep's runner lives); a point whose
    processes are all gone without an exit status recorded was interrupted (stopped), unless
    its files say it finished or failed."""
    files = state_from_files(run_dir)
    if files in FINISHED_STATES:
        return files
    if point_owner(run_dir) is not None:
        return RunState.running
    if exit_status is None and not runner_alive:
        return files if files in INTERRUPTED_FILE_STATES else RunState.stopped
    return state_after_exit(run_dir, exit_status=exit_status, launcher_alive=runner_alive)


def point_owner(run_dir: Path | None) -> dict | None:
    """Who holds `run_dir`'s lock (launcher.backends.run_lock: a flock, so only a live
    process does): the point's launcher, or its torchrun still stopping the ranks."""
    from launcher.backends.run_lock import lock_holder

    if run_dir is None or not Path(run_dir).is_dir():
        return None
    return lock_holder(run_dir)


def _steps(run_dir: Path) -> int | None:
    try:
        return json.loads(RunDir(run_dir).spec_file.read_text())["training"]["steps"]
    except (OSError, ValueError, KeyError):
        return None


def counts(rows: list[dict]) -> dict[str, int]:
    found = Counter(str(r["state"]) for r in rows)
    return {s.value: found[s.value] for s in STATES if found[s.value]}


WHOLE_COLUMNS = ("#", "state", "step", "loss", "MFU")
"""Never wrapped nor cut, also at 80 columns; the values and the run dir fold instead."""


def status_table(rows: list[dict], *, title: str) -> Table:
    """One row per point, sized as the sweep preview is (sweeps/narrow_table.py): no rules,
    headers broken at '.'/'_', state, step, loss and MFU whole, values and run dir folded."""
    keys = list(dict.fromkeys(k for r in rows for k in r["values"]))
    shorts = [k.split(".")[-1] for k in keys]
    headers = ["#", *[s if shorts.count(s) == 1 else k for k, s in zip(keys, shorts)],
               "state", "step", "loss", "MFU", "run dir"]
    cells = [_status_cells(r, keys) for r in rows]
    table = Table(title=title, title_justify="left", box=None, pad_edge=False,
                  header_style="bold")
    for i, header in enumerate(headers):
        width = column_width(header, [c[i].plain for c in cells])
        whole = header in WHOLE_COLUMNS
        table.add_column(wrapped_header(header, width), min_width=width if whole else None,
                         no_wrap=whole, overflow="fold",
                         justify="right" if header in ("#", "step", "loss", "MFU") else "left",
                         style="cyan" if 0 < i <= len(keys) else None)
    for row in cells:
        table.add_row(*row)
    return table


def _status_cells(r: dict, keys: list[str]) -> list[Text]:
    step = (f"{r['step']}/{r['steps']}" if r.get("steps")
            else str(r["step"]) if r["step"] else "-")
    return [Text(str(r["index"])), *[Text(str(r["values"].get(k, ""))) for k in keys],
            Text(str(r["state"]), style=STYLES.get(str(r["state"]), "red")), Text(step),
            Text(f"{r['loss']:.4f}" if r.get("loss") is not None else "-"),
            Text(f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-"),
            Text(Path(r["run_dir"]).name if r.get("run_dir") else "-")]


def print_sweep_status(state: SweepState, console: Console, *, as_json: bool = False) -> list[dict]:
    rows = sweep_status(state)
    if as_json:
        print(json.dumps({"sweep_dir": str(state.dir), "sweep": state.data.get("sweep"),
                          "counts": counts(rows), "points": rows}, indent=2, default=str))
        return rows
    console.print(f"Sweep {state.data.get('sweep')}: {state.dir}", markup=False, soft_wrap=True)
    print_fitted(status_table(rows, title=""), console)
    summary = ", ".join(f"{n} {s}" for s, n in counts(rows).items())
    console.print(f"{len(rows)} point{'s' if len(rows) != 1 else ''}: {summary}", markup=False)
    if any(r["state"] in RETRYABLE for r in rows):
        console.print("rerun the failed and missing points, continue the stopped points with:",
                      markup=False)
        console.print(f"  meshrun sweep retry {state.dir}", markup=False, soft_wrap=True)
    return rows
