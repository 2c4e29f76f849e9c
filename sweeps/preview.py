"""What a sweep will cost, before it is submitted: a table of points and the totals.

Per point: world size, estimated memory per rank (and, on GPUs, whether it fits the device),
tokens, and estimated GPU-hours at an assumed MFU. Torch-free: it uses the cost model
(parallel.cost).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from conf.spec import RunSpec
from launcher.backends.choose import backend_for
from launcher.hardware import device_memory
from launcher.views.plan_view import gib, human
from parallel.cost.fit import Verdict
from parallel.cost.plan import make_plan
from parallel.cost.step_time import estimate_time
from sweeps.narrow_table import wrapped_header
from sweeps.validate import Checked

@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    world_size: int
    nodes: int
    mem_per_rank: int
    device_mem: float | None
    """Bytes of one device, None on CPU or for an unknown GPU."""
    tokens: int
    gpu_hours: float | None
    """None on CPU or for a GPU with no known peak."""
    verdict: Verdict
    """The verdict `meshrun plan` and the dry run print (parallel.cost.fit)."""

    @property
    def fits(self) -> bool | None:
        return self.verdict.fits


def point_cost(spec: RunSpec) -> Cost:
    cuda = spec.training.device == "cuda"
    device_mem = (device_memory(spec.host.gpu_name,
                                local=backend_for(spec.cluster).on_this_machine)
                  if cuda else None)
    plan = make_plan(spec, device_bytes=device_mem)
    estimate = estimate_time(spec, plan)
    hours = estimate.gpu_hours if estimate is not None else None
    return Cost(world_size=plan.world_size, nodes=spec.cluster.nodes,
                mem_per_rank=plan.memory.total, device_mem=device_mem,
                tokens=plan.total_tokens, gpu_hours=hours, verdict=plan.verdict)


def preview_table(checked: list[Checked], *, title: str, max_rows: int = 50) -> Table:
    """One row per point, sized for an 80-column terminal: no rules between columns, cells never
    wrapped (long axis names wrap in the header at their dots and underscores), the totals in
    the caption below."""
    costs = [point_cost(c.spec) for c in checked]
    keys = list(dict.fromkeys(k for c in checked for k in c.point.values))
    shorts = [k.split(".")[-1] for k in keys]
    headers = [s if shorts.count(s) == 1 else k for k, s in zip(keys, shorts)]
    show_fit = any(c.spec.training.device == "cuda" for c in checked)
    shown = checked if len(checked) <= max_rows else checked[:max_rows]
    rows = [[str(c.point.index), *[str(c.point.values.get(k, "")) for k in keys],
             _world_text(cost), _memory_text(cost), *([_fit_text(cost)] if show_fit else []),
             human(cost.tokens), _hours(cost.gpu_hours)]
            for c, cost in zip(shown, costs)]
    if len(checked) > len(shown):
        rows.append(["...", f"{len(checked) - len(shown)} more"])
    columns = ["#", *headers, "world", "GiB/rank", *(["fits"] if show_fit else []),
               "tokens", "GPU-h"]
    table = Table(title=title, title_justify="left", box=None, pad_edge=False,
                  collapse_padding=True, header_style="bold",
                  caption=_totals(checked, costs, show_fit), caption_justify="left")
    for i, name in enumerate(columns):
        width = max((len(row[i]) for row in rows if i < len(row)), default=1)
        table.add_column(wrapped_header(name, width), no_wrap=True, min_width=width,
                         justify="left" if 0 < i <= len(keys) else "right",
                         style="cyan" if 0 < i <= len(keys) else None)
    for row in rows:
        table.add_row(*row)
    return table


def _totals(checked: list[Checked], costs: list[Cost], show_fit: bool) -> str:
    hours = [c.gpu_hours for c in costs if c.gpu_hours is not None]
    parts = [f"{len(checked)} pts", f"max world {max(c.world_size for c in costs)}",
             f"max {gib(max(c.mem_per_rank for c in costs))}/rank"]
    if show_fit:
        parts.append(f"{sum(1 for c in costs if c.fits is False)} do not fit "
                     "(GiB/rank: need/usable)")
    parts += [f"{human(sum(c.tokens for c in costs))} tokens",
              f"{_hours(sum(hours)) if hours else '-'} GPU-h"]
    return "total: " + ", ".join(parts)


def _world_text(cost: Cost) -> str:
    return f"{cost.world_size}" + (f" ({cost.nodes}n)" if cost.nodes > 1 else "")


def _memory_text(cost: Cost) -> str:
    """Need per rank in GiB; on a known GPU `need/usable` (the verdict's terms: the margin at a
    glance)."""
    need = cost.mem_per_rank / 1024**3
    usable = cost.verdict.usable_bytes
    if usable is None:
        return f"{need:.2f}" if need < 10 else f"{need:.1f}"
    return f"{cost.verdict.need_bytes / 1024**3:.1f}/{usable / 1024**3:.1f}"


def _fit_text(cost: Cost) -> str:
    if cost.fits is None:
        return "?"
    return "yes" if cost.fits else "NO"


def _hours(h: float | None) -> str:
    if h is None:
        return "-"
    return f"{h:,.1f}" if h >= 1 else f"{h:.3f}"


def not_fitting(checked: list[Checked]) -> list[Checked]:
    return [c for c in checked if point_cost(c.spec).fits is False]


def confirm(question: str, *, yes: bool, console: Console) -> bool:
    """Ask y/N on stdin; --yes skips the question; no stdin (or EOF) counts as no."""
    if yes:
        return True
    console.print(f"{question} [y/N] ", end="", markup=False)
    try:
        answer = sys.stdin.readline() if sys.stdin is not None else ""
    except (OSError, ValueError):
        answer = ""
    if not answer:
        console.print("\nno answer on stdin: nothing submitted (pass --yes to skip the question)",
                      markup=False)
        return False
    return answer.strip().lower() in ("y", "yes")
