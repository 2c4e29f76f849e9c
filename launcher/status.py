"""`meshrun status <run_dir>`: where a run stands, from its run dir and the scheduler."""
from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from conf.errors import ConfigError, Problem
from launcher.progress import failure_tail
from launcher.slurm import recorded_jobs
from launcher.slurm_state import job_state
from training.summary import SUMMARY_FILE, read_rows

FAILED_STATES = ("FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT", "CANCELLED", "BOOT_FAIL",
                 "DEADLINE")


def run_status(run_dir: Path) -> dict:
    """State, step reached, latest metrics and requeues of a run dir (local or Slurm)."""
    if not (run_dir / "spec.json").is_file():
        raise ConfigError([Problem("run_dir", str(run_dir), "is not a meshrun run dir",
                                   "pass a folder made by `meshrun run`")], "Cannot show status")
    rows = read_rows(run_dir)
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    events = [r for r in rows if r.get("kind") == "event"]
    status = {"run_dir": str(run_dir), "step": train[-1]["step"] if train else 0,
              "latest": train[-1] if train else {}, "val_loss": evals[-1]["val_loss"] if evals else None,
              "requeues": sum(1 for e in events if e.get("event") == "requeued"),
              "state": _local_state(run_dir, events)}
    jobs = recorded_jobs(run_dir)
    if jobs:
        job = job_state(jobs[-1]["job_id"])
        status.update(job_id=job.job_id, state=job.state,
                      elapsed=job.elapsed, nodes=job.nodes, submissions=len(jobs))
    if status["state"] in FAILED_STATES or status["state"] == "failed":
        status["log_tail"] = failure_tail(run_dir)
    return status


def _local_state(run_dir: Path, events: list[dict]) -> str:
    if (run_dir / SUMMARY_FILE).exists():
        return "completed"
    if events:
        return events[-1]["event"]
    logs = list((run_dir / "logs").glob("rank*.log"))
    if any("failed" in log.read_text(errors="replace") for log in logs):
        return "failed"
    return "started" if logs else "created"


def print_status(status: dict, console: Console) -> None:
    table = Table(title="Status", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    latest = status.get("latest") or {}
    rows = [("run dir", status["run_dir"]), ("state", status["state"]), ("job", status.get("job_id", "local")),
            ("step", str(status["step"])),
            ("loss", f"{latest['loss']:.4f}" if "loss" in latest else "-"),
            ("val loss", f"{status['val_loss']:.4f}" if status["val_loss"] is not None else "-"),
            ("tokens/s", f"{latest['tokens_per_s']:,.0f}" if latest else "-"),
            ("MFU", f"{latest['mfu']:.1%}" if latest else "-"),
            ("requeues", str(status["requeues"]))]
    if "elapsed" in status:
        rows += [("elapsed", status["elapsed"]), ("nodes", status["nodes"])]
    for what, value in rows:
        table.add_row(what, value)
    console.print(table)
    if "log_tail" in status:
        console.print(status["log_tail"], markup=False, highlight=False, soft_wrap=True)


def status_json(status: dict) -> str:
    return json.dumps(status, indent=2, default=str)
