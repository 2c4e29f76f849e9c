"""What each `meshrun` command does, from overrides to a finished (or refused) run."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import shlex
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console

from conf.compose import compose_config, config_yaml
from conf.errors import ConfigError, Problem, ProblemList
from conf.hf_model_config import explicit_model_keys
from conf.data_contract.vocab_inference import data_vocab
from conf.resolve import resolve
from conf.search_path import add_config_dirs, user_config_dirs
from conf.spec import RunSpec
from conf.run_dir.metrics_rows import PREFLIGHT_EVENT
from conf.run_dir.paths import LEG_UNPAUSE, OVERRIDES_FILE, SPEC_FILE, RunDir
from conf.run_dir.checkpoint_dirs import checkpoint_step
from conf.run_dir.export_dirs import run_outputs_complete
from conf.run_dir.checkpoint_verify import prelaunch_problem
from launcher.plan.fit_advice import suggestions
from launcher.launch_gate import check_launchable, device_memory, launch_plan
from launcher.data.stdlib_corpus import MANIFEST_NAME, prepare_stdlib_corpus, stdlib_corpus_dir
from launcher.hardware import probe_host
from launcher.backends.choose import backend_for
from launcher.plan.plan_json import plan_json
from launcher.plan.recipe_hint import recipe_hint
from launcher.resume_checks import (check_resume_files, check_same_layout,
                                    checkpoint_meta_or_problem)
from launcher.views.progress import print_failure
from launcher.watchdog import HUNG_EXIT
from launcher.backends.slurm_submit import SubmissionFailed
from launcher.backends.warm_torchrun import WarmTorchrun, warm_torchrun
from launcher.run_dir_writer import create_run_dir, new_run_dir_path
from launcher.backends.run_lock import RunLock, acquire_run_lock
from launcher.views.run_summary import print_summary
from launcher.views.plan_view import print_plan
from parallel.cost.plan import make_plan


def compose_spec(overrides: list[str]) -> tuple[RunSpec, str]:
    """Overrides -> validated RunSpec and the composed config as YAML."""
    cfg = compose_config(overrides)
    spec = resolve(cfg, host=probe_host(), explicit=explicit_model_keys(overrides))
    return spec, config_yaml(cfg)


def plan(overrides: list[str], *, console: Console, attention: str = "full",
         as_json: bool = False) -> int:
    """Print the plan of a run (a table, or with `as_json` launcher.plan.plan_json's JSON) and,
    when it does not fit its devices, re-planned suggestions."""
    spec, _ = compose_spec(overrides)
    the_plan = make_plan(spec, attention=attention)
    advice = suggestions(spec, overrides) if the_plan.verdict.fits is False else []
    if as_json:
        print(json.dumps(plan_json(spec, the_plan, advice), indent=2))
    else:
        print_plan(spec, the_plan, console, advice)
        _print_recipe_hint(spec, overrides, console)
    return 0


def _print_recipe_hint(spec: RunSpec, overrides: list[str], console: Console) -> None:
    hint = recipe_hint(spec, overrides)
    if hint:
        console.print(hint, markup=False, highlight=False)  # prose: wrapped at the width


def run(overrides: list[str], *, dry_run: bool, console: Console, wait: bool = False,
        prepare_only: bool = False, warm: WarmTorchrun | None = None,
        force: bool = False) -> int:
    """Compose, check, write the run dir and launch (or show all that: `dry_run`). A torchrun
    agent starts warm meanwhile (launcher/backends/warm_torchrun.py) for a run that may launch here
    (`warm`: one the CLI started already). A run whose plan does not fit is refused (exit 2)
    unless `force` (launcher/launch_gate.py); the dry run says so after its printout."""
    with warm_torchrun(not (dry_run or prepare_only), started=warm) as warm:
        return _run(overrides, dry_run=dry_run, console=console, wait=wait,
                    prepare_only=prepare_only, warm=warm, force=force)


def _run(overrides: list[str], *, dry_run: bool, console: Console, wait: bool,
         prepare_only: bool, warm: WarmTorchrun | None, force: bool) -> int:
    spec, yaml_text = compose_spec(overrides)
    command = launch_command(spec)
    if dry_run:
        console.rule("resolved config")
        console.print(yaml_text, markup=False, highlight=False, soft_wrap=True)  # valid YAML
        the_plan = launch_plan(spec)
        advice = (suggestions(spec, overrides, device_bytes=device_memory(spec))
                  if the_plan.verdict.fits is False else [])
        print_plan(spec, the_plan, console, advice)
        _print_recipe_hint(spec, overrides, console)
        console.print(f"data: {_data_line(spec)}", markup=False, soft_wrap=True)
        print_launch(spec, new_run_dir_path(spec), command, console)
        print_copyable(spec, overrides, console)
        check_launchable(spec, overrides, force=force, plan=the_plan, advice=advice)
        return 0
    check_launchable(spec, overrides, force=force)
    spec = with_prepared_data(spec)
    run_dir = create_run_dir(spec, overrides=overrides, config_yaml=yaml_text, command=command)
    if prepare_only:  # the path alone on stdout: RUN_DIR=$(meshrun run --prepare-only ...)
        print(run_dir)
        return 0
    console.print(f"run dir: {run_dir}", markup=False)
    with removed_if_not_submitted(run_dir, console=console):
        with acquire_run_lock(run_dir, action="run") as lock:
            return _launch(spec, run_dir, console=console, wait=wait, lock=lock, warm=warm)


def launch_command(spec: RunSpec) -> list[str]:
    return backend_for(spec.cluster).launch_command(spec)


def print_launch(spec: RunSpec, run_dir: Path, command: list[str], console: Console) -> None:
    backend_for(spec.cluster).render(spec, run_dir, command, console)


def print_copyable(spec: RunSpec, overrides: list[str], console: Console) -> None:
    """Commands that work when pasted into a shell (the run dir above does not exist yet)."""
    meshrun = meshrun_command()
    config_dirs = [arg for d in user_config_dirs() for arg in ("--config-dir", str(d))]
    again = shlex.join([*meshrun, "run", *config_dirs, *overrides])
    console.rule("to run it")
    console.print("(the run dir above does not exist until launch: paste these instead)",
                  markup=False)
    console.print(f"  {again}", markup=False, highlight=False, soft_wrap=True)
    per_node = backend_for(spec.cluster).rank_commands(spec, RUN_DIR_MARK)
    if per_node is None:  # a scheduler starts the ranks
        return
    prepare = shlex.join([*meshrun, "run", "--prepare-only", *config_dirs, *overrides])
    console.print("or, to start the ranks yourself (the first line creates the run dir):",
                  markup=False)
    console.print(f"  RUN_DIR=$({prepare})", markup=False, highlight=False, soft_wrap=True)
    for cmd in per_node:
        line = shlex.join(cmd)
        line = line.replace(f"={RUN_DIR_MARK}", '="$(basename "$RUN_DIR")"')
        console.print("  " + line.replace(RUN_DIR_MARK, '"$RUN_DIR"'), markup=False,
                      highlight=False, soft_wrap=True)


RUN_DIR_MARK = "@@RUN_DIR@@"


def meshrun_command() -> list[str]:
    """How this meshrun was started: `meshrun` when that is on PATH, else python -m."""
    if Path(sys.argv[0]).name == "meshrun" and shutil.which("meshrun"):
        return ["meshrun"]
    return [sys.executable, "-m", "launcher.cli"]


def _launch(spec: RunSpec, run_dir: Path, *, console: Console, wait: bool,
            preflight_only: bool = False, lock: RunLock | None = None,
            warm: WarmTorchrun | None = None, resume: bool = False) -> int:
    backend = backend_for(spec.cluster)
    if warm is not None and not backend.on_this_machine:
        warm.discard()  # not for Slurm or other nodes: do not hold it while a job runs
    start = backend.resume if resume else backend.launch
    status = start(spec, run_dir, console=console, show_progress=spec.logging.progress,
                   wait=wait, preflight_only=preflight_only, lock=lock, warm=warm)
    if status is None:  # started elsewhere; nothing to follow here
        return 0
    if status == 0 and preflight_only:
        note_preflight_passed(run_dir)
        print_preflight(run_dir, console)
    elif status == 0:
        print_summary(run_dir, console)
    elif status not in (130, HUNG_EXIT):  # a hang's report is already printed
        print_failure(run_dir, status)
    return status


def preflight(overrides: list[str], *, console: Console,
              warm: WarmTorchrun | None = None) -> int:
    """Only the preflight checks of a run's layout: joins, all-reduce, bandwidth table."""
    with warm_torchrun(True, started=warm) as warm:
        spec, yaml_text = compose_spec(overrides)
        run_dir = create_run_dir(spec, overrides=overrides, config_yaml=yaml_text,
                                 command=launch_command(spec))
        console.print(f"preflight run dir: {run_dir}", markup=False)
        with removed_if_not_submitted(run_dir, console=console):
            return _launch(spec, run_dir, console=console, wait=True, preflight_only=True,
                           warm=warm)


def note_preflight_passed(run_dir: Path) -> None:
    """The preflight run dir's one event, so `status`, `compare` and sweeps see it finished
    (every rank has exited: the launcher is the only writer left)."""
    row = {"kind": "event", "event": PREFLIGHT_EVENT, "time": time.time()}
    with RunDir(run_dir).metrics_file.open("a") as out:
        out.write(json.dumps(row) + "\n")


@contextlib.contextmanager
def removed_if_not_submitted(run_dir: Path, *, console: Console):
    """A run dir made for a submission sbatch refused is removed: nothing is left behind."""
    try:
        yield
    except SubmissionFailed:
        shutil.rmtree(run_dir, ignore_errors=True)
        console.print(f"removed {run_dir} (nothing was submitted)", markup=False)
        raise


def print_preflight(run_dir: Path, console: Console) -> None:
    from conf.run_dir.preflight_report import format_report

    console.print(format_report(json.loads(RunDir(run_dir).preflight_file.read_text())),
                  markup=False, highlight=False)


def resume(run_dir: Path, overrides: list[str], *, console: Console, wait: bool = False,
           warm: WarmTorchrun | None = None, force: bool = False) -> int:
    """Continue `run_dir` from its newest complete checkpoint, in the same dir and W&B run,
    with the newest leg's overrides (then these). Refused (exit 2) before anything is
    written: every check runs before the run dir's lock is taken (a refused resume leaves
    every file as it was), again under the lock, and spec.json and resumes.jsonl change only
    for a leg that launches, never while another launcher holds the lock. A leg whose plan
    does not fit is refused unless `force`, as `run` refuses one."""
    with warm_torchrun(True, started=warm) as warm:
        return _resume(run_dir, overrides, console=console, wait=wait, warm=warm, force=force)


def _resume(run_dir: Path, overrides: list[str], *, console: Console, wait: bool,
            warm: WarmTorchrun | None, force: bool) -> int:
    stored = _stored_overrides(run_dir)
    _reuse_config_dirs(run_dir)
    effective = stored + [LEG_UNPAUSE] + overrides
    try:
        spec = _resumable_spec(run_dir, effective)
        check_launchable(spec, effective, force=force)
    except ConfigError:
        if RunDir(run_dir).lock_file.exists():  # a live holder is the first thing to say
            with acquire_run_lock(run_dir, action="resume"):
                pass
        raise
    with acquire_run_lock(run_dir, action="resume") as lock:
        _check_resumable(run_dir, spec)  # the newest checkpoint may have changed meanwhile
        return _resume_locked(run_dir, spec, effective, overrides, lock, console=console,
                              wait=wait, warm=warm)


def _resumable_spec(run_dir: Path, effective: list[str]) -> RunSpec:
    spec, _ = compose_spec(effective + [f"checkpoint.resume_from={run_dir}"])
    _check_resumable(run_dir, spec)
    return spec


def _resume_locked(run_dir: Path, spec: RunSpec, effective: list[str], overrides: list[str],
                   lock: RunLock, *, console: Console, wait: bool,
                   warm: WarmTorchrun | None) -> int:
    spec = with_prepared_data(spec)
    rd = RunDir(run_dir)
    rd.write_spec(spec)
    rd.append_resume(time=time.strftime("%Y-%m-%dT%H:%M:%S"), overrides=overrides,
                     effective=effective)
    console.print(f"resuming {run_dir}", markup=False)
    return _launch(spec, run_dir, console=console, wait=wait, lock=lock, warm=warm, resume=True)


def _stored_overrides(run_dir: Path) -> list[str]:
    rd = RunDir(run_dir)
    if not rd.is_run_dir or not rd.overrides_file.is_file():
        raise ConfigError([Problem("run_dir", str(run_dir),
                                   f"is not a meshrun run dir (no {SPEC_FILE}/{OVERRIDES_FILE})",
                                   "pass a folder made by `meshrun run`")], "Cannot resume")
    check_resume_files(run_dir)
    return rd.leg_overrides()


def _reuse_config_dirs(run_dir: Path) -> None:
    """The user config dirs the run was composed with (env.json) join the search path, so
    its stored `model=my1b` composes again without --config-dir."""
    try:
        recorded = json.loads(RunDir(run_dir).env_file.read_text()).get("config_path", "")
    except (OSError, ValueError, AttributeError):
        return
    add_config_dirs([d for d in recorded.split(":") if d and Path(d).is_dir()])


def _check_resumable(run_dir: Path, spec: RunSpec) -> None:
    latest = RunDir(run_dir).latest_checkpoint()
    if latest is None:
        raise ConfigError([Problem("run_dir", str(run_dir), "holds no complete checkpoint",
                                   "start a new run with `meshrun run`")], "Cannot resume")
    damaged = prelaunch_problem(run_dir)
    if damaged:
        raise ConfigError([Problem("run_dir", str(run_dir), damaged,
                                   "start a new run with `meshrun run`, or restore the files")],
                          "Cannot resume")
    problems = ProblemList()
    meta = checkpoint_meta_or_problem(latest, problems)
    problems.raise_if_any("Cannot resume")
    at = checkpoint_step(latest)
    check_same_layout(run_dir, latest, meta, spec, problems)
    t = spec.training
    wants_export = spec.checkpoint.export_safetensors
    if t.steps == at and not run_outputs_complete(run_dir, export_wanted=wants_export):
        pass  # killed after its last checkpoint: the resume redoes the export and summary
    elif t.steps <= at:
        done = "the run is complete" if t.steps == at else "it would end before its checkpoint"
        problems.add("training.steps", t.steps,
                     f"the newest checkpoint is at step {at} ({latest.name}): {done}",
                     f"give training.steps > {at} to train on")
    elif 0 < t.stop_at_step <= at:
        problems.add("training.stop_at_step", t.stop_at_step,
                     f"is not after the newest checkpoint's step {at}",
                     f"give training.stop_at_step > {at}, or 0 to run to the end")
    problems.raise_if_any("Cannot resume")


def with_prepared_data(spec: RunSpec) -> RunSpec:
    """Prepare the stdlib corpus once (cached) and point the spec at its token files."""
    from launcher.data.prelaunch_checks import (check_stdlib_windows, stdlib_corpus_problem,
                                                verify_prepared_checksums)

    verify_prepared_checksums(spec.data)
    if spec.data.kind.value != "stdlib":
        return spec
    try:
        corpus = prepare_stdlib_corpus(cache_dir=Path(spec.data.cache_dir),
                                       val_every_nth_file=spec.data.val_every_nth_file)
    except ValueError as err:
        raise stdlib_corpus_problem(err, val_every_nth_file=spec.data.val_every_nth_file) \
            from None
    check_stdlib_windows(corpus, seq_len=spec.training.seq_len)
    data = dataclasses.replace(spec.data, train_files=corpus.train_files,
                               val_files=corpus.val_files)
    return dataclasses.replace(spec, data=data)


def _data_line(spec: RunSpec) -> str:
    d = spec.data
    if d.kind.value == "stdlib":
        where = stdlib_corpus_dir(cache_dir=Path(d.cache_dir),
                                  val_every_nth_file=d.val_every_nth_file)
        state = "cached" if (where / MANIFEST_NAME).exists() else "prepared before launch"
        return f"stdlib corpus at {where} ({state})"
    if d.kind.value == "synthetic":
        return "synthetic random tokens"
    files = f"{len(d.train_files)} train file(s), {len(d.val_files)} val file(s)"
    found = data_vocab(d)
    if found is None:
        return files
    return (f"{files}; tokenizer vocab {found.vocab_size} ({found.source}), "
            f"model.vocab_size {spec.model.vocab_size}")
