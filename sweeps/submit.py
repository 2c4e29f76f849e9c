"""A sweep from definition to running points: expand, validate all, preview, confirm, launch.

Nothing touches the filesystem (no sweep dir, no run dir, no job) until every point is valid
(or --skip-invalid dropped the invalid ones) and the preview was confirmed.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from conf.compose import config_yaml, quote_value
from conf.errors import ConfigError, Problem, ProblemList
from conf.run_dir.run_states import FINISHED_STATES
from launcher.backends.choose import backend_for
from launcher.backends.interface import LaunchBackend
from launcher.hardware import probe_host
from launcher.launch_gate import add_fit_problem, add_wandb_problem, device_memory, launch_plan
from launcher.plan.fit_advice import suggestions
from sweeps.expand import MAX_POINTS, Point, expand
from sweeps.preview import confirm, not_fitting, preview_table
from sweeps.run_local import Prepared
from sweeps.runner_lock import acquire_sweep_lock
from sweeps.spec_file import SweepDef
from sweeps.state import SweepState
from sweeps.track import RETRYABLE, point_status
from sweeps.validate import Checked, InvalidSweep, describe_invalid, point_label, validate

SWEEPS_SUBDIR = "sweeps"
SUGGESTED_POINTS = 3
"""Points that do not fit whose refusal lists re-planned suggestions (each costs a compose)."""

STOPPING_WAIT_S = 90
"""How long a runner waits for the points of a runner that died to stop (their ranks save a
checkpoint first; torchrun kills them after its 30 s grace)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    sweep_dir: Path | None = None
    dry_run: bool = False
    yes: bool = False
    skip_invalid: bool = False
    wait: bool = False
    max_rows: int = 50
    max_points: int = MAX_POINTS
    force: bool = False
    """Launch points whose plan does not fit too (launcher/launch_gate.py)."""


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
    for backend, points in by_backend(todo):
        for line in backend.describe_points([c.spec for c in points],
                                            array_parallelism=sweep.array_parallelism):
            console.print(line, markup=False)
    check_points_launchable(todo, force=opts.force)
    if opts.dry_run:
        console.print("dry run: nothing was written or submitted", markup=False)
        return 0
    where = _backends(todo)
    if not confirm(f"Run {len(todo)} point(s) {where}?", yes=opts.yes, console=console):
        return 1
    with acquire_sweep_lock(state.dir):  # the live-runner check and our record, one step
        state = SweepState.load(state.dir, name=sweep.name)  # as the last runner left it
        merged = state.merge([c.point for c in checked])
        checked = [dataclasses.replace(c, point=p) for c, p in zip(checked, merged)]
        todo = _todo_under_lock(state, checked, console)
        if not todo:
            console.print("nothing to run", markup=False)
            return 0
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
    if state.exists and state.runner_alive():  # said early; checked again under the lock
        runner = state.runner() or {}
        raise ConfigError([Problem("sweep_dir", str(sweep_dir),
                                   f"is in use by a running sweep (pid {runner.get('pid', '?')} "
                                   f"on {runner.get('host', '?')})",
                                   "wait for it, or stop it first")], "Cannot sweep")
    return state


def _split_by_state(state: SweepState, checked: list[Checked]):
    """(to run, finished, alive or waiting): a point is alive while a process holds its run
    dir's lock (sweeps.track), finished when its run dir says so."""
    todo, done, active = [], [], []
    for c in checked:
        record = state.record(c.point.index)
        row = point_status(state, record, runner_alive=False) if record["attempts"] else None
        current = row["state"] if row else "missing"
        (done if current in FINISHED_STATES else todo if current in RETRYABLE
         else active).append(c)
    return todo, done, active


