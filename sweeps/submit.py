"""A sweep from definition to running points: expand, validate all, preview, confirm, launch.

Nothing touches the filesystem (no sweep dir, no run dir, no job) until every point is valid
(or --skip-invalid dropped the invalid ones) and the preview was confirmed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from conf.compose import config_yaml, quote_value
from conf.errors import ConfigError, Problem
from launcher.hardware import probe_host
from sweeps.expand import MAX_POINTS, Point, expand
from sweeps.preview import confirm, not_fitting, preview_table
from sweeps.run_local import Prepared
from sweeps.spec_file import SweepDef
from sweeps.state import SweepState
from sweeps.track import RETRYABLE, point_status
from sweeps.validate import Checked, InvalidSweep, describe_invalid, point_label, validate

SWEEPS_SUBDIR = "sweeps"


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    sweep_dir: Path | None = None
    dry_run: bool = False
    yes: bool = False
    skip_invalid: bool = False
    wait: bool = False
    max_rows: int = 50
    max_points: int = MAX_POINTS


def run_sweep(sweep: SweepDef, opts: Options, console: Console, *,
              points: list[Point] | None = None) -> int:
    """Expand (unless `points` are given, as by retry), validate, preview and launch."""
    checked = _validated(sweep, points if points is not None else expand(sweep, max_points=opts.max_points),
                         opts, console)
    sweep_dir = opts.sweep_dir or Path(checked[0].spec.runs_dir) / SWEEPS_SUBDIR / sweep.name
    state = _open_state(sweep_dir, sweep)
    merged = state.merge([c.point for c in checked])
    checked = [dataclasses.replace(c, point=p) for c, p in zip(checked, merged)]
    todo, done, active = _split_by_state(state, checked)
    skipped = [f"{len(done)} completed"] if done else []
    skipped += [f"{len(active)} pending or running"] if active else []
    console.print(f"sweep {sweep.name}: {len(checked)} points, sweep dir {state.dir}"
                  + (f" (skipping {', '.join(skipped)})" if skipped else ""),
                  markup=False, soft_wrap=True)
    if not todo:
        console.print("nothing to run", markup=False)
        return 0
    console.print(preview_table(todo, title=f"Sweep {sweep.name}: {len(todo)} point"
                                f"{'s' if len(todo) != 1 else ''} to run",
                                max_rows=opts.max_rows))
    _warn_not_fitting(todo, console)
    on_slurm = [c.spec for c in todo if c.spec.cluster.kind == "slurm"]
    if on_slurm:
        from sweeps.run_slurm import describe_arrays

        for line in describe_arrays(on_slurm, array_parallelism=sweep.array_parallelism):
            console.print(f"slurm: {line}", markup=False)
    if opts.dry_run:
        console.print("dry run: nothing was written or submitted", markup=False)
        return 0
    where = _backends(todo)
    if not confirm(f"Run {len(todo)} point(s) {where}?", yes=opts.yes, console=console):
        return 1
    state.write_definition(sweep)
    state.save()
    return _launch(state, sweep, todo, opts, console)


def _validated(sweep: SweepDef, points: list[Point], opts: Options,
               console: Console) -> list[Checked]:
    checked = validate(points, host=probe_host())
    invalid = [c for c in checked if not c.valid]
    if invalid and not opts.skip_invalid:
        raise InvalidSweep(invalid, len(checked))
    if invalid:
        console.print(describe_invalid(invalid, len(checked)) + "\ndropping them (--skip-invalid)",
                      markup=False, highlight=False, soft_wrap=True)
    valid = [c for c in checked if c.valid]
    if not valid:
        raise ConfigError([Problem("sweep", sweep.name, "has no valid point left",
                                   "fix the problems above")], "Invalid sweep")
    return valid


def _open_state(sweep_dir: Path, sweep: SweepDef) -> SweepState:
    state = SweepState.load(sweep_dir, name=sweep.name)
    if state.exists and state.data.get("sweep") != sweep.name:
        held = state.data.get("sweep")
        raise ConfigError([Problem("sweep_dir", str(sweep_dir),
                                   f"holds the sweep {held!r}, not {sweep.name!r}",
                                   "choose another --dir")], "Cannot sweep")
    if state.exists and state.data.get("runner") and state.runner_alive():
        runner = state.data["runner"]
        raise ConfigError([Problem("sweep_dir", str(sweep_dir),
                                   f"is in use by a running sweep (pid {runner['pid']} on "
                                   f"{runner['host']})", "wait for it, or stop it first")],
                          "Cannot sweep")
    return state


def _split_by_state(state: SweepState, checked: list[Checked]):
    todo, done, active = [], [], []
    for c in checked:
        record = state.record(c.point.index)
        row = point_status(state, record, runner_alive=False) if record["attempts"] else None
        current = row["state"] if row else "missing"
        (done if current == "completed" else todo if current in RETRYABLE else active).append(c)
    return todo, done, active


def _warn_not_fitting(todo: list[Checked], console: Console) -> None:
    tight = not_fitting(todo)
    if tight:
        console.print(f"warning: {len(tight)} point(s) may not fit in GPU memory (estimate): "
                      + ", ".join(str(c.point.index) for c in tight[:20]), markup=False,
                      soft_wrap=True)


def _backends(todo: list[Checked]) -> str:
    kinds = sorted({c.spec.cluster.kind for c in todo})
    return " and ".join("on Slurm" if k == "slurm" else "on this machine" for k in kinds)


def make_run_dir(state: SweepState, checked: Checked, *, backend: str) -> Prepared:
    """Create the point's run dir under <sweep_dir>/runs (launcher.run_dir_writer) and record it."""
    from launcher.run_dir_writer import create_run_dir
    from launcher.commands import launch_command, with_prepared_data

    runs_dir = str(state.runs_dir)
    overrides = list(checked.point.run_overrides) + [f"runs_dir={quote_value(runs_dir)}"]
    spec = with_prepared_data(dataclasses.replace(checked.spec, runs_dir=runs_dir))
    config = dataclasses.replace(checked.config, runs_dir=runs_dir)
    run_dir = create_run_dir(spec, overrides=overrides, config_yaml=config_yaml(config),
                             command=launch_command(spec))
    state.add_attempt(checked.point.index, run_dir, backend=backend)
    return Prepared(index=checked.point.index, name=checked.point.name, spec=spec,
                    run_dir=run_dir)


