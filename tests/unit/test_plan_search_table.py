"""`meshrun plan --search`'s table at 80 columns (COLUMNS=80, as a pipe or a narrow terminal
renders it): no line wider, nothing cut with an ellipsis, every layout's words whole (the
layout cell wraps between them), every `why` printed whole below the table."""
from __future__ import annotations

import io

from rich.cells import cell_len
from rich.console import Console

from conf.compose import compose_config
from conf.resolve import resolve
from conf.spec import HostSpec
from launcher.plan.plan_search import layout_text, neutral_layout, print_search, recompute_policies
from parallel.cost.search import search

HOST = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=2)
WIDE = ["model=debug", "model.max_seq_len=4096", "training.seq_len=4096", "cluster=slurm",
        "cluster.nodes=2", "cluster.gpus_per_node=8", "cluster.gpu_name=H100",
        "cluster.gpu_compute_capability=9.0", "data=synthetic"]
"""16 GPUs: replicated and sharded dp, tp, pp with every schedule, cp, every recompute."""


def _layout_cells(lines: list[str]) -> list[str]:
    """The layout column of each row, its wrapped lines joined by spaces."""
    rows: list[list[str]] = []
    for line in lines:
        cells = line.split("│")
        if len(cells) < 4:
            continue
        if cells[1].strip():  # a row number starts a row
            rows.append([])
        rows[-1].append(cells[2].strip())
    return [" ".join(row) for row in rows]


def test_the_table_is_readable_at_80_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    cfg = compose_config(WIDE)
    base = resolve(neutral_layout(cfg), host=HOST, check_paths=False)
    policies = {name: policy for name, policy in recompute_policies().items()
                if name in ("none", "selective_attention")}  # the longest name
    result = search(cfg, base, global_batch_size=8, policies=policies, top=10_000)
    schedules = {r.candidate.parallel.pp_schedule for r in result.top}
    assert {"interleaved_zero_bubble", "looped_bfs", "gpipe"} <= schedules
    assert "selective_attention" in {r.candidate.recompute_name for r in result.top}
    assert any(r.candidate.parallel.dp_replicate > 1 for r in result.top)
    out = io.StringIO()
    console = Console(file=out)
    assert console.width == 80
    print_search(result, console, global_batch_size=8)
    lines = out.getvalue().splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    assert "…" not in out.getvalue()
    assert _layout_cells(lines) == [layout_text(r.candidate) for r in result.top]
    text = " ".join(line.strip() for line in lines)
    for i, r in enumerate(result.top):
        assert f"#{i + 1}: {r.why}" in text
