"""Compare runs: collect run dirs (from a sweep's points.json or given), diff their configs, rank them.

Torch-free. The numbers come from each run's summary.json, or, for a run that has not finished,
from its metrics.jsonl through `conf.run_dir.outcomes.outcomes_from_rows`, the same numbers summary.json
is written from. A run's state is a `conf.run_dir.run_states.RunState` word, as `meshrun status` says it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from conf.errors import ConfigError, ProblemList
from conf.eval_tasks import ROW_KIND as TASK_EVAL_KIND
from conf.run_dir.outcomes import outcomes_from_rows
from conf.run_dir.paths import RunDir
from conf.run_dir.run_states import RunState
from launcher.views.run_status import run_status
from sweeps.state import POINTS_FILE
IGNORED_KEYS = ("name", "runs_dir", "data.train_files", "data.val_files", "data.cache_dir",
                "checkpoint.resume_from")
"""Config keys that differ between runs without meaning anything (paths, the run's own name)."""
IGNORED_PREFIXES = ("host.",)
DERIVED_KEYS = ("logging.wandb_tags", "logging.wandb_group")
"""Keys a sweep derives from the varied values (tags `key=value`, the group): never a difference
of their own. Auto values (-1, e.g. schedule.warmup_steps) are compared as the user gave them
(config.yaml, before resolve), so one that resolves differently per run is no difference."""
OUTCOMES = ("final_val_loss", "best_val_loss", "final_loss", "tokens_per_s", "mfu",
            "peak_flops", "peak_mem_gib", "steps_done", "wall_s")
"""Outcome columns, in table order (the names summary.json uses)."""
LABEL_COLUMNS = ("run", "state")
FILTER_OPS = ("<=", ">=", "!=", "=", "<", ">")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """One run as the comparison sees it; `config` is the flattened spec.json (dotted keys),
    `asked` the flattened config.yaml: what the user composed, autos not yet filled."""

    name: str
    run_dir: Path
    state: RunState
    config: dict = field(default_factory=dict)
    asked: dict = field(default_factory=dict)
    outcomes: dict = field(default_factory=dict)
    overrides: tuple = ()
    train_curve: tuple = ()
    """(step, loss) per logged train step."""
    val_curve: tuple = ()
    """(step, val_loss) per eval."""
    evals: dict = field(default_factory=dict)
    """The newest value of each eval task metric (`eval/<task>/acc`, conf/eval_tasks.py)."""

    def value(self, key: str) -> object:
        """A column's value: run, state, an outcome or a dotted config key; None when absent."""
        if key == "run":
            return self.name
        if key == "state":
            return self.state
        if key in OUTCOMES:
            return self.outcomes.get(key)
        if key in self.evals:
            return self.evals[key]
        return self.config.get(key)


# --- collecting runs -------------------------------------------------------------------------

def collect_runs(*, paths: list[Path]) -> list[RunRecord]:
    """Records for sweep dirs (their points), run dirs, or folders of run dirs, in order given."""
    records: list[RunRecord] = []
    for path in paths:
        path = Path(path)
        if (path / POINTS_FILE).is_file():
            records += [_point_record(point=p, sweep_dir=path) for p in read_points(sweep_dir=path)]
        elif path.is_dir() and not RunDir(path).spec_file.exists() and _child_run_dirs(path):
            records += [load_run(run_dir=d, name=d.name) for d in _child_run_dirs(path)]
        else:
            records.append(load_run(run_dir=path, name=path.name or str(path)))
    return records


def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / POINTS_FILE).is_file()


def read_points(*, sweep_dir: Path) -> list[dict]:
    points = json.loads((sweep_dir / POINTS_FILE).read_text())
    return points["points"] if isinstance(points, dict) else points


def _point_record(*, point: dict, sweep_dir: Path) -> RunRecord:
    name = str(point.get("name", "?"))
    if not point.get("run_dir"):
        return RunRecord(name=name, run_dir=sweep_dir, state=RunState.pending,
                         overrides=tuple(point.get("overrides", ())))
    run_dir = Path(point["run_dir"])
    run_dir = run_dir if run_dir.is_absolute() else sweep_dir / run_dir
    record = load_run(run_dir=run_dir, name=name)
    if not record.overrides and point.get("overrides"):
        return replace(record, overrides=tuple(point["overrides"]))
    return record


