"""`meshrun status <run_dir>`: where a run stands, from its run dir and the scheduler."""
from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from conf.errors import ConfigError, Problem
from conf.run_dir.failure_diagnosis import failure_tail
from conf.run_dir.outcomes import mfu_after_warmup
from conf.run_dir.heartbeats import HANG_REPORT_FILE, HUNG_EVENT, stale_ranks
from conf.run_dir.paths import RunDir
from conf.run_dir.restart_legs import RESTART_KEY
from conf.run_dir.expert_collapse import collapse_lines
from conf.run_dir.stragglers import describe_straggler, stragglers, wait_partial
from conf.run_dir.run_states import FAILED_STATES, RunState, state_from_files
from launcher.backends.choose import backend_of_run_dir
from launcher.backends.slurm_state import JobState


def run_status(run_dir: Path, *, scheduler: dict[str, JobState] | None = None) -> dict:
    """State, step reached, latest metrics and requeues of a run dir, and what its launch
    backend adds (`LaunchBackend.state`: a Slurm job's id, elapsed time and own word).

    `state` is a `conf.run_dir.run_states.RunState` word; a Slurm job's own word is kept as
    `scheduler_state`. `scheduler`: job states already asked of sacct (`job_states`, one call
    for many runs); a job not in it is asked on its own."""
    if not RunDir(run_dir).is_run_dir:
        raise ConfigError([Problem("run_dir", str(run_dir), "is not a meshrun run dir",
                                   "pass a folder made by `meshrun run`")], "Cannot show status")
    rows = RunDir(run_dir).read_rows()
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    events = [r for r in rows if r.get("kind") == "event"]
    status = {"run_dir": str(run_dir), "step": train[-1]["step"] if train else 0,
              "latest": train[-1] if train else {}, "val_loss": evals[-1]["val_loss"] if evals else None,
              "mfu": mfu_after_warmup(rows),
              "requeues": sum(1 for e in events if e.get("event") == "requeued"),
              "state": state_from_files(run_dir), "legs": _legs(RunDir(run_dir))}
    backend = backend_of_run_dir(run_dir)
    if backend is not None:
        status.update(backend.state(run_dir, scheduler=scheduler))
    status.update(progress_notes(run_dir, rows, status["state"]))
    if status["state"] in FAILED_STATES and status["state"] is not RunState.hung:
        status["log_tail"] = failure_tail(run_dir)
    return status


def progress_notes(run_dir: Path, rows: list[dict], state: RunState) -> dict:
    """Stragglers (conf/run_dir/stragglers.py); a hang's report; ranks silent past their
    timeout while the run still counts as running (before, or without, a watchdog)."""
    notes = {"stragglers": [describe_straggler(s) for s in stragglers(rows)],
             "wait_partial": wait_partial(rows), "expert_collapse": collapse_lines(rows)}
    if state is RunState.hung:
        hung = [r for r in rows if r.get("event") == HUNG_EVENT][-1]
        notes["hang"] = (f"{hung.get('message', 'hung')}; report: "
                         f"{RunDir(run_dir).logs_dir / HANG_REPORT_FILE}")
    elif state is RunState.running:
        setting = RunDir(run_dir).read_spec().training.hang_timeout_s
        notes["stalled"] = [f"rank {s['rank']}: no heartbeat for {s['silent_s']:.0f} s "
                            f"(phase {s.get('phase')}, step {s.get('step')})"
                            for s in stale_ranks(run_dir, setting=setting)]
    return notes


def _legs(rd: RunDir) -> list[dict]:
    """The run, then each `meshrun resume`: the overrides each was given."""
    first = rd.read_overrides() if rd.overrides_file.is_file() else []
    legs = [{"leg": 1, "command": "run", "overrides": first}]
    for n, leg in enumerate(rd.read_resumes(), start=2):
        row = {"leg": n, "command": "resume", "time": leg.get("time", ""),
               "overrides": leg.get("overrides", [])}
        if RESTART_KEY in leg:  # an automatic restart (training.max_restarts)
            row.update(command=f"restart {leg[RESTART_KEY]}", after=leg.get("after", {}))
        legs.append(row)
    return legs


def print_status(status: dict, console: Console) -> None:
    """The run dir on its own line (soft-wrapped by the terminal, never cut: it is copied),
    then a table of the rest."""
    console.print(f"run dir: {status['run_dir']}", markup=False, highlight=False,
                  soft_wrap=True)
    table = Table(title="Status", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")  # wrapped, never cut with an ellipsis
    latest = status.get("latest") or {}
    state = str(status["state"])
    if "scheduler_state" in status:
        state += f" (Slurm: {status['scheduler_state']})"
    rows = [("state", state), ("job", status.get("job_id", "local")),
            ("step", str(status["step"])),
            ("loss", f"{latest['loss']:.4f}" if "loss" in latest else "-"),
            ("val loss", f"{status['val_loss']:.4f}" if status["val_loss"] is not None else "-"),
            ("tokens/s", f"{latest['tokens_per_s']:,.0f}" if latest else "-"),
            ("MFU (after warm-up)",
             f"{status['mfu']:.1%}" if status.get("mfu") is not None else "-"),
            ("requeues", str(status["requeues"]))]
    if "elapsed" in status:
        rows += [("elapsed", status["elapsed"]), ("nodes", status["nodes"])]
    for leg in status.get("legs", []):
        when = f" {leg['time']}" if leg.get("time") else ""
        after = leg.get("after") or {}
        what = (f"after {after.get('cause')} at step {after.get('step')}" if after
                else " ".join(leg["overrides"]) or "(no overrides)")
        rows.append((f"leg {leg['leg']} ({leg['command']}{when})", what))
    for what, value in rows:
        table.add_row(what, value)
    console.print(table)
    if status.get("scheduler_note"):
        console.print(f"note: {status['scheduler_note']}", markup=False, soft_wrap=True)
    if status["state"] in (RunState.paused, RunState.stopped):
        console.print(f"{status['state']} at step {status['step']}; continue with: "
                      f"meshrun resume {status['run_dir']}", markup=False, soft_wrap=True)
    if "owner_note" in status:
        console.print(status["owner_note"], markup=False, soft_wrap=True)
    for line in [*status.get("stragglers", []), *status.get("expert_collapse", []),
                 *filter(None, [status.get("wait_partial")]),
                 *status.get("stalled", []),
                 *([status["hang"]] if "hang" in status else [])]:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if "log_tail" in status:
        console.print(status["log_tail"], markup=False, highlight=False, soft_wrap=True)


def status_json(status: dict) -> str:
    return json.dumps(status, indent=2, default=str)
