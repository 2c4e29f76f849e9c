"""Hydra lives in one room (ARCHITECTURE.md): only conf/compose/ imports hydra or omegaconf or
names DictConfig, and what leaves it is plain Python data."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from conf.compose import ParsedOverride, SweepValues, parse_override, split_sweeps

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("conf", "launcher", "training", "parallel", "sweeps")
ROOM = REPO / "conf" / "compose"
FORBIDDEN_MODULES = ("hydra", "omegaconf")
FORBIDDEN_NAMES = ("DictConfig", "ListConfig", "OmegaConf")


def hydra_uses(source: str) -> list[str]:
    """Each import of hydra/omegaconf (anywhere: top level, in functions, under TYPE_CHECKING)
    and each use of an OmegaConf name, as "line N: what"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""] if node.level == 0 else []
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.append(f"line {node.lineno}: uses {node.id}")
            continue
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES:
            found.append(f"line {node.lineno}: uses .{node.attr}")
            continue
        else:
            continue
        found += [f"line {node.lineno}: imports {m}" for m in modules
                  if m.split(".")[0] in FORBIDDEN_MODULES]
    return found


def source_files() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))
            if ROOM not in path.parents]


def test_only_the_compose_package_uses_hydra_or_omegaconf():
    assert len(source_files()) > 50  # the walk found the packages
    offenders = {str(path.relative_to(REPO)): uses for path in source_files()
                 if (uses := hydra_uses(path.read_text()))}
    assert not offenders, f"hydra/omegaconf outside conf/compose/: {offenders}"


@pytest.mark.parametrize("line", [
    "import hydra", "from hydra.core.override_parser.overrides_parser import OverridesParser",
    "import omegaconf.errors as e", "def f():\n    from omegaconf import OmegaConf",
    "if TYPE_CHECKING:\n    from omegaconf import DictConfig", "def f(cfg: 'x') -> DictConfig: ...",
])
def test_the_rule_sees_every_form_of_import(line):
    assert hydra_uses(line)


def test_the_compose_package_uses_hydra():
    assert hydra_uses((ROOM / "single.py").read_text())  # the walk would see it


def _plain(value) -> bool:
    if isinstance(value, (ParsedOverride, SweepValues)):
        return all(_plain(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return value is None or type(value) in (str, int, float, bool)


@pytest.mark.parametrize("line", [
    "model=tiny", "+experiment=smoke", "++training.steps=3", "~model", "~optim.lr=1",
    "name='a b'", "logging.wandb_tags=[a,'b c',1]", "cluster.env={A: 1}", "x@pkg=y",
    "optim.lr=1e-4,3e-4", "training.seed=range(0,4)", "training.seed=shuffle(1,2,3)",
    "model=glob(llama*,exclude=llama3_70b)", "optim.lr=tag(log,interval(1e-5,1e-2))",
])
def test_parsed_overrides_are_plain_python(line):
    parsed = parse_override(line)
    assert _plain(parsed), parsed
    assert parsed.line == line


def test_sweep_values_follow_hydra():
    assert parse_override("a=range(1,2,0.5)").sweep.values == ("1.0", "1.5")
    assert parse_override("a=sort(3,1)").sweep.values == ("1", "3")
    shuffled = parse_override("a=shuffle(1,2,3)").sweep
    assert shuffled.values == ("1", "2", "3") and shuffled.shuffle
    glob = parse_override("m=glob(l*,exclude=l2)").sweep
    assert glob.select(["a", "l1", "l2", "l3"]) == ["l1", "l3"]
    interval = parse_override("a=tag(log,interval(1e-5,1))").sweep
    assert (interval.kind, interval.low, interval.high, interval.log) == ("interval", 1e-5, 1, True)
    assert split_sweeps(["a=1", "b=1,2", "c=[", "d=glob(*)"]) == (["a=1", "c=["],
                                                                 ["b=1,2", "d=glob(*)"])
