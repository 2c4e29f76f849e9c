"""Fit the step-time model's constants to measured runs. Torch-free.

Two fits, each from what a measurement can identify:
- links, from a preflight bandwidth table (all-reduce of S bytes over n ranks takes
  t = 2(n-1) alpha + 2(n-1)/n S / B): a least-squares line of t over S gives B (slope) and
  alpha (intercept), in relative error (so the small messages set alpha and one slow large
  message does not swamp it); the link is intra-node when every rank ran on one host, else inter-node;
- compute, from finished runs' step times: with the links' alpha and beta fixed, each run's
  time is measured = x * A + y * P + z * T + w * K + C, x = 1 / matmul_efficiency, y = layer
  overhead (s), z = tensor-parallel overhead (s), w = the software cost of one collective
  call (s), A = the compute's GEMM and attention FLOPs (bubble included) at efficiency 1,
  P = the block passes (bubble included), T = P for runs with tp > 1 (else 0), K = the exposed collective calls (each
  stretched by 1 / core share on CPU), C = the alpha-beta communication, the compute the
  efficiency does not scale (each GEMM's knee, memory-bound work: compute_time.py), the
  optimizer step
  (memory traffic and per-tensor cost, step_time.py) and activation offload's copies;
  (x, y, z, w) minimise the squared relative error over the runs (an overhead the runs cannot
  identify, or that would come out negative, is 0). One constant per mechanism, the same for
  every layout. The optimizer's per-tensor cost is not fitted: on a loaded machine the fit
  used it to absorb the waits of ranks that are not scheduled together (650 us a tensor where
  the update measures 34 us, with the matmul efficiency pinned at 1); it comes from the knob,
  a stored calibration or step_time.DEFAULT_UPDATE_OVERHEAD_US. The overlap rule makes C
  and K depend on x, so the fit is repeated a few times.
  The GEMM knee (matmul_knee_us, parallel.cost.matmul_rate) enters C, not linearly: the fit
  above runs for each of KNEE_CANDIDATES_US (and the knee it started from) and keeps the knee
  whose fit has the least weighted squared relative error -- a knee the runs cannot tell from
  the per-block overhead stays where it was (the first of equal errors wins).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from conf.run_dir.metrics_rows import read_metrics_rows
from conf.run_dir.paths import RunDir
from conf.spec import RunSpec
from parallel.cost.plan import Plan, make_plan
from parallel.cost.step_time import (Hardware, block_passes, bubble_factor, estimate_time,
                                     hardware_of, step_parts)

FIT_ROUNDS = 4
COMPUTE_CONSTANTS = ("matmul_efficiency", "layer_overhead_us", "tp_overhead_us",
                     "collective_overhead_us", "matmul_knee_us")
KNEE_CANDIDATES_US = (0.0, 1.0, 3.0, 10.0, 30.0, 100.0)
"""The GEMM knees the run fit tries (module docstring): from none to a CPU-sized call cost."""
KNEE_TIE = 1e-10
"""Sums of squared relative errors closer than this are equal (the first knee tried wins)."""
"""What the run fit sets (the links come from preflight tables)."""
WARMUP_STEPS = 2
"""Train rows left out of a run's measured step time (compile, caches, allocator)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """One measured run: its spec and its median step time."""

    name: str
    spec: RunSpec
    measured_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    device: str
    constants: dict
    """cluster.* knob name -> fitted value (only the ones the measurements identified)."""
    errors: dict
    """sample name -> (measured s, predicted s) after the fit."""

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(p / m - 1) for m, p in self.errors.values()) \
            if self.errors else 0.0


def fit_link(rows: list[dict], *, world_size: int) -> tuple[float, float]:
    """(GB/s, latency us) from all-reduce timings {size_bytes, time_ms} over `world_size`."""
    if world_size < 2 or len(rows) < 2:
        raise ValueError("a bandwidth fit needs 2 or more ranks and 2 or more message sizes")
    n = world_size
    sizes = [float(r["size_bytes"]) for r in rows]
    times = [float(r["time_ms"]) * 1e-3 for r in rows]
    fit = _weighted_lstsq([[1.0, size] for size in sizes], times, [1 / t for t in times])
    intercept, slope = fit if fit is not None else (0.0, 0.0)
    if slope <= 0:
        raise ValueError("the bandwidth table's times do not grow with the message size")
    gbps = 2 * (n - 1) / n / slope / 1e9
    return gbps, max(0.0, intercept / (2 * (n - 1))) * 1e6


