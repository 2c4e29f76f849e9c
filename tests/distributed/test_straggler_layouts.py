"""A rank slowed under zero3, tp, pp (1F1B) and cp is the one the straggler rule names, in
`meshrun status` and the summary, and the fast rank waits longer than the slow one: the wait
of every layout's collectives is measured (training/collective_waits.py), not counted as the
fast rank's compute. One spawn of 2 gloo ranks trains the four run dirs through the real loop
(tests/support/slowed_ranks.py sleeps before each forward of the slow rank's model parts)."""
from __future__ import annotations

import statistics

import pytest

from conf.run_dir.paths import RunDir
from conf.run_dir.stragglers import TIME_BY_RANK_KEY, stragglers
from launcher.views.run_status import run_status
from tests.support.loop_runs import prepare_run_dir
from tests.support.slowed_ranks import train_with_a_slow_rank
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec

pytestmark = [pytest.mark.distributed]

COMMON = ["model=tiny", "data=synthetic", "training.steps=8", "training.seq_len=32",
          "training.global_batch_size=2", "training.micro_batch_size=2",
          "training.grad_accum_steps=-1", "training.eval_every=0", "training.eval_batches=1",
          "checkpoint.every_steps=0", "checkpoint.export_safetensors=false",
          "cluster.procs_per_node=2",
          "training.cpu_peak_flops=1e11"]  # no CPU peak measured per run: MFU is not checked
LAYOUTS = {  # name: (overrides, the rank slowed)
    "zero3": (["parallel=zero3", "training.global_batch_size=4"], 1),
    "tp": (["parallel=tp"], 0),
    "pp_1f1b": (["parallel=pp", "parallel.pp_schedule=1f1b"], 0),
    "cp": (["parallel=cp"], 1),
}
SLEEP_S = 0.3
"""Per forward of the slow rank's parts (one per step; two under pp: its micro-batches).
Well above the tiny model's step (0.2-1.7 s on two busy cores): at 0.1 s a CI run under
load saw the tp layout's waits land on the slow rank for most steps."""


@pytest.fixture(scope="module")
def slowed_runs(tmp_path_factory) -> dict[str, RunDir]:
    root = tmp_path_factory.mktemp("stragglers")
    run_dirs = {name: prepare_run_dir(cpu_spec(*COMMON, *extra, f"runs_dir={root / name}"))
                for name, (extra, _) in LAYOUTS.items()}
    runs = [(str(run_dirs[name]), slow) for name, (_, slow) in LAYOUTS.items()]
    outcomes = run_on_ranks(train_with_a_slow_rank, world_size=2, workdir=root, timeout_s=300,
                            kwargs={"runs": runs, "sleep_s": SLEEP_S})
    assert outcomes == [["finished"] * len(runs)] * 2, outcomes
    return {name: RunDir(path) for name, path in run_dirs.items()}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_slowed_rank_is_named_and_the_other_waits_for_it(slowed_runs, layout):
    slow = LAYOUTS[layout][1]
    fast = 1 - slow
    run_dir = slowed_runs[layout]
    rows = run_dir.read_rows()
    assert [s["rank"] for s in stragglers(rows)] == [slow], _split(rows)
    waits = [r[TIME_BY_RANK_KEY]["wait_s"] for r in rows if r.get("kind") == "train"]
    fast_wait = statistics.median(w[fast] for w in waits)
    slow_wait = statistics.median(w[slow] for w in waits)
    assert fast_wait > slow_wait + SLEEP_S / 4, _split(rows)  # it waits for the sleeps
    summary = run_dir.read_summary()
    assert summary["stragglers"].startswith(f"rank {slow} is a straggler"), summary
    assert summary["wait_partial"] == "", summary  # every wait of the layout is measured
    [shown] = run_status(run_dir.path)["stragglers"]
    assert shown.startswith(f"rank {slow} is a straggler"), shown


def _split(rows: list[dict]) -> list[dict]:
    return [r[TIME_BY_RANK_KEY] for r in rows if r.get("kind") == "train"]
