"""Where `meshrun data ...` writes: never into a folder of the user's own files, never a
half-made output that looks complete, and a full disk named in one line.

- `check_out_dir`: --out must be a folder (or not exist yet) whose parent exists and is
  writable; an existing non-empty folder must be one meshrun made for this command (it holds
  MARKER, or, for dirs made before the marker, only names this command writes), else it is
  refused: meshrun never deletes or overwrites a file it did not write.
- `staged_dir`: build the output in a temporary sibling, then rename it into place (an earlier
  output of meshrun's at that path is replaced only then); on any failure the sibling is removed.
- `disk_full`: an OSError for a full disk (ENOSPC, EDQUOT) as one line naming the path and the
  space left.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from launcher.data.stage_owner import claim_stage, release_stage, remove_stale_stages

MARKER = ".meshrun-output.json"
"""Written first into every folder `meshrun data` makes: {"command": "data prepare", ...}."""
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def check_out_dir(out: str | Path, *, command: str, own_name: Callable[[str], bool],
                  unmarked_ok: Callable[[Path], bool] = lambda path: True) -> Path:
    """The --out folder, when meshrun may write there; ValueError (path, rule, fix) otherwise.
    `own_name`: names this command writes; `unmarked_ok`: whether a folder holding only such
    names but no MARKER (made before the marker existed) is this command's."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {path}: is a file, not a folder (fix: name a new folder)")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise ValueError(f"--out {path}: its parent folder {parent} does not exist (fix: create "
                         "it, or name an --out inside an existing folder)")
    where = path if path.is_dir() else parent
    if not os.access(where, os.W_OK | os.X_OK):
        raise ValueError(f"--out {path}: {where} is not writable (fix: choose a folder you "
                         "may write to)")
    if path.is_dir():
        foreign = _foreign_entries(path, command=command, own_name=own_name,
                                   unmarked_ok=unmarked_ok)
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more"
                                              if len(foreign) > 3 else "")
            raise ValueError(
                f"--out {path}: is a non-empty folder `meshrun {command}` did not make (it "
                f"holds {shown}); meshrun never writes into a folder of other files (fix: name "
                "a new or empty folder, or one an earlier identical command made)")
    return path


def _foreign_entries(path: Path, *, command: str, own_name: Callable[[str], bool],
                     unmarked_ok: Callable[[Path], bool]) -> list[str]:
    """Entries that show `path` is not an output of `command` (empty: it is, or it is empty)."""
    names = sorted(entry.name for entry in path.iterdir())
    if MARKER in names and _marker_command(path) != command:
        return [f"{MARKER} of `meshrun {_marker_command(path)}`"]
    foreign = [n for n in names if n != MARKER and not own_name(n)]
    if names and not foreign and MARKER not in names and not unmarked_ok(path):
        return names
    return foreign


def _marker_command(path: Path) -> str | None:
    try:
        return json.loads((path / MARKER).read_text()).get("command")
    except (OSError, ValueError, AttributeError):
        return None


def write_marker(folder: Path, *, command: str) -> None:
    (folder / MARKER).write_text(json.dumps({"command": command, "written_by": "meshrun"}) + "\n")


@contextmanager
def staged_dir(out: Path, *, command: str) -> Iterator[Path]:
    """A fresh temporary folder beside `out` (marked as `command`'s); renamed to `out` when the
    block ends normally (an earlier meshrun output there is moved aside, then removed), removed
    when it raises. Staging folders of `command` for `out` left by a killed process are removed
    first (launcher/data/stage_owner.py); one a live process holds is never touched."""
    remove_stale_stages(out, command=command)
    stage = Path(tempfile.mkdtemp(prefix=f".meshrun-{out.name}-", dir=out.absolute().parent))
    owner = None
    try:
        owner = claim_stage(stage, out=out, command=command)
        os.chmod(stage, 0o755)
        write_marker(stage, command=command)
        yield stage
        release_stage(stage)
        _install(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if owner is not None:
            os.close(owner)


def _install(stage: Path, out: Path) -> None:
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".meshrun-{out.name}-old-", dir=out.absolute().parent))
        os.replace(out, old / out.name)
    os.replace(stage, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def disk_full(err: OSError, path: Path) -> ValueError | None:
    """One line for a full disk (None for any other OSError): the path and the space left."""
    if err.errno not in DISK_FULL:
        return None
    probe = path if path.exists() else path.absolute().parent
    try:
        stat = os.statvfs(probe)
        free = f"{stat.f_bavail * stat.f_frsize / 2**20:.1f} MiB free of " \
               f"{stat.f_blocks * stat.f_frsize / 2**20:.1f} MiB"
    except OSError:
        free = "free space unknown"
    return ValueError(f"disk full writing {err.filename or path} ({free} on that filesystem): "
                      "nothing there looks complete (no manifest was written); free space or "
                      "choose another --out, then run the same command again")


def os_problem(err: OSError, path: Path) -> ValueError:
    """An OSError while writing `path` as a one-line ValueError (disk full: see disk_full)."""
    full = disk_full(err, path)
    if full is not None:
        return full
    where = err.filename or path
    return ValueError(f"cannot write {where}: {err.strerror or err} (fix: check the folder's "
                      "permissions and free space, or choose another --out)")


_SHARD_NAME = re.compile(r"(train|val)(_\d{5}\.(bin|mask)|\.pending\.\d+)(\.tmp)?")


def prepared_name(name: str) -> bool:
    """A file `meshrun data prepare`/`prepare-sft` writes into a prepared dir."""
    return bool(_SHARD_NAME.fullmatch(name)) or name in (
        "manifest.json", "manifest.json.tmp", "progress.json", "progress.json.tmp")
