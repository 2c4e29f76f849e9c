"""`meshrun run` under every layout gives the single-process losses for the first 5 steps.

Same seed, same global batch (8 sequences of 32 tokens), fp32 on CPU; relative 1e-4. Each run
goes through the whole path: compose -> resolve -> run dir -> torchrun -> build_layout ->
loop (train, eval, checkpoint, gathered safetensors export). Launches run two at a time.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.distributed.test_e2e_runs import meshrun, only_run_dir, train_losses

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]

COMMON = ["model=tiny", "model.n_layers=4", "data=synthetic", "training.steps=5",
          "training.seq_len=32", "training.global_batch_size=8", "training.micro_batch_size=2",
          "training.grad_accum_steps=-1", "training.eval_every=0", "checkpoint.every_steps=0",
          "logging=disabled"]
LAYOUTS = {  # name: (processes, overrides)
    "ddp": (2, ["parallel=ddp"]),
    "zero1": (2, ["parallel=zero1"]),
    "zero2": (2, ["parallel=zero2"]),
    "zero3": (2, ["parallel=zero3"]),
    "tp": (2, ["parallel=tp"]),
    "cp": (2, ["parallel=cp"]),
    "pp_gpipe": (2, ["parallel=pp", "parallel.pp_schedule=gpipe"]),
    "pp_1f1b": (2, ["parallel=pp", "parallel.pp_schedule=1f1b"]),
    "pp_interleaved": (2, ["parallel=pp", "parallel.pp_schedule=interleaved_1f1b",
                           "parallel.pp_virtual_stages=2", "parallel.pp_microbatches=2"]),
    "hsdp": (4, ["parallel=hsdp"]),
    "dp2_tp2": (4, ["parallel=fsdp_tp"]),
    "pp2_dp2": (4, ["parallel=pp", "parallel.pp=2", "parallel.dp_shard=-1", "parallel.zero=3"]),
    "pp2_tp2": (4, ["parallel=pp", "parallel.pp=2", "parallel.tp=2"]),
    "cp2_tp2": (4, ["parallel=cp", "parallel.cp=2", "parallel.tp=2", "parallel.zero=3"]),
    "pp2_dp2_tp2": (8, ["parallel=3d"]),
}


@pytest.fixture(scope="module")
def losses(tmp_path_factory) -> dict[str, dict[int, float]]:
    root = tmp_path_factory.mktemp("layouts")

    def launch(name: str, procs: int, overrides: list[str]):
        return meshrun("run", *COMMON, *overrides, f"cluster.procs_per_node={procs}",
                       f"runs_dir={root / name}", timeout=400)

    jobs = {"single": (1, ["parallel=single"]), **LAYOUTS}
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(launch, name, *job) for name, job in jobs.items()}
        results = {name: future.result() for name, future in futures.items()}
    out = {}
    for name, result in results.items():
        assert result.returncode == 0, f"{name}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        run_dir = only_run_dir(root / name)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["export_dir"], name  # the gathered weights were exported
        out[name] = train_losses(run_dir)
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_first_five_losses_match_one_process(losses, layout):
    reference, mine = losses["single"], losses[layout]
    assert sorted(mine) == sorted(reference) == [1, 2, 3, 4, 5]
    for step, loss in reference.items():
        assert mine[step] == pytest.approx(loss, rel=1e-4), (layout, step, mine, reference)
