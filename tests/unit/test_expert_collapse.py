"""A run whose experts collapsed is named by `meshrun status` (conf/run_dir/expert_collapse.py):
one expert taking most tokens of a block at every one of the latest logged steps; a short
spell, a balanced block, or too few steps name nothing."""
from __future__ import annotations

from conf.run_dir.expert_collapse import COLLAPSE_ROWS, collapse_lines, collapsed_blocks
from conf.run_dir.run_states import RunState
from launcher.views.run_status import progress_notes


def rows(shares_l1: list[float], share_l2: float = 0.3) -> list[dict]:
    return [{"kind": "train", "step": 10 * (i + 1), "moe_l1_max_expert_share": s,
             "moe_l2_max_expert_share": share_l2} for i, s in enumerate(shares_l1)]


def test_a_block_collapsed_for_the_latest_steps_is_named(tmp_path):
    history = rows([0.4] * 5 + [0.97] * COLLAPSE_ROWS)
    assert collapsed_blocks(history) == {1: (60, 150)}
    notes = progress_notes(tmp_path, history, RunState.paused)
    assert notes["expert_collapse"] == collapse_lines(history)
    assert "block 1" in notes["expert_collapse"][0]
    assert "aux_loss_coef" in notes["expert_collapse"][0]


def test_a_short_spell_or_a_recovery_names_nothing():
    assert collapsed_blocks(rows([0.97] * (COLLAPSE_ROWS - 1))) == {}
    assert collapsed_blocks(rows([0.97] * COLLAPSE_ROWS + [0.5])) == {}
    assert collapsed_blocks([{"kind": "train", "step": i, "loss": 1.0} for i in range(20)]) == {}


def test_the_end_of_run_table_shows_the_latest_routing():
    from conf.run_dir.expert_collapse import routing_summary

    row = {"kind": "train", "step": 8, "moe_load_max_mean": 1.5, "moe_max_expert_share": 0.75,
           "moe_dropped_frac": 0.02, "moe_aux_loss": 2.01, "moe_z_loss": 1.9}
    assert routing_summary([row, {"kind": "eval", "step": 8}]) == (
        "step 8: busiest expert 1.50x the mean (75% of tokens), dropped 2.0%, balancing loss "
        "2.0100, z-loss 1.9000")
    assert routing_summary([{"kind": "train", "step": 1, "loss": 2.0}]) == ""