def link_constants(report: dict) -> dict:
    """cluster.* constants a preflight.json identifies (its link's bandwidth and latency)."""
    gbps, latency_us = fit_link(report["bandwidth"], world_size=report["world_size"])
    where = "intra_node" if len(report.get("ranks_by_host", {})) <= 1 else "inter_node"
    return {f"{where}_gbps": gbps, f"{where}_latency_us": latency_us}


def fit_compute(samples: list[Sample], *, base: dict) -> dict:
    """{matmul_efficiency, layer_overhead_us, tp_overhead_us, collective_overhead_us,
    matmul_knee_us} that best explain `samples` (module docstring), the other constants taken
    from `base` (a calibration entry)."""
    if not samples:
        raise ValueError("no measured runs to fit")
    plans = [make_plan(s.spec) for s in samples]
    start = base.get("matmul_knee_us")
    knees = ([start] if start is not None else []) + \
        [k for k in KNEE_CANDIDATES_US if k != start]
    best: tuple[float, dict] | None = None
    failure: ValueError | None = None
    for knee in knees:
        try:
            constants = _fit_at_knee(samples, plans, {**base, "matmul_knee_us": knee})
        except ValueError as error:
            failure = failure or error
            continue
        error = sum((predict(s.spec, constants) / s.measured_s - 1) ** 2 for s in samples)
        if best is None or error < best[0] - KNEE_TIE:
            best = (error, constants)
    if best is None:
        raise failure
    return {k: best[1][k] for k in COMPUTE_CONSTANTS}


def _fit_at_knee(samples: list[Sample], plans: list[Plan], base: dict) -> dict:
    constants = {**base, "matmul_efficiency": base.get("matmul_efficiency", 0.5),
                 "collective_overhead_us": base.get("collective_overhead_us", 0.0)}
    for _ in range(FIT_ROUNDS):
        rows = [_features(s.spec, plan, constants) for s, plan in zip(samples, plans)]
        x, y, z, w = _solve([(*cols, s.measured_s - c)
                             for (*cols, c), s in zip(rows, samples)],
                            [s.measured_s for s in samples])
        constants = {**constants, "matmul_efficiency": min(1.0, 1 / x),
                     "layer_overhead_us": y * 1e6, "tp_overhead_us": z * 1e6,
                     "collective_overhead_us": w * 1e6}
    return constants


def calibrate(samples: list[Sample], *, preflights: list[dict] = (), base: dict | None = None,
              device: str = "") -> Calibration:
    """Links from the preflight tables, then compute from the runs; errors per run."""
    constants = dict(base or {})
    for report in preflights:
        constants.update(link_constants(report))
    if samples:
        constants.update(fit_compute(samples, base=constants))
    bad = sorted(k for k, v in constants.items() if isinstance(v, float) and not math.isfinite(v))
    if bad:
        raise ValueError(f"the fit is degenerate ({', '.join(bad)} not finite): the runs do not "
                         "pin the constants down")
    errors = {s.name: (s.measured_s, predict(s.spec, constants)) for s in samples}
    return Calibration(device=device, constants=constants, errors=errors)


def predict(spec: RunSpec, constants: dict) -> float:
    """Predicted step time of `spec` under calibration `constants`."""
    return estimate_time(spec, make_plan(spec), hardware=_hardware(spec, constants)).step_s


def _hardware(spec: RunSpec, constants: dict) -> Hardware:
    hw = hardware_of(spec, calibration=constants)
    if hw is None:
        raise ValueError(f"no peak FLOP/s known for {spec.host.gpu_name!r}: set "
                         "cluster.peak_tflops")
    return hw


CALL_STEP_US = 1.0
"""The step (us) of the finite difference that counts a run's exposed collective calls."""