def check_points_launchable(todo: list[Checked], *, force: bool) -> None:
    """Every point before any is submitted (launcher/launch_gate.py): those whose plan does not
    fit are refused unless `force` (the first SUGGESTED_POINTS with re-planned suggestions),
    and W&B online needs a key."""
    problems = ProblemList()
    tight = [] if force else not_fitting(todo)
    for n, c in enumerate(tight):
        advice = suggestions(c.spec, list(c.point.overrides),
                             device_bytes=device_memory(c.spec)) if n < SUGGESTED_POINTS else []
        add_fit_problem(launch_plan(c.spec), advice, problems,
                        key=f"point {c.point.index} [{point_label(c.point)}]")
    online = [c for c in todo if c.spec.logging.wandb_mode.value == "online"]
    if online:
        add_wandb_problem(online[0].spec, problems)
    problems.raise_if_any("Cannot sweep (nothing was submitted)")


def _todo_under_lock(state: SweepState, checked: list[Checked], console: Console) -> list[Checked]:
    """The points to run, decided again now that this runner holds the sweep dir: points of a
    runner that died may still be stopping (their ranks save a checkpoint); wait for them,
    up to STOPPING_WAIT_S, rather than run them twice or skip them."""
    todo, _, active = _split_by_state(state, checked)
    stopping = [c for c in active if _held_by_a_sweep(state, c)]
    if stopping:
        console.print(f"waiting up to {STOPPING_WAIT_S} s for {len(stopping)} point(s) of an "
                      "earlier runner to stop", markup=False)
        deadline = time.monotonic() + STOPPING_WAIT_S
        while any(_held_by_a_sweep(state, c) for c in stopping) and time.monotonic() < deadline:
            time.sleep(0.5)
        todo, _, active = _split_by_state(state, checked)
    alive = [c for c in active if _owner(state, c) is not None]
    if alive:
        console.print(f"not starting {len(alive)} point(s) that a live process holds: "
                      + ", ".join(str(c.point.index) for c in alive), markup=False)
    return todo


def _owner(state: SweepState, checked: Checked) -> dict | None:
    from sweeps.track import point_owner

    return point_owner(state.latest_run_dir(checked.point.index))


def _held_by_a_sweep(state: SweepState, checked: Checked) -> bool:
    """The point's run dir is locked by a sweep's point (its runner is gone, as this runner
    holds the sweep dir), not by a `meshrun resume` someone started by hand."""
    owner = _owner(state, checked)
    command = [str(word) for word in (owner or {}).get("command", [])]
    return owner is not None and bool(command) and (command[0].endswith("point_process.py")
                                                    or "sweep" in command[1:2])


def _warn_not_fitting(todo: list[Checked], console: Console) -> None:
    tight = not_fitting(todo)
    if tight:
        console.print(f"warning: {len(tight)} point(s) may not fit in GPU memory (estimate): "
                      + ", ".join(str(c.point.index) for c in tight[:20]), markup=False,
                      soft_wrap=True)


def by_backend(todo: list[Checked]) -> list[tuple[LaunchBackend, list[Checked]]]:
    """The points grouped by launch backend: those a scheduler takes (submitting returns at
    once) first, then those that run here; each group in the points' order."""
    groups: dict[str, tuple[LaunchBackend, list[Checked]]] = {}
    for c in todo:
        backend = backend_for(c.spec.cluster)
        groups.setdefault(backend.kind, (backend, []))[1].append(c)
    return sorted(groups.values(), key=lambda group: (not group[0].detached, group[0].kind))


def _backends(todo: list[Checked]) -> str:
    backends = sorted((backend for backend, _ in by_backend(todo)), key=lambda b: b.kind)
    return " and ".join(backend.where for backend in backends)


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
    """Launch every point, backend by backend (Slurm first: submitting returns at once; then
    the points that take this machine); return (all launches went well, every point has
    ended)."""
    ok, submitted, resumed, detached = True, False, False, False
    for backend, points in by_backend(todo):
        if not backend.detached:  # fresh, resumed and restarted points alike, --parallel
            ok = _run_here(state, sweep, backend, points, console) and ok
            continue
        resumable = [c for c in points if _checkpointed_run_dir(state, c) is not None]
        fresh = [c for c in points if c not in resumable]
        ok = _resume(state, backend, resumable, console, force=opts.force) and ok
        if fresh:
            ok = _launch_fresh(state, sweep, backend, fresh, console) and ok
        submitted = submitted or bool(fresh)
        resumed = resumed or bool(resumable)
        detached = True
    if opts.wait and (submitted or resumed):
        from sweeps.run_slurm import wait_for_points

        wait_for_points(state, [c.point.index for c in todo], console=console)
    return ok, opts.wait or not detached


