"""The flags a Hydra user reaches for, on `meshrun run`: --config-dir, --cfg job|hydra|all
(--package, --resolve: launcher/cfg_flag.py; also on `plan` and `sweep`), --info,
-m/--multirun, and the config groups in --help (and `meshrun completion bash`).

Groups and options are read from the YAML files on the config search path
(conf.search_path), never from a hand-kept list.
"""
from __future__ import annotations

import argparse
import textwrap

from conf.errors import ConfigError, Problem
from conf.overrides import GROUPS, OPTIONAL_GROUPS
from conf.search_path import (CONF_DIR, ENV_VAR, SEARCHPATH_KEY, add_config_dirs, config_dirs,
                              option_sources, searchpath_dirs, user_config_dirs)

CONFIG_DIR_FLAG = "--config-dir"
INFO_TOPICS = ("all", "searchpath", "groups")


def apply_search_path_args(argv: list[str]) -> list[str]:
    """Take `--config-dir DIR` (any command, any place) and `hydra.searchpath=[...]` out of
    `argv`, add their dirs to the config search path, and return the rest.

    Done before argparse so that every command (sweep included) and --help see the dirs."""
    rest, dirs = [], []
    words = iter(argv)
    for word in words:
        if word == CONFIG_DIR_FLAG:
            value = next(words, None)
            if value is None:
                raise ConfigError([Problem(CONFIG_DIR_FLAG, "", "needs a folder",
                                           f"{CONFIG_DIR_FLAG} DIR")], "Bad command")
            dirs.append(value)
        elif word.startswith(CONFIG_DIR_FLAG + "="):
            dirs.append(word.split("=", 1)[1])
        elif word.startswith(SEARCHPATH_KEY + "="):
            from conf.compose import parse_override

            dirs += searchpath_dirs(parse_override(word).value)
        else:
            rest.append(word)
    add_config_dirs(dirs)
    return rest


def add_config_dir_arg(parser: argparse.ArgumentParser) -> None:
    """Document --config-dir on a command (apply_search_path_args consumes it before parsing)."""
    parser.add_argument(CONFIG_DIR_FLAG, metavar="DIR", action="append",
                        help=f"a folder laid out like conf/ (DIR/model/NAME.yaml -> model=NAME, "
                             f"DIR/experiment/NAME.yaml -> +experiment=NAME), searched after "
                             f"meshrun's conf/; repeatable; also {ENV_VAR}=DIR1:DIR2 or "
                             f"{SEARCHPATH_KEY}=[DIR,...]")


def add_run_flags(run: argparse.ArgumentParser) -> None:
    """The Hydra-style flags of `meshrun run`, and its --help listing of the config groups."""
    add_config_dir_arg(run)
    add_cfg_flags(run)
    run.add_argument("--info", nargs="?", const="all", choices=INFO_TOPICS,
                     help="print the config search path and the config groups found, and exit")
    run.add_argument("-m", "--multirun", action="store_true",
                     help="overrides with several values (optim.lr=1e-4,1e-3) run as a sweep: "
                          "the same points as `meshrun sweep OVERRIDES`")
    run.add_argument("-y", "--yes", action="store_true", help="with -m: run without asking")
    run.formatter_class = argparse.RawDescriptionHelpFormatter
    run.epilog = groups_help()


def add_cfg_flags(parser: argparse.ArgumentParser, *, what: str = "the config") -> None:
    """Hydra's --cfg job|hydra|all, --package, --resolve (launcher/cfg_flag.py)."""
    parser.add_argument("--cfg", "-c", choices=("job", "hydra", "all"),
                        help=f"print {what} and exit, nothing created: job = the composed "
                             "config; hydra = what meshrun uses in place of Hydra's runtime "
                             "settings (run dir, sweep dir, launcher = cluster); all = both")
    parser.add_argument("--package", "-p", metavar="PKG",
                        help="with --cfg: print only this part of the config (model, model.dim)")
    parser.add_argument("--resolve", action="store_true",
                        help="with --cfg: resolve interpolations (${model.name}) before printing")


def groups_help(width: int = 100) -> str:
    """Every config group and its options, as --help shows them."""
    lines = ["config groups (group=option; + for experiment), from "
             + ", ".join(str(d) for d in config_dirs()) + ":"]
    for group in GROUPS + OPTIONAL_GROUPS:
        head = f"  {'+' if group in OPTIONAL_GROUPS else ''}{group}: "
        lines += textwrap.wrap(", ".join(option_sources(group)), width=width,
                               initial_indent=head, subsequent_indent=" " * len(head))
    return "\n".join(lines)


def info_text(topic: str = "all") -> str:
    """`--info`: the config search path (in order, with where each dir came from) and the
    groups found, each option with the dir it is composed from when that is not conf/."""
    out = []
    if topic in ("all", "searchpath"):
        out.append("config search path (searched in this order):")
        out.append(f"  {CONF_DIR}  (meshrun)")
        out += [f"  {d}  ({ENV_VAR} / {CONFIG_DIR_FLAG})" for d in user_config_dirs()]
    if topic in ("all", "groups"):
        out.append("config groups:")
        for group in GROUPS + OPTIONAL_GROUPS:
            shown = [name if path.parents[1] == CONF_DIR else f"{name} ({path})"
                     for name, path in option_sources(group).items()]
            prefix = "+" if group in OPTIONAL_GROUPS else ""
            out.append(f"  {prefix}{group}: {', '.join(shown)}")
    return "\n".join(out)


def multirun(args: argparse.Namespace, build_parser) -> int:
    """`meshrun run -m ...`: hand the overrides to `meshrun sweep` (same expansion, checks,
    preview and runs)."""
    argv = ["sweep", *args.overrides] + (["--dry-run"] if args.dry_run else []) \
        + (["--yes"] if args.yes else []) + (["--wait"] if args.wait else []) \
        + (["--force"] if getattr(args, "force", False) else [])
    try:
        sweep_args = build_parser().parse_args(argv)
    except SystemExit:
        raise ConfigError([Problem("--multirun", "", "needs the sweep command (meshrun.commands "
                                   "entry point of the sweeps package)",
                                   "install meshrun with its sweeps package")],
                          "Bad command") from None
    from rich.console import Console

    return sweep_args.handler(sweep_args, Console())


def completion_script(shell: str) -> str:
    """A small bash completion script: commands, flags, and group=option words from the files
    on the config search path at the time it is generated."""
    if shell != "bash":
        raise ConfigError([Problem("shell", shell, "is not supported", "use bash")],
                          "Bad command")
    words = [f"{group}={name}" for group in GROUPS for name in option_sources(group)]
    words += [f"+{group}={name}" for group in OPTIONAL_GROUPS for name in option_sources(group)]
    commands = "run plan resume status stop preflight sweep compare completion"
    flags = ("--dry-run --cfg --package --resolve --info --multirun --config-dir --prepare-only "
             "--help")
    return textwrap.dedent(f"""\
        # meshrun bash completion: eval "$(meshrun completion bash)"
        _meshrun() {{
            if [ "$COMP_CWORD" -eq 1 ]; then
                COMPREPLY=($(compgen -W "{commands}" -- "${{COMP_WORDS[1]}}")); return
            fi
            local word="${{COMP_LINE:0:$COMP_POINT}}"; word="${{word##* }}"
            local IFS=$'\\n'
            local found=($(compgen -W "$(printf '%s\\n' {flags} {' '.join(words)})" -- "$word"))
            [[ "$word" == *=* ]] && found=("${{found[@]#*=}}")
            COMPREPLY=("${{found[@]}}")
        }}
        complete -o default -F _meshrun meshrun
        """)

