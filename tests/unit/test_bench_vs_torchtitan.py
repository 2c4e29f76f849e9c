"""benchmarks/vs_torchtitan.py's pure parts: the log parsers, the timed window and the table."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "vs_torchtitan.py"
_spec = importlib.util.spec_from_file_location("bench_vs_torchtitan", PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses look their module up there
_spec.loader.exec_module(bench)

TT_LOG = """\
[rank0]:[titan] 2026-12-01 03:36:01,112 - root - INFO - \x1b[31mstep:  1  \x1b[32mloss:  8.13824  grad_norm:  1.6474  memory:  0.70GiB(2.98%)  tps: 22  tflops: 0.00  mfu: 0.00%
[rank0]:[titan] ... - step:  2  loss:  7.83423  grad_norm:  1.8184  memory:  0.76GiB  tps: 1,000  tflops: 0.03
[rank1]:[titan] ... - step:  2  loss:  7.83423  grad_norm:  1.8184  memory:  0.76GiB  tps: 500  tflops: 0.03
"""
PLAIN_LOG = """shape: dim=256 ...
step   1  loss 7.7  grad_norm 1.000  step_time 3.000s  tps 341
step   2  loss 7.5  grad_norm 1.000  step_time 1.500s  tps 682
RESULT steps 1-2: mean step_time 2.250s
"""


def test_torchtitan_log_gives_the_slower_rank_per_step():
    times = bench.tt_step_times(TT_LOG, local_tokens=1000)
    assert times == {1: pytest.approx(1000 / 22), 2: pytest.approx(2.0)}


def test_plain_log_step_times():
    assert bench.plain_step_times(PLAIN_LOG) == {1: 3.0, 2: 1.5}


def test_only_the_timed_window_counts():
    b = bench.Bench(seq_len=4, batch=2, steps=4, first_timed=3, peer_src=Path("."),
                    peer_dir=Path("."), work=Path("."))
    assert bench.mean_step_s({1: 100.0, 2: 100.0, 3: 1.0, 4: 3.0, 5: 100.0}, b) == 2.0
    assert bench.mean_step_s({1: 1.0}, b) is None


def test_table_medians_and_ratios():
    results = {("torchtitan", 1): [100.0, 300.0, 200.0], ("meshrun", 1): [250.0],
               ("plain", 1): [500.0], ("torchtitan", 2): [], ("meshrun", 2): [400.0]}
    lines = bench.table(results, [1, 2]).splitlines()
    assert lines[1].split()[:6] == ["1", "200", "250", "500", "1.250", "0.500"]
    assert lines[2].split()[:6] == ["2", "-", "400", "500", "-", "0.800"]


def test_base_table_pairs_rounds_and_takes_the_median_ratio():
    results = {("meshrun", 2): [110.0, None, 90.0], ("meshrun-base", 2): [100.0, 80.0, 100.0],
               ("torchtitan", 2): [100.0, 100.0, 120.0]}
    lines = bench.base_table(results, [2]).splitlines()
    assert lines[1].split()[5:] == ["1.100", "1.100", "1.000"]
    assert lines[2].split()[5:] == ["-", "-", "0.800"]  # meshrun failed in round 2
    assert lines[3].split()[5:] == ["0.900", "0.750", "0.833"]
    assert lines[4].split()[2:] == ["1.000", "0.925", "0.833"]  # medians of 2, 2, 3 ratios


def test_one_rank_alone_rows():
    assert bench.parse_row("2") == 2 and bench.parse_row("1/2") == "1/2"
    for bad in ("1/1", "1/x", "1/"):
        with pytest.raises(ValueError, match="1/K"):
            bench.parse_row(bad)
    b = bench.Bench(seq_len=4, batch=8, steps=4, first_timed=3, peer_src=Path("."),
                    peer_dir=Path("."), work=Path("."), cores=4)
    assert bench.row_bench(b, 2) == (b, 2)
    alone, nproc = bench.row_bench(b, "1/2")
    assert (alone.batch, alone.cores, nproc) == (4, 2, 1)


def test_alone_row_has_its_own_plain_reference_and_share_ratio():
    results = {("torchtitan", 2): [200.0, 180.0], ("meshrun", 2): [190.0, 200.0],
               ("torchtitan", "1/2"): [100.0, 100.0], ("meshrun", "1/2"): [100.0, 125.0],
               ("plain", 1): [400.0], ("plain", "1/2"): [110.0, 90.0]}
    lines = bench.table(results, [2, "1/2"]).splitlines()
    assert lines[1].split()[:6] == ["2", "190", "195", "400", "1.026", "0.487"]
    assert lines[2].split()[:6] == ["1/2", "100", "112", "100", "1.125", "1.125"]
    shares = bench.share_table(results, [2, "1/2"]).splitlines()
    assert "= 0.950" in shares[0] and "1.000 0.900" in shares[0]  # torchtitan
    assert "= 0.875" in shares[1] and "0.950 0.800" in shares[1]  # meshrun
    assert bench.share_table(results, ["1/2"]) == ""  # no 2-process row to compare with
