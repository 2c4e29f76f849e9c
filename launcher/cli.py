"""The `meshrun` command: run (with --dry-run), plan, resume, status, stop.

Bad input ends with one message and exit status 2, never a traceback. Nothing on the dry-run
path imports torch. `main` starts a local run's torchrun agent before it imports the rest of
meshrun (launcher/backends/warm_torchrun.py), so only the standard library is imported up here.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.backends.warm_torchrun import WarmTorchrun, launches_locally, warm_torchrun

if TYPE_CHECKING:
    from rich.console import Console

EXIT_BAD_INPUT = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a process killed by it
FORCE_HELP = ("launch even when the plan says the run does not fit (a GPU's memory, or on CPU "
              "this machine's available RAM for all its ranks): it launches anyway and you "
              "accept that it may fail out of memory; without it such a run is refused (exit 2)")


def build_parser() -> argparse.ArgumentParser:
    from launcher import eval_command, hydra_flags
    from launcher.data import data_command
    from launcher import stop_command

    parser = argparse.ArgumentParser(prog="meshrun", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compose, validate, plan and launch a run")
    run.add_argument("--dry-run", action="store_true",
                     help="print the resolved config, the plan and the launch command; launch nothing")
    run.add_argument("--wait", action="store_true",
                     help="cluster=slurm: stay attached and show progress until the job ends")
    run.add_argument("--prepare-only", action="store_true", dest="prepare_only",
                     help="create the run dir (data prepared, spec written), print its path and "
                          "exit; start it with the torchrun line --dry-run prints")
    run.add_argument("--force", action="store_true", help=FORCE_HELP)
    hydra_flags.add_run_flags(run)
    run.add_argument("overrides", nargs="*", help="Hydra overrides: group=option, key=value, "
                     "...; anywhere on the line, before or after flags")
    plan = sub.add_parser("plan", help="print the numbers of a run (memory, FLOPs, tokens)")
    plan.add_argument("--attention-flops", choices=("full", "causal"), default="full",
                      help="FLOPs attention term: full (12*L*H*Q*T, PaLM/torchtitan, what MFU "
                           "uses) or causal (halved, FlashAttention's count)")
    plan.add_argument("--json", action="store_true",
                      help="print the whole plan as JSON (keys: launcher/plan/plan_json.py)")
    plan.add_argument("--calibrate", nargs="+", type=Path, metavar="RUN_DIR",
                      help="fit the step-time model to these runs (metrics, preflight.json), "
                           "print the error per run, store it (launcher/plan/calibrate_command.py)")
    plan.add_argument("--calibration-out", type=Path, default=None, metavar="FILE",
                      help="--calibrate: the file to write (default ~/.meshrun/calibration.json)")
    add_search_args(plan)
    hydra_flags.add_cfg_flags(plan)
    plan.add_argument("overrides", nargs="*")
    hydra_flags.add_config_dir_arg(plan)
    resume = sub.add_parser("resume", help="continue a run dir from its latest checkpoint")
    resume.add_argument("run_dir", type=Path)
    resume.add_argument("--wait", action="store_true", help="cluster=slurm: wait for the job")
    resume.add_argument("--force", action="store_true", help=FORCE_HELP)
    resume.add_argument("overrides", nargs="*", help="extra overrides, e.g. training.steps=2000")
    hydra_flags.add_config_dir_arg(resume)
    preflight = sub.add_parser("preflight", help="only check joins, all-reduce and bandwidth")
    preflight.add_argument("overrides", nargs="*")
    hydra_flags.add_config_dir_arg(preflight)
    completion = sub.add_parser("completion", help="print a shell completion script: "
                                "eval \"$(meshrun completion bash)\"")
    completion.add_argument("shell", choices=("bash",))
    status = sub.add_parser("status", help="state, step, latest metrics of a run dir")
    status.add_argument("run_dir", type=Path)
    status.add_argument("--json", action="store_true", help="print machine-readable JSON")
    data_command.register(sub)
    stop_command.register(sub)
    eval_command.register(sub)
    for register in command_plugins():
        register(sub)
    return parser


def command_plugins() -> list:
    """Subcommands other packages add (entry-point group `meshrun.commands`, e.g. sweeps).

    Each entry point is a function `register(subparsers)` that adds its parsers and sets
    `handler=<callable(args, console) -> int>` as their default. This keeps launcher from
    importing sweeps (sweeps builds on launcher, not the other way round).
    """
    from importlib.metadata import entry_points

    return [ep.load() for ep in entry_points(group="meshrun.commands")]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with warm_torchrun(launches_locally(argv)) as warm:  # before the imports below (~0.15 s)
        return _main(argv, warm)


def _main(argv: list[str], warm: WarmTorchrun | None) -> int:
    from rich.console import Console

    from conf.errors import ConfigError
    from launcher import commands, hydra_flags
    from launcher.intermixed_args import parse_intermixed

    console = Console()
    try:
        argv = hydra_flags.apply_search_path_args(argv)
        args = parse_intermixed(build_parser(), argv)
        if getattr(args, "handler", None) is not None:
            return args.handler(args, console)
        if args.command == "plan" and (args.cfg or args.package is not None or args.resolve):
            return plan_cfg(args)
        if args.command == "plan" and args.search:
            return search_command(args, console)
        if args.command == "plan":
            if args.calibrate:
                from launcher.plan.calibrate_command import run_calibrate
                return run_calibrate(args.calibrate, out=args.calibration_out, console=console)
            return commands.plan(args.overrides, console=console, attention=args.attention_flops,
                                 as_json=args.json)
        if args.command == "resume":
            return commands.resume(args.run_dir, args.overrides, console=console, wait=args.wait,
                                   warm=warm, force=args.force)
        if args.command == "preflight":
            return commands.preflight(args.overrides, console=console, warm=warm)
        if args.command == "status":
            return show_status(args.run_dir, as_json=args.json, console=console)
        if args.command == "completion":
            print(hydra_flags.completion_script(args.shell), end="")
            return 0
        return run_command(args, console, warm)
    except ConfigError as err:
        Console(stderr=True).print(str(err), markup=False, highlight=False, soft_wrap=True)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # our reader went away (`meshrun ... | head`): no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def run_command(args: argparse.Namespace, console: Console,
                warm: WarmTorchrun | None = None) -> int:
    """`meshrun run`, with Hydra's --cfg (--package, --resolve), --info and -m/--multirun;
    `warm`: the torchrun agent `main` started, for a run that launches here."""
    from launcher import commands, hydra_flags
    from launcher.cfg_flag import check_cfg_flags, print_cfg

    check_cfg_flags(cfg=args.cfg, package=args.package, resolve=args.resolve,
                    others={"--info": bool(args.info), "--multirun": args.multirun,
                            "--dry-run": args.dry_run, "--prepare-only": args.prepare_only})
    if args.info:
        print(hydra_flags.info_text(args.info))
        return 0
    if args.multirun:
        return hydra_flags.multirun(args, build_parser)
    if args.cfg:
        return print_cfg(args.overrides, part=args.cfg, package=args.package,
                         resolve=args.resolve)
    return commands.run(args.overrides, dry_run=args.dry_run, console=console, wait=args.wait,
                        prepare_only=args.prepare_only, warm=warm, force=args.force)


def plan_cfg(args: argparse.Namespace) -> int:
    """`meshrun plan --cfg job|hydra|all [--package] [--resolve]`: print, plan nothing."""
    from launcher.cfg_flag import check_cfg_flags, print_cfg

    check_cfg_flags(cfg=args.cfg, package=args.package, resolve=args.resolve, command="plan",
                    others={"--search": args.search, "--json": args.json,
                            "--calibrate": bool(args.calibrate)})
    return print_cfg(args.overrides, part=args.cfg, package=args.package, resolve=args.resolve)


def add_search_args(plan: argparse.ArgumentParser) -> None:
    plan.add_argument("--search", action="store_true",
                      help="rank every layout resolve() accepts by predicted tokens/s per "
                           "device (launcher/plan/plan_search.py)")
    plan.add_argument("--top", type=int, default=10, help="--search: layouts to show")
    plan.add_argument("--global-batch-tokens", type=int, dest="global_batch_tokens",
                      help="--search: tokens per optimizer step (default: "
                           "training.global_batch_size x seq_len)")
    plan.add_argument("--write-sweep", type=Path, dest="write_sweep",
                      help="--search: write the top layouts as a sweep file, best first")
    plan.add_argument("--rank-of", dest="rank_of", metavar="OVERRIDES",
                      help="--search: where this layout ranks and why, e.g. --rank-of "
                           "'parallel=fsdp_tp parallel.tp=8 parallel.loss_parallel=true'")


def search_command(args: argparse.Namespace, console: Console) -> int:
    from launcher.plan.plan_search import plan_search

    return plan_search(args.overrides, console=console, top=args.top, as_json=args.json,
                       global_batch_tokens=args.global_batch_tokens,
                       write_sweep=args.write_sweep, rank_of_text=args.rank_of)


def show_status(run_dir: Path, *, as_json: bool, console: Console) -> int:
    from launcher.views.run_status import print_status, run_status, status_json

    status = run_status(run_dir)
    if as_json:
        print(status_json(status))
    else:
        print_status(status, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
