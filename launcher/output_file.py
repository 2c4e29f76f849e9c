"""Files a command writes where the user points it (`plan --write-sweep`, `compare --csv`,
`--json`, `--html`): checked before any work, written whole or not at all.

    check_output_file("--csv", path)          # before the command computes anything
    write_file_atomically(path, text)         # a temporary sibling, then one rename

A refusal is one ConfigError naming the flag, the path, the rule and the fix (exit 2). A file
already there is replaced only as a whole (readers never see half of it); `keep_unless` lets a
command refuse to replace a file it did not write itself.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from conf.errors import ConfigError, Problem


def check_output_file(flag: str, path: Path | str, *, keep_unless: str = "",
                      make_folder: bool = False) -> None:
    """`path` can be written as a file: not a folder, its folder exists and is writable.
    With `keep_unless`, an existing file that does not start with that text is refused; with
    `make_folder`, a missing folder is fine when its nearest existing parent is writable."""
    path = Path(os.path.expanduser(str(path)))
    checked = path
    if make_folder:
        folder = _nearest_existing(path.parent)
        if folder != path.parent:
            checked = folder / "_"  # the folders below it are created: check where they start
    problem = _output_problem(checked, keep_unless)
    if problem is not None:
        rule, fix = problem
        raise ConfigError([Problem(flag, str(path), rule, fix)], "Cannot write the output file")


def _output_problem(path: Path, keep_unless: str) -> tuple[str, str] | None:
    folder = path.parent
    if path.is_dir():
        return "is a folder", f"give a file name inside it, e.g. {path / 'out'}"
    if not folder.exists():
        return (f"its folder {folder} does not exist",
                f"create it first (mkdir -p {folder}) or pick another path")
    if not folder.is_dir():
        return f"{folder} is a file, not a folder", "give a path inside a folder"
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists()
                                                    and not os.access(path, os.W_OK)):
        return "is not writable by this user", "pick a path you can write"
    if path.exists() and not path.is_file():
        return "exists and is not a regular file", "pick a new file name"
    if keep_unless and path.exists() and not _starts_with(path, keep_unless):
        return ("exists and was not written by meshrun: it is kept",
                "pick a new file name, or remove the file yourself")
    return None


def _nearest_existing(folder: Path) -> Path:
    for p in (folder, *folder.parents):
        if p.exists():
            return p
    return folder


def _starts_with(path: Path, text: str) -> bool:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            return f.read(len(text)) == text
    except OSError:
        return False


def write_file_atomically(path: Path | str, text: str) -> None:
    """Write `text` to a temporary sibling, then rename it over `path`: whole or untouched."""
    path = Path(os.path.expanduser(str(path)))
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as err:
        raise ConfigError([Problem(str(path), "", f"could not be written: {err.strerror} "
                                   f"({_free_space(path.parent)} free there)",
                                   "free some space or pick another path")],
                          "Cannot write the output file") from None
    finally:
        if tmp:
            Path(tmp).unlink(missing_ok=True)


def _free_space(folder: Path) -> str:
    try:
        st = os.statvfs(folder)
    except OSError:
        return "unknown space"
    return f"{st.f_bavail * st.f_frsize / 2**20:.1f} MiB"