def _launch(state: SweepState, sweep: SweepDef, todo: list[Checked], opts: Options,
            console: Console) -> int:
    state.set_runner(True)
    try:
        ok, all_ended = _launch_all(state, sweep, todo, opts, console)
    finally:
        state.set_runner(False)
    from sweeps.track import print_sweep_status

    rows = print_sweep_status(state, console)
    if all_ended:  # every point must have completed
        indices = {c.point.index for c in todo}
        ok = ok and all(r["state"] == "completed" for r in rows if r["index"] in indices)
    return 0 if ok else 1


def _launch_all(state: SweepState, sweep: SweepDef, todo: list[Checked], opts: Options,
                console: Console) -> tuple[bool, bool]:
    """Launch every point; return (all launches went well, every point has ended)."""
    resumable = [c for c in todo if _checkpointed_run_dir(state, c) is not None]
    fresh = [c for c in todo if c not in resumable]
    slurm = [c for c in fresh if c.spec.cluster.kind == "slurm"]
    local = [c for c in fresh if c.spec.cluster.kind == "local"]
    # Slurm first (submitting returns at once), then the local points, which take this machine.
    ok = _resume(state, [c for c in resumable if c.spec.cluster.kind == "slurm"], console)
    if slurm:
        from sweeps.run_slurm import submit_arrays

        prepared = [make_run_dir(state, c, backend="slurm") for c in slurm]
        ids = submit_arrays(state, prepared, array_parallelism=sweep.array_parallelism,
                            sweep_name=sweep.name, console=console)
        ok = ok and len(ids) == len(prepared)
    ok = _resume(state, [c for c in resumable if c.spec.cluster.kind == "local"], console) and ok
    if local:
        from sweeps.run_local import run_local

        results = run_local(state, lambda c: make_run_dir(state, c, backend="local"), local,
                            parallel=sweep.parallel, host=probe_host(), console=console)
        ok = ok and len(results) == len(local) and not any(results.values())
    if opts.wait and (slurm or resumable):
        from sweeps.run_slurm import wait_for_points

        wait_for_points(state, [c.point.index for c in todo], console=console)
    on_slurm = slurm or any(c.spec.cluster.kind == "slurm" for c in resumable)
    return ok, opts.wait or not on_slurm


def _checkpointed_run_dir(state: SweepState, checked: Checked) -> Path | None:
    from conf.rundir import RunDir

    run_dir = state.latest_run_dir(checked.point.index)
    if run_dir is None:
        return None
    return run_dir if RunDir(run_dir).latest_checkpoint() is not None else None


def _resume(state: SweepState, resumable: list[Checked], console: Console) -> bool:
    """Points whose last run left a checkpoint continue it (same run dir, same W&B run)."""
    from launcher import commands

    ok = True
    for c in resumable:
        run_dir = _checkpointed_run_dir(state, c)
        console.print(f"point {c.point.index} [{point_label(c.point)}]: resuming from its "
                      "checkpoint", markup=False)
        state.add_attempt(c.point.index, run_dir, backend=c.spec.cluster.kind)
        try:
            status = commands.resume(run_dir, [], console=console)
        except ConfigError as err:
            console.print(str(err), markup=False, highlight=False, soft_wrap=True)
            state.finish_attempt(c.point.index, error=str(err).splitlines()[0])
            ok = False
            continue
        if c.spec.cluster.kind == "local":
            state.finish_attempt(c.point.index, exit_status=status)
        ok = ok and status == 0
    return ok
