"""Each file says what it holds, once: no module name appears in two of meshrun's packages
(`rundir.py` in conf and launcher once meant two different things), so a name in a traceback,
a review or a grep points at one file."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("conf", "parallel", "training", "launcher", "sweeps")
SHARED_BY_DESIGN = {"__init__.py", "__main__.py"}


def files_by_name() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if path.name not in SHARED_BY_DESIGN and "__pycache__" not in path.parts:
                found[path.name].append(str(path.relative_to(REPO)))
    return found


def test_no_file_name_appears_twice():
    found = files_by_name()
    assert len(found) > 100  # the walk found the packages
    assert {name: paths for name, paths in found.items() if len(paths) > 1} == {}


def test_the_check_sees_a_twice_used_name(tmp_path):
    probe = REPO / "sweeps" / "resolve.py"  # conf/resolve.py exists
    assert not probe.exists()
    probe.write_text('"""probe"""\n')
    try:
        assert sorted(files_by_name()["resolve.py"]) == ["conf/resolve.py", "sweeps/resolve.py"]
    finally:
        probe.unlink()
