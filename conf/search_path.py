"""Where config group options come from: meshrun's conf/, then the user's config dirs.

A user config dir has the layout of conf/: `DIR/model/my1b.yaml` composes as `model=my1b`,
`DIR/experiment/mine.yaml` as `+experiment=mine`. Its files may build on the shipped ones
(`defaults: [tiny, _self_]` in a model file). Dirs are searched after meshrun's conf/, in
order, as Hydra's `hydra.searchpath` (a user file never shadows a shipped one of the name).

The user dirs are one list, held in the environment variable MESHRUN_CONFIG_PATH
(colon-separated, like PATH), so that every process of a run or sweep sees the same list.
`meshrun run --config-dir DIR` and a `hydra.searchpath=[...]` override add to it
(`add_config_dirs`). Nothing here imports Hydra.
"""
from __future__ import annotations

import os
from pathlib import Path

from conf.errors import ConfigError, Problem

CONF_DIR = Path(__file__).resolve().parent
ENV_VAR = "MESHRUN_CONFIG_PATH"
SEARCHPATH_KEY = "hydra.searchpath"
FILE_SCHEME = "file://"


def user_config_dirs() -> list[Path]:
    """The user config dirs, in search order (MESHRUN_CONFIG_PATH); each checked to exist."""
    dirs = [Path(p).expanduser().resolve() for p in os.environ.get(ENV_VAR, "").split(":") if p]
    missing = [d for d in dirs if not d.is_dir()]
    if missing:
        raise ConfigError([Problem(ENV_VAR, str(d), "is not a directory",
                                   "give a folder laid out like conf/ (DIR/model/NAME.yaml)")
                           for d in missing], "Bad config search path")
    return list(dict.fromkeys(d for d in dirs if d != CONF_DIR))


def config_dirs() -> list[Path]:
    """meshrun's conf/ first, then the user config dirs: Hydra's search path, in order."""
    return [CONF_DIR, *user_config_dirs()]


def add_config_dirs(dirs: list[str | Path]) -> None:
    """Add `dirs` (after those already there) to MESHRUN_CONFIG_PATH for this process and
    every process it starts. Raises ConfigError naming each dir that does not exist."""
    if not dirs:
        return
    paths = [Path(d).expanduser().resolve() for d in dirs]
    missing = [(d, p) for d, p in zip(dirs, paths) if not p.is_dir()]
    if missing:
        raise ConfigError([Problem("--config-dir", str(d), "is not a directory",
                                   "give a folder laid out like conf/ (DIR/model/NAME.yaml)")
                           for d, _ in missing], "Bad config search path")
    current = [p for p in os.environ.get(ENV_VAR, "").split(":") if p]
    os.environ[ENV_VAR] = ":".join(dict.fromkeys(current + [str(p) for p in paths]))


def hydra_searchpath() -> list[str]:
    """The user dirs as Hydra's `hydra.searchpath` entries (file:// URLs)."""
    return [FILE_SCHEME + str(d) for d in user_config_dirs()]


def group_options(group: str) -> list[str]:
    """The options of a config group: the YAML files in <dir>/<group>/ of every config dir."""
    return sorted({p.stem for d in config_dirs() for p in (d / group).glob("*.yaml")})


def option_sources(group: str) -> dict[str, Path]:
    """Each option of `group` and the file Hydra composes for it (the first dir that has it)."""
    found: dict[str, Path] = {}
    for d in config_dirs():
        for p in sorted((d / group).glob("*.yaml")):
            found.setdefault(p.stem, p)
    return dict(sorted(found.items()))


def searchpath_dirs(value: object) -> list[str]:
    """The dirs of a `hydra.searchpath=[...]` override's value; ConfigError unless it is a list
    of folders (plain paths or file:// URLs; meshrun has no pkg:// configs to add)."""
    entries = value if isinstance(value, list) else [value]
    dirs, problems = [], []
    for entry in entries:
        text = str(entry)
        if "://" in text and not text.startswith(FILE_SCHEME):
            problems.append(Problem(SEARCHPATH_KEY, text, "only folders can be added",
                                    "give file:///abs/dir or a path, or use --config-dir DIR"))
            continue
        dirs.append(text.removeprefix(FILE_SCHEME))
    if problems:
        raise ConfigError(problems, "Bad config search path")
    return dirs