def _child_run_dirs(path: Path) -> list[Path]:
    return sorted(d for d in path.iterdir() if RunDir(d).is_run_dir)


def load_run(*, run_dir: Path, name: str) -> RunRecord:
    """A run dir as a record; a missing or unreadable one becomes a record with that state."""
    rd = RunDir(run_dir)
    if not rd.is_run_dir:  # no run dir there, or a folder without spec.json
        return RunRecord(name=name, run_dir=run_dir, state=RunState.missing)
    try:
        config = flatten(json.loads(rd.spec_file.read_text()))
    except (OSError, ValueError):
        return RunRecord(name=name, run_dir=run_dir, state=RunState.unknown)
    rows = rd.read_rows()
    return RunRecord(name=name, run_dir=run_dir, state=run_state(run_dir=run_dir),
                     config=config, asked=_asked(rd), outcomes=run_outcomes(run_dir=run_dir),
                     overrides=_overrides(run_dir),
                     train_curve=_curve(rows, kind="train", key="loss"),
                     val_curve=_curve(rows, kind="eval", key="val_loss"),
                     evals=task_evals(rows))


def run_state(*, run_dir: Path) -> RunState:
    """The run's state as `meshrun status` says it (unknown when that cannot be read)."""
    if RunDir(run_dir).summary_file.is_file():
        return RunState.completed
    try:
        return RunState(run_status(run_dir)["state"])
    except (RuntimeError, OSError, ValueError, ConfigError):  # no sacct; a line being written
        return RunState.unknown


def run_outcomes(*, run_dir: Path) -> dict:
    """From summary.json, else from metrics.jsonl as summary.json would have them."""
    rd = RunDir(run_dir)
    try:
        summary = rd.read_summary()
        if summary is None:
            summary = outcomes_from_rows(rd.read_rows())
    except ValueError:  # a metrics line half written while we read
        summary = {}
    return {key: summary.get(key) for key in OUTCOMES}


def _asked(rd: RunDir) -> dict:
    """config.yaml flattened ({} when missing or unreadable: the spec is compared instead)."""
    import yaml

    try:
        tree = yaml.safe_load(rd.config_file.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return flatten(tree) if isinstance(tree, dict) else {}


def _overrides(run_dir: Path) -> tuple:
    rd = RunDir(run_dir)
    return tuple(rd.read_overrides()) if rd.overrides_file.is_file() else ()


def task_evals(rows: list[dict]) -> dict:
    """The newest value of each eval task metric in a run's task_eval rows."""
    found = {}
    for row in rows:
        if row.get("kind") == TASK_EVAL_KIND:
            found.update({k: v for k, v in row.items() if k.startswith("eval/")})
    return found


def eval_columns(records: list[RunRecord]) -> list[str]:
    """One column per eval task metric any run has (n, the documents scored, left out)."""
    return sorted({k for r in records for k in r.evals if not k.endswith("/n")})


def _curve(rows: list[dict], *, kind: str, key: str) -> tuple:
    return tuple((r["step"], r[key]) for r in rows
                 if r.get("kind") == kind and isinstance(r.get(key), (int, float)))


# --- config diff -----------------------------------------------------------------------------

def flatten(tree: dict, *, prefix: str = "") -> dict:
    """{"optim": {"lr": 1e-3}} -> {"optim.lr": 1e-3}; lists stay values; an empty dict is a value."""
    flat: dict = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, prefix=f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def differing_keys(records: list[RunRecord]) -> list[str]:
    """Config keys the user gave different values across the runs that have a config: compared
    before resolution (config.yaml), so derived and auto-filled values are not differences."""
    configs = [r.asked or r.config for r in records if r.config]
    keys = sorted({k for c in configs for k in c}, key=_key_order(configs))
    return [k for k in keys if not _ignored(k)
            and len({_canonical(c.get(k, "<absent>")) for c in configs}) > 1]


def _key_order(configs: list[dict]):
    order: dict = {}
    for config in configs:
        for key in config:
            order.setdefault(key, len(order))
    return lambda key: order[key]


def _ignored(key: str) -> bool:
    return key in IGNORED_KEYS or key in DERIVED_KEYS or key.startswith(IGNORED_PREFIXES)


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True)


