"""The sweep commands of `meshrun`, registered through the `meshrun.commands` entry point.

    meshrun sweep [-f FILE] [options] [OVERRIDE ...]   expand, validate, preview, confirm, run
    meshrun sweep status SWEEP_DIR [--json]            a table of the points' states
    meshrun sweep retry SWEEP_DIR [options]            rerun failed/missing, continue stopped
    meshrun sweep --cfg job|hydra|all [--package P] [--resolve] [-f FILE] [OVERRIDE ...]
                                                       each point's config, one YAML document each

Examples:
    meshrun sweep model=tiny optim.lr=1e-4,3e-4,1e-3 schedule.warmup_steps=0,10 --dry-run
    meshrun sweep -f debug_lr_warmup --yes          # a sweep file shipped in conf/sweeps/
    meshrun sweep -f my_sweep.yaml training.steps=200 'optim.lr=range(1,4)' --parallel 2
    meshrun sweep -f layout_precision --yes --array-parallelism 4   # Slurm job arrays

Axes use Hydra's sweep grammar (a,b,c  range(...)  choice(...)  glob(...)); a sweep file
(see sweeps/spec_file.py and conf/sweeps/) adds zipped, random and explicit-list sweeps and a
run-name template. Every point is validated before anything runs; the sweep dir
(default <runs_dir>/sweeps/<name>) holds points.json and each point's run dir. Running the
same sweep into the same dir again skips its completed points. One runner per sweep dir
(a second is refused); its points die with it, and `retry` continues the stopped ones in their
own run dirs.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from conf.errors import ConfigError, Problem
from launcher.cli import FORCE_HELP
from launcher.hydra_flags import add_cfg_flags
from sweeps.spec_file import COMBINES, extend, find_sweep_file, inline_sweep, load_sweep_file

SUBCOMMANDS = ("status", "retry")


def register(subparsers) -> None:
    """Add `sweep` (and its sub-commands) and `compare` to the meshrun parser."""
    parser = subparsers.add_parser(
        "sweep", help="run many points: expand, validate all, preview the cost, run, track",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="meshrun sweep [-f FILE] [options] [OVERRIDE ...]\n"
              "       meshrun sweep status SWEEP_DIR [--json]\n"
              "       meshrun sweep retry SWEEP_DIR [options]")
    parser.add_argument("words", nargs="*", metavar="OVERRIDE",
                        help="Hydra overrides; sweeps (a,b / range() / choice() / glob()) are axes")
    parser.add_argument("-f", "--file", help="a sweep file, or the name of one in conf/sweeps/")
    parser.add_argument("--name", help="sweep name (W&B group, sweep dir name)")
    parser.add_argument("--combine", choices=COMBINES, help="how axes combine (default: grid)")
    parser.add_argument("--samples", type=int, help="combine=random: number of points")
    parser.add_argument("--seed", type=int, help="combine=random: seed")
    parser.add_argument("--run-name", dest="run_name",
                        help="run name template, e.g. 'lr{optim.lr}-{index}'")
    parser.add_argument("--dir", type=Path, help="sweep dir (default <runs_dir>/sweeps/<name>)")
    parser.add_argument("--dry-run", action="store_true",
                        help="expand, validate and preview only; write and submit nothing")
    parser.add_argument("-y", "--yes", action="store_true", help="run without asking")
    parser.add_argument("--force", action="store_true",
                        help="every point, as for `meshrun run`: " + FORCE_HELP)
    parser.add_argument("--skip-invalid", action="store_true",
                        help="drop invalid points (reported) instead of refusing the sweep")
    parser.add_argument("--parallel", type=int,
                        help="local: run up to N points at once when they fit this machine")
    parser.add_argument("--array-parallelism", type=int, dest="array_parallelism",
                        help="slurm: array tasks running at once")
    parser.add_argument("--wait", action="store_true",
                        help="slurm: wait until every submitted point has ended")
    parser.add_argument("--max-points", type=int, dest="max_points",
                        help="refuse sweeps of more points than this (default sweeps.expand.MAX_POINTS, "
                             "10,000), "
                             "counted before any point is made")
    parser.add_argument("--rows", type=int, default=50, help="preview at most N rows")
    parser.add_argument("--json", action="store_true", help="status: machine-readable output")
    add_cfg_flags(parser, what="each point's config (one YAML document per point)")
    parser.set_defaults(handler=handle_sweep)
    # --- `meshrun compare`: registered by sweeps/compare_cli.py (its own module and owner) ---
    try:
        from sweeps.compare_cli import register_compare
    except ModuleNotFoundError as err:
        if err.name != "sweeps.compare_cli":
            raise
    else:
        register_compare(subparsers)


def handle_sweep(args: argparse.Namespace, console: Console) -> int:
    words = list(args.words)
    if args.cfg or args.package is not None or args.resolve:
        return print_points_cfg(words, args)
    if words and words[0] in SUBCOMMANDS:
        if len(words) != 2:
            raise ConfigError([Problem(words[0], " ".join(words[1:]),
                                       "takes exactly one sweep dir",
                                       f"meshrun sweep {words[0]} SWEEP_DIR")], "Bad command")
        sweep_dir = Path(words[1])
        return show_status(sweep_dir, args, console) if words[0] == "status" else \
            retry(sweep_dir, args, console)
    return start(words, args, console)


def print_points_cfg(words: list[str], args: argparse.Namespace) -> int:
    """`meshrun sweep --cfg job|hydra|all [--package] [--resolve] ...`: every point's config,
    one YAML document each; nothing validated, written or run."""
    from launcher.cfg_flag import check_cfg_flags, print_cfgs
    from sweeps.expand import expand

    given = {f"sweep {words[0]}": True} if words and words[0] in SUBCOMMANDS else {}
    check_cfg_flags(cfg=args.cfg, package=args.package, resolve=args.resolve, command="sweep",
                    others={**given, "--dry-run": args.dry_run, "--yes": args.yes})
    sweep = _definition(words, args)
    points = expand(sweep, **({} if args.max_points is None else {"max_points": args.max_points}))
    labelled = [(f"point {p.index} (run {p.name}): "
                 + " ".join(f"{k}={v}" for k, v in p.values.items()),
                 list(p.run_overrides)) for p in points]
    return print_cfgs(labelled, part=args.cfg, package=args.package, resolve=args.resolve)


def _settings(args: argparse.Namespace) -> dict:
    keys = ("combine", "samples", "seed", "run_name", "parallel", "array_parallelism", "name")
    return {k: getattr(args, k) for k in keys if getattr(args, k) is not None}


def _options(args: argparse.Namespace, sweep_dir: Path | None):
    from sweeps.submit import Options

    return Options(sweep_dir=sweep_dir, dry_run=args.dry_run, yes=args.yes,
                   skip_invalid=args.skip_invalid, wait=args.wait, max_rows=args.rows,
                   force=args.force,
                   **({} if args.max_points is None else {"max_points": args.max_points}))


def start(words: list[str], args: argparse.Namespace, console: Console) -> int:
    from sweeps.submit import run_sweep

    return run_sweep(_definition(words, args), _options(args, args.dir), console)


def _definition(words: list[str], args: argparse.Namespace):
    """The sweep the command line describes: a sweep file extended by `words`, or `words`."""
    if args.file:
        return extend(load_sweep_file(find_sweep_file(args.file)), words, **_settings(args))
    if not words:
        raise ConfigError([Problem("sweep", "", "nothing to sweep",
                                   "give -f FILE or overrides such as optim.lr=1e-4,3e-4")],
                          "Bad command")
    return inline_sweep(words, **_settings(args))


def show_status(sweep_dir: Path, args: argparse.Namespace, console: Console) -> int:
    from sweeps.state import SweepState
    from sweeps.track import print_sweep_status

    print_sweep_status(SweepState.open(sweep_dir), console, as_json=args.json)
    return 0


def retry(sweep_dir: Path, args: argparse.Namespace, console: Console) -> int:
    """Rerun the failed and missing points of a sweep dir and continue its stopped ones, from
    its stored definition."""
    import dataclasses

    from sweeps.state import SweepState
    from sweeps.submit import run_sweep

    state = SweepState.open(sweep_dir)
    sweep = state.definition()
    settings = {k: v for k, v in _settings(args).items()
                if k in ("parallel", "array_parallelism")}
    sweep = dataclasses.replace(sweep, **settings)
    return run_sweep(sweep, _options(args, sweep_dir), console, points=state.stored_points())
