"""The node agents' leg files (launcher/backends/node_legs.py): which status a leg ends with,
which failure the restart rules see, one hang claim, decisions read back."""
from __future__ import annotations

from launcher.backends.node_legs import (HUNG_STATUS, Decision, NodeEnd, NodeLegs,
                                         leg_failure, leg_status)


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
