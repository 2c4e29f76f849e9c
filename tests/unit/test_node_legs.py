"""The node agents' leg files (launcher/backends/node_legs.py): which status a leg ends with,
which failure the restart rules see, one hang claim, decisions read back."""
from __future__ import annotations

from launcher.backends.node_legs import (HUNG_STATUS, INTERRUPTED, Decision, NodeEnd,
                                         NodeLegs, leg_failure, leg_status)


def _end(node, status, stopped=None, cause="", t=0.0):
    return NodeEnd(node=node, status=status, stopped=stopped, cause=cause, time=t)


def test_the_node_that_failed_by_itself_names_the_failure(tmp_path):
    ends = [_end(0, 137, "peer", "stopped (peer)", t=1.0),
            _end(1, 1, None, "rank 1 killed by SIGKILL", t=2.0)]
    assert leg_status(ends) == 1
    assert leg_failure(tmp_path, ends).cause == "rank 1 killed by SIGKILL"
    assert leg_status([_end(0, 0), _end(1, 0)]) == 0


def test_a_hang_anywhere_makes_the_leg_hung(tmp_path):
    ends = [_end(0, 137, "peer", t=1.0), _end(1, HUNG_STATUS, "hang", t=0.5)]
    assert leg_status(ends) == HUNG_STATUS
    assert leg_failure(tmp_path, ends).cause == f"exit status {HUNG_STATUS}"


def test_ends_claims_and_decisions_go_through_the_run_dir(tmp_path):
    legs = NodeLegs(tmp_path, nodes=2)
    legs.record_end(0, _end(1, 1, cause="x"))
    assert legs.peer_failed(0, node=0) and not legs.peer_failed(0, node=1)
    assert legs.wait_decision(0, timeout_s=0.1) is None
    legs.decide(0, Decision(restart=True, status=1))
    assert NodeLegs(tmp_path, nodes=2).wait_decision(0, timeout_s=1) == Decision(True, 1)
    assert [legs.claim_hang(0), legs.claim_hang(0)] == [True, False]
    assert not list(legs.leg_dir(0).glob(".*tmp"))  # written atomically, nothing left over
    legs.forget()
    assert legs.ends(0) == []


def test_a_node_stopped_on_purpose_stops_its_peers_gently(tmp_path):
    legs = NodeLegs(tmp_path, nodes=2)
    legs.record_end(0, _end(0, INTERRUPTED, "stop", "stopped (stop)"))
    assert legs.peer_stopped(0, node=1) and not legs.peer_stopped(0, node=0)
    assert leg_status(legs.ends(0) + [_end(1, 1)]) == INTERRUPTED  # no restart follows


def test_an_agent_reads_no_leg_file_older_than_itself(tmp_path):
    """node 1's agent may start before node 0's removes the last launch's files."""
    earlier = NodeLegs(tmp_path, nodes=2)
    earlier.record_end(0, _end(0, INTERRUPTED, "stop"))
    earlier.decide(0, Decision(restart=False, status=INTERRUPTED))
    written = (earlier.leg_dir(0) / "node0.json").stat().st_mtime_ns
    decided = (earlier.leg_dir(0) / "decision.json").stat().st_mtime_ns
    later = NodeLegs(tmp_path, nodes=2, since_ns=max(written, decided) + 1)
    assert later.ends(0) == [] and not later.peer_stopped(0, node=1)
    assert later.wait_decision(0, timeout_s=0.1) is None
    assert NodeLegs(tmp_path, nodes=2, since_ns=written).ends(0) == earlier.ends(0)
