"""`meshrun plan --calibrate RUN_DIR...`: fit the step-time model to measured runs, print the
prediction error per run, store the constants (parallel.cost.calibrate_store) for later plans.

Each RUN_DIR contributes its preflight.json bandwidth table (the link its ranks used) and,
when it has train rows in metrics.jsonl, its median step time. Runs are grouped by device
(one calibration entry each); a device's links are fitted first, then its compute (the
large-matmul efficiency, the per-block and per-collective overheads, the GEMM knee
matmul_knee_us). A MoE run's routing metrics give its device's ep_imbalance (the max of the
busiest expert's load over the mean past warm-up: parallel.cost.routing_fit says why), which
the compute fit and later plans of the device use unless parallel.ep_imbalance is set; dense
runs fit none and keep what is stored. A CUDA run's memory peaks give its device's
reserved_ratio (the caching allocator's reserved peak over the allocated one, the max over the
device's runs: parallel.cost.allocator_reserve), which later plans' reserved figure uses unless
cluster.reserved_ratio is set; runs that logged no such peaks (CPU) fit none. Every run is
read before anything is stored.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console

from conf.errors import ConfigError, Problem
from conf.run_dir.paths import RunDir
from launcher.output_file import check_output_file
from parallel.cost.allocator_reserve import FITTED_KEY as RESERVE_KEY
from parallel.cost.allocator_reserve import read_reserved_ratio
from parallel.cost.calibrate import COMPUTE_CONSTANTS, Sample, calibrate, read_run
from parallel.cost.calibrate_store import default_path, device_key, read_file, store_entry
from parallel.cost.routing_fit import FITTED_KEY, read_imbalance

KEY = "--calibrate"


def run_calibrate(paths: list[Path], *, out: Path | None, console: Console) -> int:
    """Fit, print and store; a path that gives nothing to fit raises ConfigError (exit 2)."""
    samples, preflights, imbalances, reserves = _read(paths)
    target = out or default_path()
    check_output_file("--out" if out else "calibration file", target, make_folder=True)
    devices = sorted({device_key(s.spec) for s in samples} | set(preflights))
    for device in devices:
        mine = [s for s in samples if device_key(s.spec) == device]
        base = _stored_links(target, device)
        if device in imbalances:
            base[FITTED_KEY] = imbalances[device]
        if device in reserves:
            base[RESERVE_KEY] = reserves[device]
        try:
            result = calibrate(mine, preflights=preflights.get(device, []), base=base,
                               device=device)
        except ValueError as error:
            raise ConfigError([Problem(KEY, " ".join(map(str, paths)), str(error),
                                       "give finished runs with metrics.jsonl")]) from None
        stored = {**result.constants, "runs": len(mine),
                  "median_abs_error": result.median_abs_error}
        store_entry(target, device, stored)
        _print(console, device, result, target)
    return 0


def _read(paths: list[Path]) -> tuple[list[Sample], dict[str, list[dict]], dict[str, float],
                                      dict[str, float]]:
    """The runs' samples, preflight tables by device, fitted ep_imbalance by device (the max
    over the device's MoE runs) and fitted reserved_ratio by device (the max over its runs
    that logged memory peaks); every problem of every path in one ConfigError."""
    samples, preflights, imbalances, reserves, problems = [], {}, {}, {}, []
    for path in paths:
        rd = RunDir(path)
        if not Path(path).is_dir() or not rd.spec_file.exists():
            problems.append(Problem(KEY, path, "is not a run dir (no spec.json)",
                                    "give run dirs made by `meshrun run` or `meshrun preflight`"))
            continue
        found = False
        report = _preflight_report(rd)
        if report is not None:
            if len(report.get("bandwidth", [])) >= 2 and report.get("world_size", 1) >= 2:
                key = device_key(rd.read_spec())
                preflights.setdefault(key, []).append(report)
                found = True
        why = ""
        try:
            samples.append(read_run(path))
            found = True
        except ValueError as error:
            why = str(error).removeprefix(f"{path}: ")
        else:
            _read_routing(path, samples[-1], imbalances, problems)
            _max_into(reserves, device_key(samples[-1].spec), read_reserved_ratio(path))
        if not found:
            problems.append(Problem(KEY, path, f"has no step times to fit ({why}) and no "
                                    "preflight bandwidth table of 2+ ranks",
                                    "let the run take a few steps, or run `meshrun preflight`"))
    if problems:
        raise ConfigError(problems, title="Cannot calibrate")
    return samples, preflights, imbalances, reserves


def _max_into(fitted: dict[str, float], device: str, value: float | None) -> None:
    """`fitted[device]` becomes the larger of itself and `value` (None: nothing fitted)."""
    if value is not None:
        fitted[device] = max(value, fitted.get(device, value))


def _read_routing(path: Path, sample: Sample, imbalances: dict[str, float],
                  problems: list[Problem]) -> None:
    """A MoE run's fitted imbalance into `imbalances` (max per device); a problem when its
    routing metrics are missing or not finite; nothing for a dense run."""
    try:
        value = read_imbalance(path)
    except ValueError as error:
        problems.append(Problem(KEY, path, str(error).removeprefix(f"{path}: "),
                                "give MoE runs that logged routing metrics (training.log_every "
                                "> 0, a few steps past warm-up)"))
        return
    _max_into(imbalances, device_key(sample.spec), value)


def _preflight_report(rd: RunDir) -> dict | None:
    """preflight.json when it is there and a JSON object of bandwidth rows; else None (the
    run still counts by its step times)."""
    try:
        report = json.loads(rd.preflight_file.read_text())
    except (OSError, ValueError):
        return None
    rows = report.get("bandwidth") if isinstance(report, dict) else None
    if not isinstance(rows, list) or not all(_bandwidth_row(r) for r in rows):
        return None
    return report


def _bandwidth_row(row: object) -> bool:
    return isinstance(row, dict) and all(
        isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)
        and math.isfinite(row[k]) and row[k] > 0 for k in ("size_bytes", "time_ms"))


def _stored_links(path: Path, device: str) -> dict:
    """The stored entry of `device` without its compute constants (refitted each time)."""
    if not path.exists():
        return {}
    entry = read_file(path, key="calibration file")["devices"].get(device, {})
    return {k: v for k, v in entry.items()
            if k not in (*COMPUTE_CONSTANTS, "runs", "median_abs_error")}


def _print(console: Console, device: str, result, target: Path) -> None:
    print(f"calibration for {device} -> {target}")
    for key, value in sorted(result.constants.items()):
        print(f"  {key} = {value:.4g}")
    if result.errors:
        print(f"  {'run':30} {'measured s':>11} {'predicted s':>11} {'error':>7}")
        for name, (measured, predicted) in result.errors.items():
            print(f"  {name[:30]:30} {measured:>11.4f} {predicted:>11.4f} "
                  f"{predicted / measured - 1:>+7.1%}")
        print(f"  median absolute error {result.median_abs_error:.1%}")
