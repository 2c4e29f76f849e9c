"""`meshrun sweep status <dir>`: where each point of a sweep stands.

A point's state comes from its latest run dir (launcher.status.run_status: the scheduler's
word for Slurm jobs, the run's own files for local runs) and from points.json (exit status of
local attempts, whether the local sweep runner is still alive).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from conf.errors import ConfigError
from sweeps.state import SweepState

STATES = ("pending", "running", "completed", "failed", "out of memory", "timed out",
          "preempted", "cancelled", "stopped", "missing", "unknown")
ACTIVE = ("pending", "running", "unknown")
RETRYABLE = ("failed", "out of memory", "timed out", "preempted", "cancelled", "stopped",
             "missing")
SLURM_STATES = {
    "PENDING": "pending", "REQUEUED": "pending", "CONFIGURING": "pending",
    "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending", "SUSPENDED": "pending",
    "RUNNING": "running", "COMPLETING": "running", "RESIZING": "running",
    "COMPLETED": "completed", "FAILED": "failed", "NODE_FAIL": "failed", "BOOT_FAIL": "failed",
    "OUT_OF_MEMORY": "out of memory", "TIMEOUT": "timed out", "DEADLINE": "timed out",
    "PREEMPTED": "preempted", "CANCELLED": "cancelled", "UNKNOWN": "unknown",
}
OOM_MARKERS = ("out of memory", "outofmemoryerror", "oom-kill")
STYLES = {"completed": "green", "running": "cyan", "pending": "dim", "stopped": "yellow",
          "missing": "yellow", "unknown": "yellow"}


def sweep_status(state: SweepState) -> list[dict]:
    """One row per point: index, name, values, state, step, steps, loss, mfu, run_dir."""
    alive = state.runner_alive()
    return [point_status(state, record, runner_alive=alive) for record in state.records]


def point_status(state: SweepState, record: dict, *, runner_alive: bool) -> dict:
    row = {"index": record["index"], "name": record["name"], "values": record["values"],
           "run_dir": None, "state": "pending" if runner_alive else "missing", "step": 0,
           "steps": None, "loss": None, "mfu": None, "attempts": len(record["attempts"])}
    run_dir = state.latest_run_dir(record["index"])
    if run_dir is None:
        return row
    row["run_dir"] = str(run_dir)
    attempt = record["attempts"][-1] if record["attempts"] else {}
    if attempt.get("error"):
        return {**row, "state": "failed", "error": attempt["error"]}
    if not (run_dir / "spec.json").is_file():
        return {**row, "state": "missing"}
    try:
        from launcher.status import run_status

        status = run_status(run_dir)
    except (ConfigError, RuntimeError, OSError, ValueError) as err:
        return {**row, "state": "unknown", "error": str(err).splitlines()[0]}
    latest = status.get("latest") or {}
    row.update(step=status["step"], loss=latest.get("loss"), mfu=latest.get("mfu"),
               val_loss=status.get("val_loss"), steps=_steps(run_dir))
    if "job_id" in status:
        row.update(job_id=status["job_id"], state=_slurm_state(status, run_dir))
    else:
        row["state"] = _local_state(status, attempt, run_dir, runner_alive=runner_alive)
    return row


def _steps(run_dir: Path) -> int | None:
    try:
        return json.loads((run_dir / "spec.json").read_text())["training"]["steps"]
    except (OSError, ValueError, KeyError):
        return None


def _slurm_state(status: dict, run_dir: Path) -> str:
    state = SLURM_STATES.get(status["state"], "failed")
    if state == "completed" and not (run_dir / "summary.json").exists():
        return "stopped"  # the job ended cleanly before the last step (e.g. out of requeues)
    if state == "failed" and _looks_oom(status.get("log_tail", "")):
        return "out of memory"
    return state


def _local_state(status: dict, attempt: dict, run_dir: Path, *, runner_alive: bool) -> str:
    if status["state"] == "completed":
        return "completed"
    exit_status = attempt.get("exit_status")
    if exit_status is None:
        return "running" if runner_alive else "failed"  # the runner died under it
    if exit_status in (0, 130):
        return "stopped"
    if exit_status in (-9, 137) or _looks_oom(_tail(run_dir)):
        return "out of memory"
    return "failed"


def _tail(run_dir: Path) -> str:
    from launcher.progress import failure_tail

    return failure_tail(run_dir)


def _looks_oom(text: str) -> bool:
    low = text.lower()
    return any(marker in low for marker in OOM_MARKERS)


def counts(rows: list[dict]) -> dict[str, int]:
    found = Counter(r["state"] for r in rows)
    return {s: found[s] for s in STATES if found[s]}


def status_table(rows: list[dict], *, title: str) -> Table:
    keys = list(dict.fromkeys(k for r in rows for k in r["values"]))
    shorts = [k.split(".")[-1] for k in keys]
    table = Table(title=title, title_justify="left")
    table.add_column("#", justify="right")
    for key, short in zip(keys, shorts):
        table.add_column(short if shorts.count(short) == 1 else key, style="cyan")
    for column in ("state", "step", "loss", "MFU", "run dir"):
        table.add_column(column, justify="left" if column in ("state", "run dir") else "right")
    for r in rows:
        step = (f"{r['step']}/{r['steps']}" if r.get("steps")
                else str(r["step"]) if r["step"] else "-")
        table.add_row(str(r["index"]), *[r["values"].get(k, "") for k in keys],
                      f"[{STYLES.get(r['state'], 'red')}]{r['state']}[/]", step,
                      f"{r['loss']:.4f}" if r.get("loss") is not None else "-",
                      f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-",
                      Path(r["run_dir"]).name if r.get("run_dir") else "-")
    return table


def print_sweep_status(state: SweepState, console: Console, *, as_json: bool = False) -> list[dict]:
    rows = sweep_status(state)
    if as_json:
        print(json.dumps({"sweep_dir": str(state.dir), "sweep": state.data.get("sweep"),
                          "counts": counts(rows), "points": rows}, indent=2, default=str))
        return rows
    console.print(status_table(rows, title=f"Sweep {state.data.get('sweep')}: {state.dir}"))
    summary = ", ".join(f"{n} {s}" for s, n in counts(rows).items())
    console.print(f"{len(rows)} point{'s' if len(rows) != 1 else ''}: {summary}", markup=False)
    if any(r["state"] in RETRYABLE for r in rows):
        console.print(f"rerun the failed and missing points with: meshrun sweep retry {state.dir}",
                      markup=False, soft_wrap=True)
    return rows
