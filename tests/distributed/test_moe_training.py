"""tiny_moe trains for real on two spawned gloo ranks (ZeRO-3) through the training loop
(uniform random tokens: nothing to learn, the loss stays near ln 256): every logged row carries the routing metrics of both MoE blocks, and the export loads in transformers as a
Qwen3-MoE giving the loss meshrun computes for the same weights."""
from __future__ import annotations

import json
from dataclasses import replace
import math

import pytest
import torch

from tests.support.loop_runs import prepare_run_dir, train_run_dirs
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec

pytestmark = pytest.mark.distributed

ROUTING = ("load_max_mean", "max_expert_share", "dropped_frac", "aux_loss", "z_loss")


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    """One real tiny_moe run (2 gloo ranks, ZeRO-3, 4 steps), shared by this file's tests."""
    tmp_path = tmp_path_factory.mktemp("moe_run")
    spec = cpu_spec("model=tiny_moe", "data=synthetic", "parallel=zero3", "cluster.procs_per_node=2",
                    "training.steps=4", "training.log_every=1", "training.seq_len=32",
                    "training.cpu_peak_flops=1e11",
                    "training.eval_every=0", "optim.lr=3e-3", "model.moe.capacity_factor=1.5",
                    f"runs_dir={tmp_path}", "logging.wandb_mode=disabled")
    run_dir = prepare_run_dir(spec)
    run_on_ranks(train_run_dirs, world_size=2, workdir=tmp_path, timeout_s=300,
                 kwargs={"run_dirs": [str(run_dir)]})
    return spec, run_dir


def _train_rows(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == "train"]


def test_tiny_moe_trains_logs_routing_and_exports(moe_run):
    import transformers

    spec, run_dir = moe_run
    train = _train_rows(run_dir)
    assert len(train) == 4
    assert all(abs(r["loss"] - math.log(256)) < 0.5 and r["grad_norm"] > 0 for r in train)
    for row in train:
        for block in (1, 2):
            assert all(f"moe_l{block}_{name}" in row for name in ROUTING), row
        assert 0 <= row["moe_dropped_frac"] < 1 and row["moe_load_max_mean"] >= 1
    assert "moe_l0_load_max_mean" not in train[0]  # block 0 is dense

    export = run_dir / "export"
    model = transformers.AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert model.config.output_router_logits and model.config.router_aux_loss_coef == 0.01
    ids = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # the language-model loss (the export trains with the balancing loss on: without it)
        hf_loss = float(model(input_ids=ids, labels=ids, output_router_logits=False).loss)
    from training.hf_import import load_hf_model

    # Hugging Face routes without a capacity: compare with our dropless forward
    dropless = replace(spec.model, moe=replace(spec.model.moe, capacity_factor=None))
    ours = load_hf_model(export, dropless)
    with torch.no_grad():
        our_loss = float(ours(ids[:, :-1], targets=ids[:, 1:])) / ids[:, 1:].numel()
    assert our_loss == pytest.approx(hf_loss, rel=1e-4)


def test_calibrate_fits_the_runs_imbalance_and_ep_plans_use_it(moe_run, tmp_path, capsys):
    """plan --calibrate on the real run stores the max per-block load ratio past warm-up
    (4 steps: LR warm-up 0, the first 2 rows left out), and a later ep=2 plan of the device
    scales its dispatch/combine all-to-all by it: the bytes by exactly that factor, and the
    seconds' bandwidth part too (measured between explicit factors 1 and 2: linear in bytes)."""
    from launcher.cli import main

    spec, run_dir = moe_run
    assert spec.schedule.warmup_steps == 0
    expected = max(r[f"moe_l{b}_load_max_mean"] for r in _train_rows(run_dir)[2:] for b in (1, 2))
    out = tmp_path / "cal.json"
    assert main(["plan", "--calibration-out", str(out), "--calibrate", str(run_dir)]) == 0
    assert f"ep_imbalance = {expected:.4g}" in capsys.readouterr().out
    fitted = json.loads(out.read_text())["devices"]["CPU core"]["ep_imbalance"]
    assert fitted == pytest.approx(expected, rel=1e-12) and fitted > 1

    def dispatch(*extra: str) -> tuple[dict, str]:
        assert main(["plan", "--json", "model=tiny_moe", "data=synthetic", "parallel=ep",
                     "cluster.procs_per_node=2", "training.seq_len=32",
                     f"cluster.calibration={out}", *extra]) == 0
        step = json.loads(capsys.readouterr().out)["step_time"]
        (row,) = [c for c in step["collectives"] if c["axis"] == "ep" and c["size_bytes"] > 64]
        return row, step["sources"]["ep_imbalance"]

    calibrated, source = dispatch()
    one, _ = dispatch("parallel.ep_imbalance=1")
    two, explicit = dispatch("parallel.ep_imbalance=2")
    assert (source, explicit) == ("calibration", "parallel")
    assert calibrated["size_bytes"] == pytest.approx(fitted * one["size_bytes"], rel=1e-12)
    per_unit = two["seconds"] - one["seconds"]  # the bandwidth term at factor 1
    assert per_unit > 0
    assert calibrated["seconds"] - one["seconds"] == pytest.approx((fitted - 1) * per_unit,
                                                                  rel=1e-9)