def _launch_fresh(state: SweepState, sweep: SweepDef, backend: LaunchBackend,
                  fresh: list[Checked], console: Console) -> bool:
    """Points never started, submitted as job arrays."""
    from sweeps.run_slurm import submit_arrays

    prepared = [make_run_dir(state, c, backend=backend.kind) for c in fresh]
    ids = submit_arrays(state, prepared, backend=backend,
                        array_parallelism=sweep.array_parallelism, sweep_name=sweep.name,
                        console=console)
    return len(ids) == len(prepared)


def _run_here(state: SweepState, sweep: SweepDef, backend: LaunchBackend, points: list[Checked],
              console: Console) -> bool:
    """Points that run on this machine (`--parallel`), each launched, resumed or restarted."""
    from sweeps.run_local import run_local

    results = run_local(state, lambda c: _prepare_here(state, c, backend, console), points,
                        parallel=sweep.parallel, host=probe_host(), console=console)
    return len(results) == len(points) and not any(results.values())


def _prepare_here(state: SweepState, checked: Checked, backend: LaunchBackend,
                  console: Console) -> Prepared:
    """How a point continues, decided when it starts: from its checkpoint in its run dir
    (resume); over again in its run dir when it was interrupted before its first checkpoint
    (restart: one run dir per point); in a new run dir when it never ran or failed."""
    from conf.run_dir.paths import RunDir
    from sweeps.point_process import RESTART, RESUME

    index = checked.point.index
    run_dir = state.latest_run_dir(index)
    if run_dir is None or not RunDir(run_dir).is_run_dir:
        return make_run_dir(state, checked, backend=backend.kind)
    if RunDir(run_dir).latest_checkpoint() is not None:
        mode = RESUME
        console.print(f"point {index} [{point_label(checked.point)}]: resuming from its "
                      "checkpoint", markup=False)
    elif point_status(state, state.record(index), runner_alive=False)["state"] == "stopped":
        mode = RESTART
        console.print(f"point {index} [{point_label(checked.point)}]: interrupted before its "
                      "first checkpoint; starting over in its run dir", markup=False)
    else:
        return make_run_dir(state, checked, backend=backend.kind)
    state.add_attempt(index, run_dir, backend=backend.kind)
    return Prepared(index=index, name=checked.point.name, spec=RunDir(run_dir).read_spec(),
                    run_dir=run_dir, mode=mode)


def _checkpointed_run_dir(state: SweepState, checked: Checked) -> Path | None:
    from conf.run_dir.paths import RunDir

    run_dir = state.latest_run_dir(checked.point.index)
    if run_dir is None:
        return None
    return run_dir if RunDir(run_dir).latest_checkpoint() is not None else None


def _resume(state: SweepState, backend: LaunchBackend, resumable: list[Checked],
            console: Console, *, force: bool = False) -> bool:
    """Points whose last run left a checkpoint continue it (same run dir, same W&B run)."""
    from launcher import commands

    ok = True
    for c in resumable:
        run_dir = _checkpointed_run_dir(state, c)
        console.print(f"point {c.point.index} [{point_label(c.point)}]: resuming from its "
                      "checkpoint", markup=False)
        state.add_attempt(c.point.index, run_dir, backend=backend.kind)
        try:
            status = commands.resume(run_dir, [], console=console, force=force)
        except ConfigError as err:
            console.print(str(err), markup=False, highlight=False, soft_wrap=True)
            state.finish_attempt(c.point.index, error=str(err).splitlines()[0])
            ok = False
            continue
        if not backend.detached:  # it ran to its end here
            state.finish_attempt(c.point.index, exit_status=status)
        ok = ok and status == 0
    return ok
