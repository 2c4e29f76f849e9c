"""failure_tail shows the log of the rank that failed first, not a peer's collateral error."""
from __future__ import annotations

from conf.run_dir.failure_diagnosis import failure_tail, first_failure
from conf.run_dir.paths import RunDir

def entry(rank: int, exitcode: str, traceback: str) -> str:
    """One failure as torchrun's error summary lists it."""
    return (f"  time      : 2026-12-01_03:44:30\n  host      : localhost\n"
            f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {exitcode}\n"
            f"  error_file: <N/A>\n  traceback : {traceback}\n")


def summary(listed: str, root: str) -> str:
    """torchrun's error summary: the other failures, then its root cause (the earliest)."""
    return (f"\nFailures:\n[1]:\n{listed}{'-' * 60}\n"
            f"Root Cause (first observed failure):\n[0]:\n{root}{'=' * 60}\n")


SIGKILLED = entry(1, "-9 (pid: 9426)  (SIGKILL)", "Signal 9 (SIGKILL) received by PID 9426")
SUMMARY = summary(entry(0, "1 (pid: 9425)", "RuntimeError: Connection closed by peer"),
                  SIGKILLED)


def write_logs(tmp_path, torchrun: str | None) -> RunDir:
    rd = RunDir(tmp_path)
    rd.logs_dir.mkdir()
    rd.rank_log(0).write_text("step 1\nTraceback (most recent call last):\n"
                              "RuntimeError: [pair.cc:537] Connection closed by peer\n")
    rd.rank_log(1).write_text("step 1\nstep 2\n")
    if torchrun is not None:
        rd.torchrun_log.write_text(torchrun)
    return rd


def test_torchruns_first_failure_wins_over_a_peer_traceback(tmp_path):
    write_logs(tmp_path, "an older leg\n" + SUMMARY)
    assert first_failure(tmp_path) == (1, -9, "SIGKILL")
    text = failure_tail(tmp_path)
    assert text.startswith("rank 1 failed first (killed by SIGKILL, says torchrun)")
    assert "rank1.log" in text and "Connection closed" not in text


def test_without_torchrun_a_peer_death_error_ranks_last(tmp_path):
    rd = write_logs(tmp_path, None)
    rd.rank_log(1).write_text("Traceback (most recent call last):\nValueError: bad token\n")
    assert "rank1.log" in failure_tail(tmp_path)


def test_an_exit_code_failure_is_reported_as_such(tmp_path):
    write_logs(tmp_path, SUMMARY.replace("-9 (pid: 9426)  (SIGKILL)", "1 (pid: 9426)"))
    assert failure_tail(tmp_path).startswith("rank 1 failed first (exit code 1, says torchrun)")


def test_a_survivors_earlier_stamp_does_not_make_it_the_root_cause(tmp_path):
    """torchrun stamps a survivor's error file before it notices the SIGKILLed peer (seen in
    CI): its "Root Cause" then names the survivor, whose log says the peer reset the
    connection; the listed SIGKILLed rank is the one that failed first."""
    swapped = summary(SIGKILLED, entry(0, "-15 (pid: 9425)  (SIGTERM)",
                                       "Traceback (most recent call last):"))
    write_logs(tmp_path, "an older leg\n" + swapped)
    assert first_failure(tmp_path) == (1, -9, "SIGKILL")
    assert failure_tail(tmp_path).startswith("rank 1 failed first (killed by SIGKILL")
    rd = RunDir(tmp_path)  # a root cause whose own log holds no peer's death stays the root
    rd.rank_log(0).write_text("Traceback (most recent call last):\nValueError: bad batch\n")
    assert first_failure(tmp_path) == (0, -15, "SIGTERM")
