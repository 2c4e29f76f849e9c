"""Waiting on Slurm jobs: one sacct call for all the jobs watched, its rows read back per job
(pending array tasks share one `123_[0-3%2]` row), and polls that grow apart."""
from __future__ import annotations

import itertools

import pytest

from conf.errors import ConfigError
from launcher.backends.slurm_state import POLL_MOST_ENV, parse_sacct, poll_intervals, sacct_command

SACCT = """\
101|COMPLETED|0:0|00:00:12|n1
102|CANCELLED by 0|0:15|00:00:03|n2
103_0|RUNNING|0:0|00:00:05|n1,n2
103_[1-2,5%2]|PENDING|0:0|00:00:00|None assigned
104|FAILED|1:0|00:00:01|n1
104|COMPLETED|0:0|00:00:09|n1
"""


def test_one_sacct_call_names_every_job():
    cmd = sacct_command(["101", "103_0", "103_2"])
    assert cmd[:3] == ["sacct", "-j", "101,103_0,103_2"] and "-X" in cmd and "-P" in cmd
    assert cmd[-1] == "--format=JobID,State,ExitCode,Elapsed,NodeList"


def test_rows_read_back_per_job():
    asked = ["101", "102", "103_0", "103_1", "103_2", "103_5", "103_3", "104", "105"]
    got = {j: s.state for j, s in parse_sacct(SACCT, asked).items()}
    assert got == {"101": "COMPLETED", "102": "CANCELLED", "103_0": "RUNNING",
                   "103_1": "PENDING", "103_2": "PENDING", "103_5": "PENDING",
                   "103_3": "PENDING",  # outside the row's ranges: no record yet, so pending
                   "104": "COMPLETED",  # the last row of a requeued job
                   "105": "PENDING"}
    state = parse_sacct(SACCT, ["103_0"])["103_0"]
    assert (state.exit_code, state.elapsed, state.nodes) == ("0:0", "00:00:05", "n1,n2")
    assert not parse_sacct(SACCT, ["101"])["101"].active


def test_array_row_ranges_hold_only_their_tasks():
    row = "7_[0,3-4%1]|PENDING|0:0|00:00:00|\n7_1|FAILED|1:0|00:00:01|n1\n"
    got = {j: s.state for j, s in parse_sacct(row, ["7_0", "7_1", "7_2", "7_4", "70_3"]).items()}
    assert got == {"7_0": "PENDING", "7_1": "FAILED", "7_2": "PENDING", "7_4": "PENDING",
                   "70_3": "PENDING"}
    running = "7_[2-3]|RUNNING|0:0|00:00:00|\n"  # a word other than PENDING tells them apart
    got = {j: s.state for j, s in parse_sacct(running, ["7_1", "7_2", "7_3", "7_4"]).items()}
    assert got == {"7_1": "PENDING", "7_2": "RUNNING", "7_3": "RUNNING", "7_4": "PENDING"}


def test_polls_grow_apart_up_to_a_most(monkeypatch):
    monkeypatch.delenv(POLL_MOST_ENV, raising=False)  # the Slurm tests' session lowers it
    waits = list(itertools.islice(poll_intervals(), 20))
    assert waits[:4] == pytest.approx([2.0, 2.4, 2.88, 3.456])
    assert waits[-1] == 30.0 and max(waits) == 30.0
    assert all(b >= a for a, b in zip(waits, waits[1:]))
    assert list(itertools.islice(poll_intervals(first_s=1, most_s=2, growth=3), 3)) == [1, 2, 2]


def test_the_longest_poll_wait_can_be_lowered_by_environment(monkeypatch):
    monkeypatch.setenv(POLL_MOST_ENV, "1")
    assert list(itertools.islice(poll_intervals(), 3)) == [1.0, 1.0, 1.0]  # first wait capped too
    monkeypatch.setenv(POLL_MOST_ENV, "5")
    assert list(itertools.islice(poll_intervals(), 12))[-1] == 5.0
    for bad in ("0", "-1", "31", "soon"):
        monkeypatch.setenv(POLL_MOST_ENV, bad)
        with pytest.raises(ConfigError, match=f"{POLL_MOST_ENV}={bad}: must be seconds in"):
            poll_intervals().__next__()
    monkeypatch.delenv(POLL_MOST_ENV)
    assert max(itertools.islice(poll_intervals(), 30)) == 30.0