def _features(spec: RunSpec, plan: Plan, constants: dict) -> tuple[float, ...]:
    """(A, P, T, K, C) of the module docstring for one run under `constants`."""
    hw = _hardware(spec, constants)
    unit = replace(hw, matmul_efficiency=1.0, layer_overhead_s=0.0, tp_overhead_s=0.0)
    parts = step_parts(spec, plan, unit)
    stretch = 1 + bubble_factor(spec)
    passes = block_passes(spec) / hw.core_share * stretch
    fitted = step_parts(spec, plan, hw)
    call = constants["collective_overhead_us"]
    bump = {**constants, "collective_overhead_us": call + CALL_STEP_US}
    bumped = step_parts(spec, plan, _hardware(spec, bump))
    calls = (bumped.comm_exposed_s - fitted.comm_exposed_s) / (CALL_STEP_US * 1e-6)
    scaled = parts.compute_s - parts.compute_fixed_s
    return (scaled * stretch, passes, passes if spec.parallel.tp > 1 else 0.0, calls,
            fitted.comm_exposed_s - calls * call * 1e-6 + fitted.optimizer_s + fitted.offload_s
            + fitted.compute_fixed_s * stretch)


def _solve(rows: list[tuple[float, ...]], measured: list[float]) -> tuple[float, ...]:
    """Least squares of sum(col_j * u_j) = r (the last entry of a row), weighted by
    1/measured, with u_0 > 0 and the others >= 0: every subset of the other columns is
    fitted (a column left out has u = 0) and the feasible fit of least weighted squared
    error wins, so a column the runs cannot identify, or that would come out negative, is 0."""
    n = len(rows[0]) - 1
    others = [j for j in range(1, n) if any(row[j] for row in rows)]
    weights = [1 / m for m in measured]
    best: tuple[float, list[float]] | None = None
    for mask in range(1 << len(others)):
        active = [0] + [j for i, j in enumerate(others) if mask >> i & 1]
        u = _weighted_lstsq([[row[j] for j in active] for row in rows],
                            [row[-1] for row in rows], weights)
        if u is None or u[0] <= 0 or any(v < 0 for v in u[1:]):
            continue
        out = [0.0] * n
        for j, v in zip(active, u):
            out[j] = v
        error = sum(((sum(row[j] * out[j] for j in range(n)) - row[-1]) * w) ** 2
                    for row, w in zip(rows, weights))
        if best is None or error < best[0]:
            best = (error, out)
    if best is None:
        raise ValueError("the measured times are shorter than the model's communication "
                         "alone: the runs cannot fit a matmul efficiency")
    return tuple(best[1])


def _weighted_lstsq(a: list[list[float]], r: list[float], w: list[float]) -> list[float] | None:
    """Normal equations, solved by Gaussian elimination; None when singular."""
    k = len(a[0])
    m = [[sum(row[i] * row[j] * wi * wi for row, wi in zip(a, w)) for j in range(k)]
         + [sum(row[i] * ri * wi * wi for row, ri, wi in zip(a, r, w))] for i in range(k)]
    scale = max(abs(m[i][i]) for i in range(k)) or 1.0
    for col in range(k):
        pivot = max(range(col, k), key=lambda i: abs(m[i][col]))
        if abs(m[pivot][col]) <= 1e-12 * scale:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for i in range(k):
            if i != col:
                f = m[i][col] / m[col][col]
                m[i] = [a_ - f * b_ for a_, b_ in zip(m[i], m[col])]
    return [m[i][k] / m[i][i] for i in range(k)]


def _is_time(value: object) -> bool:
    """A measured step time: a finite number of seconds above zero (NaN, inf, 0 are not)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def read_run(run_dir: Path) -> Sample:
    """A finished (or running) run dir as a Sample: its spec and the median step_time_s of
    its train rows after WARMUP_STEPS. ValueError names what is missing."""
    rd = RunDir(run_dir)
    if not rd.spec_file.exists():
        raise ValueError(f"{run_dir}: not a run dir (no spec.json)")
    rows = [r for r in read_metrics_rows(rd.metrics_file)
            if r.get("kind") == "train" and "step_time_s" in r]
    times = [r["step_time_s"] for r in rows if _is_time(r["step_time_s"])]
    times = times[WARMUP_STEPS:] or times
    if not times:
        raise ValueError(f"{run_dir}: metrics.jsonl has no train rows with a finite, positive "
                         "step_time_s")
    return Sample(name=Path(run_dir).name, spec=rd.read_spec(),
                  measured_s=statistics.median(times))
