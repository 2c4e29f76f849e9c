"""The table printed when a run ends, from the summary.json that rank 0 writes."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from conf.run_dir.expert_collapse import collapse_lines, routing_summary
from conf.run_dir.paths import SUMMARY_FILE, RunDir
from conf.run_dir.run_states import RunState, state_from_files

ROWS = (
    ("final train loss", "final_loss", "{:.4f}"),
    ("first val loss", "first_val_loss", "{:.4f}"),
    ("final val loss", "final_val_loss", "{:.4f}"),
    ("val loss drop", "val_loss_drop", "{:.1%}"),
    ("tokens/s (global, after warm-up)", "tokens_per_s", "{:,.0f}"),
    ("tokens/s per device", "tokens_per_s_per_device", "{:,.0f}"),
    ("MFU (after warm-up)", "mfu", "{:.2%}"),
    ("MFU peak used", "peak_flops_source", "{}"),
    ("MFU FLOPs convention", "flops_convention", "{}"),
    ("MFU attention FLOPs counted", "flops_attention", "{}"),
    ("peak memory (max over ranks)", "peak_mem_gib", "{:.3f} GiB"),
    ("steps", "steps_done", "{}"),
    ("wall time", "wall_s", "{:.1f} s"),
    ("checkpoint", "last_checkpoint", "{}"),
    ("export", "export_dir", "{}"),
    ("stragglers", "stragglers", "{}"),
    ("stragglers", "wait_partial", "{}"),
)


PATH_KEYS = ("last_checkpoint", "export_dir")
POINTERS = (("profile traces", "profile_traces"), ("memory snapshots", "memory_snapshots"))
"""Printed under the table, one line each, never broken: they hold a command to copy."""


def _relative(path: Path, run_dir: Path) -> str:
    try:
        return str(path.relative_to(run_dir.resolve()))
    except ValueError:
        return str(path)


def print_summary(run_dir: Path, console: Console) -> None:
    summary = RunDir(run_dir).read_summary()
    if summary is None:
        console.print(unfinished_line(run_dir), markup=False, soft_wrap=True)
        return
    table = Table(title=f"Summary: {run_dir}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    for label, key, fmt in ROWS:
        value = summary.get(key)
        if value is None or value == "":
            continue
        if key in PATH_KEYS:
            value = _relative(Path(value), run_dir)
        table.add_row(label, fmt.format(value))
    _add_routing(table, RunDir(run_dir).read_rows())
    console.print(table)
    for label, key in POINTERS:
        if summary.get(key):
            console.print(f"{label}: {summary[key]}", markup=False, highlight=False,
                          soft_wrap=True)


def _add_routing(table: Table, rows: list[dict]) -> None:
    """A mixture-of-experts run's routing (metrics.jsonl's latest), and any collapse."""
    routing = routing_summary(rows)
    if routing:
        table.add_row("experts", routing)
    for line in collapse_lines(rows):
        table.add_row("experts", line)


RESUMABLE = {RunState.paused: "paused", RunState.stopped: "stopped"}


def unfinished_line(run_dir: Path) -> str:
    """What to say when the ranks exited cleanly without a summary.json: a run paused at
    training.stop_at_step (or stopped early) names its step and how to go on."""
    state = state_from_files(run_dir)
    if state in RESUMABLE:
        events = [r for r in RunDir(run_dir).read_rows() if r.get("kind") == "event"]
        step = events[-1].get("step", "?") if events else "?"
        return f"{RESUMABLE[state]} at step {step}; continue with: meshrun resume {run_dir}"
    return f"run finished; no {SUMMARY_FILE} in {run_dir}"