# --- filter and sort -------------------------------------------------------------------------

def select_runs(records: list[RunRecord], *, filters: list[str], sort: str) -> list[RunRecord]:
    """Keep the runs matching every filter, then sort; every bad filter or sort reported at once.

    Filters: KEY=VALUE and KEY!=VALUE compare the string form (true/false, JSON for lists), or
    equal numbers (optim.lr=1e-3 matches 0.001); KEY<N, KEY<=N, KEY>N, KEY>=N compare numbers,
    and a run without a number there fails them. Sort: a column, `-column` for descending;
    runs without a value go last either way. KEY is any column or dotted config key.
    """
    known = _known_columns(records)
    problems = ProblemList()
    parsed = [_parse_filter(text, known=known, problems=problems) for text in filters]
    if sort and known and sort.lstrip("-") not in known:
        problems.add("--sort", sort, f"no column {sort.lstrip('-')!r}", _COLUMN_HINT)
    problems.raise_if_any("Cannot compare")
    kept = [r for r in records if all(_matches(r.value(k), op, v) for k, op, v in parsed)]
    return _sorted(kept, key=sort.lstrip("-"), descending=sort.startswith("-")) if sort else kept


_COLUMN_HINT = ("use run, state, " + ", ".join(OUTCOMES)
                + " or a dotted config key such as optim.lr")


def _parse_filter(text: str, *, known: set, problems: ProblemList) -> tuple[str, str, str]:
    for op in FILTER_OPS:
        key, sep, value = text.partition(op)
        if sep and key.strip():
            key, value = key.strip(), value.strip()
            if known and key not in known:
                problems.add("--filter", text, f"no column {key!r}", _COLUMN_HINT)
            if op in ("<", ">", "<=", ">=") and _number(value) is None:
                problems.add("--filter", text, f"{op} needs a number", f"e.g. '{key}{op}0.5'")
            return key, op, value
    problems.add("--filter", text, "is not KEY=VALUE, KEY!=VALUE, KEY<N or KEY>N",
                 "e.g. --filter optim.lr=1e-3 --filter 'mfu>0.3'")
    return "", "=", ""


def _matches(cell: object, op: str, wanted: str) -> bool:
    if op in ("=", "!="):
        equal = display(cell) == wanted or (
            _number(cell) is not None and _number(cell) == _number(wanted))
        return equal if op == "=" else not equal
    have, limit = _number(cell), _number(wanted)
    if have is None:
        return False
    return {"<": have < limit, ">": have > limit, "<=": have <= limit, ">=": have >= limit}[op]


def _sorted(records: list[RunRecord], *, key: str, descending: bool) -> list[RunRecord]:
    present = [r for r in records if r.value(key) is not None]
    absent = [r for r in records if r.value(key) is None]
    return sorted(present, key=lambda r: _sort_key(r.value(key)), reverse=descending) + absent


def _sort_key(value: object) -> tuple:
    number = _number(value)
    return (0, number, "") if number is not None else (1, 0.0, display(value))


def _known_columns(records: list[RunRecord]) -> set:
    return {*LABEL_COLUMNS, *OUTCOMES, *eval_columns(records),
            *(k for r in records for k in r.config)}


# --- rows --------------------------------------------------------------------------------------

def table_columns(keys: list[str], records: list[RunRecord] = ()) -> list[str]:
    return [*LABEL_COLUMNS, *keys, *OUTCOMES, *eval_columns(list(records))]


def table_rows(records: list[RunRecord], *, keys: list[str]) -> list[dict]:
    """One plain dict per run: label columns, the differing keys, the outcomes, the eval task
    metrics, the run dir."""
    columns = table_columns(keys, records)
    return [{**{c: r.value(c) for c in columns}, "run_dir": str(r.run_dir)} for r in records]


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if not math.isnan(value) else None
    try:
        return float(str(value))
    except ValueError:
        return None


def display(value: object) -> str:
    """The string form filters match against and CSV writes (true/false, JSON for lists)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def best_run(records: list[RunRecord]) -> RunRecord | None:
    """The run with the lowest best validation loss, if any has one."""
    scored = [r for r in records if _number(r.outcomes.get("best_val_loss")) is not None]
    return min(scored, key=lambda r: r.outcomes["best_val_loss"]) if scored else None
