"""Validate every point before anything is submitted: compose + resolve each, collect problems.

Each point's problems are the ones `meshrun run` would print for it (same ConfigError text);
a sweep with any invalid point is refused whole unless --skip-invalid drops those points.
"""
from __future__ import annotations

from dataclasses import dataclass

from conf.compose import compose_many
from conf.errors import ConfigError, Problem
from conf.hf_model_config import explicit_model_keys
from conf.resolve import resolve
from conf.schema import RunConfig
from conf.spec import HostSpec, RunSpec
from launcher.backends.choose import backend_for
from sweeps.expand import Point

LIST_EACH_POINT_UP_TO = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Checked:
    point: Point
    spec: RunSpec | None = None
    config: RunConfig | None = None
    problems: tuple[Problem, ...] = ()
    title: str = ""
    """The ConfigError's title (Invalid run config / Invalid overrides), as a single run says."""

    @property
    def valid(self) -> bool:
        return self.spec is not None and not self.problems


def validate(points: list[Point], *, host: HostSpec) -> list[Checked]:
    """Compose and resolve every point (sharing Hydra work between them)."""
    composed = compose_many([p.overrides for p in points], settings=[p.settings for p in points])
    return [_check(point, config, host) for point, config in zip(points, composed)]


def _check(point: Point, config: RunConfig | ConfigError, host: HostSpec) -> Checked:
    if isinstance(config, ConfigError):
        return Checked(point=point, problems=tuple(config.problems), title=config.title)
    try:
        spec = resolve(config, host=host, explicit=explicit_model_keys(point.overrides))
    except ConfigError as err:
        return Checked(point=point, problems=tuple(err.problems), title=err.title)
    problems = _sweep_rules(spec)
    return Checked(point=point, spec=None if problems else spec, config=config,
                   problems=tuple(problems), title="Cannot sweep")


def _sweep_rules(spec: RunSpec) -> list[Problem]:
    if not backend_for(spec.cluster).sweepable:
        return [Problem("cluster", spec.cluster.kind,
                        "sweeps run their points locally or on Slurm",
                        "use cluster=local or cluster=slurm")]
    return []


def point_label(point: Point) -> str:
    shorts = [k.split(".")[-1] for k in point.values]
    parts = [f"{s if shorts.count(s) == 1 else k}={v}"
             for (k, v), s in zip(point.values.items(), shorts)]
    return " ".join(parts) or point.name


class InvalidSweep(ConfigError):
    """Some points cannot run; the message names each point and its problems."""

    def __init__(self, invalid: list[Checked], total: int) -> None:
        super().__init__([p for c in invalid for p in c.problems], "Invalid sweep")
        self.invalid = invalid
        self.args = (describe_invalid(invalid, total) +
                     "\nnothing was submitted (--skip-invalid runs the valid points only)",)


def describe_invalid(invalid: list[Checked], total: int) -> str:
    n = len(invalid)
    lines = [f"Invalid sweep: {n} of {total} point{'s' if total != 1 else ''} "
             f"{'has' if n == 1 else 'have'} problems:"]
    if n <= LIST_EACH_POINT_UP_TO:
        for c in invalid:
            count = f"{len(c.problems)} problem{'s' if len(c.problems) != 1 else ''}"
            lines.append(f"  point {c.point.index} [{point_label(c.point)}] ({c.title}, {count}):")
            lines += ["    " + p.render() for p in c.problems]
        return "\n".join(lines)
    by_problem: dict[str, list[int]] = {}
    for c in invalid:
        for p in c.problems:
            by_problem.setdefault(p.render(), []).append(c.point.index)
    for text, indices in by_problem.items():
        shown = ", ".join(map(str, indices[:12])) + (", ..." if len(indices) > 12 else "")
        lines.append(f"  {text}")
        lines.append(f"    in {len(indices)} point{'s' if len(indices) != 1 else ''}: {shown}")
    return "\n".join(lines)
