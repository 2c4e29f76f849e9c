"""End-to-end `meshrun` runs through torchrun (2 gloo ranks): run dirs, exact resume, W&B
history read back from the offline run files, export, clear failures, the default experiment,
eval tasks scored in training and again by `meshrun eval` (lm-eval) on the export.

Each torchrun launch costs seconds here, so launches are shared through module fixtures.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from conf.run_dir.paths import RunDir
from launcher.backends.warm_agent import WARM_MARK
from tests.support.meshrun_cli import REPO, meshrun
from tests.support.run_outputs import only_run_dir, train_losses
from tests.support.wandb_reader import read_runs

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]
SMALL = ["model=tiny", "training.steps=20", "training.seq_len=64", "training.micro_batch_size=8",
         "training.eval_every=10", "checkpoint.every_steps=5", "checkpoint.keep_last=2",
         "logging=offline", "optim=muon"]  # Muon's buffers resume exactly (AdamW's: elsewhere)


EVAL_DOCS = [{"context": "def f(x):\n    return", "choices": ["x", "x + 1", "None"], "gold": 0},
             {"context": "import", "choices": ["os", "sys", "json"], "gold": 1},
             {"context": "for i in range(", "choices": ["10):", "len(xs)):"], "gold": 0},
             {"context": "class A", "choices": ["(B):", ":"], "gold": 1},
             {"context": "while", "choices": ["True:", "x < 3:", "not done:"], "gold": 2}]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A: 20 steps straight. B: the same spec stopped at step 10, then `meshrun resume`; B
    also scores an eval task every 10 steps (training is unchanged by it)."""
    root = tmp_path_factory.mktemp("e2e")
    task = root / "mc.jsonl"
    task.write_text("".join(json.dumps(d) + "\n" for d in EVAL_DOCS))
    evals = [f"eval.tasks=[{{name:mc,path:{task}}}]", "eval.every_steps=10"]
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(meshrun, "run", *SMALL, f"runs_dir={root / 'a'}")
        b = pool.submit(meshrun, "run", *SMALL, *evals, "training.stop_at_step=10",
                        f"runs_dir={root / 'b'}")
        done = [a.result(), b.result()]
    for result in done:
        assert result.returncode == 0, result.stdout + result.stderr
    run_b = only_run_dir(root / "b")
    assert max(train_losses(run_b)) == 10
    resumed = meshrun("resume", str(run_b))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    return {"a": only_run_dir(root / "a"), "b": run_b, "resume_output": resumed.stdout,
            "task": task}


def test_resumed_run_repeats_the_uninterrupted_losses_exactly(runs):
    straight, resumed = train_losses(runs["a"]), train_losses(runs["b"])
    assert sorted(straight) == list(range(1, 21))
    assert resumed == straight  # exact float equality: fp32 on CPU resumes bit for bit


def test_run_and_resume_start_torchrun_warm(runs):
    """`meshrun run` and `meshrun resume` hand the launch to the torchrun agent they started
    before composing (launcher/backends/warm_torchrun.py), not to a cold one."""
    assert RunDir(runs["a"]).torchrun_log.read_text().startswith(WARM_MARK)
    assert RunDir(runs["b"]).torchrun_log.read_text().count(WARM_MARK) == 2  # run, resume


def test_run_dir_holds_what_reproduces_the_run(runs):
    run_dir = runs["a"]
    for name in ("spec.json", "config.yaml", "overrides.json", "command.txt", "env.json",
                 "metrics.jsonl", "summary.json", "logs/rank0.log", "logs/rank1.log"):
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "overrides.json").read_text())[0] == "model=tiny"
    env = json.loads((run_dir / "env.json").read_text())
    assert env["torch"].startswith("2.") and {"commit", "dirty"} <= set(env["git"])
    assert "torch.distributed.run" in (run_dir / "command.txt").read_text()
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["step_00000015", "step_00000020"]  # keep_last=2


def test_export_is_in_hugging_face_layout(runs):
    from safetensors import safe_open

    export = runs["a"] / "export"
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 2
    with safe_open(str(export / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" in keys
    assert "model.layers.1.mlp.down_proj.weight" in keys


def test_wandb_offline_run_holds_history_config_and_one_id_across_resume(runs):
    run_dir = runs["b"]
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    record = read_runs(run_dir)
    assert record.run_id == run_id and len(record.sources) == 2  # two legs, one run
    logged = {int(h["train/step"]) if "train/step" in h else int(h["step"]): h
              for h in record.user_history() if "train/loss" in h}
    assert sorted(logged) == list(range(1, 21))
    losses = train_losses(run_dir)
    assert all(logged[s]["train/loss"] == pytest.approx(losses[s], rel=1e-12) for s in losses)
    assert record.user_config()["model"]["name"] == "tiny"
    # each rank's memory, one W&B series per rank, as the metrics row gathered it
    rows = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").open())
            if r["kind"] == "train"}
    for step, row in rows.items():
        peaks = row["mem_by_rank"]["mem_peak_gib"]
        assert len(peaks) == 2 and row["mem_peak_gib"] == max(peaks) and min(peaks) > 0
        assert [logged[step][f"memory/mem_peak_gib/rank{r}"] for r in (0, 1)] == peaks
        # and each rank's step time split into compute and wait (stragglers)
        split = row["time_by_rank"]
        for stat in ("step_time_s", "wait_s", "compute_s"):
            assert [logged[step][f"rank_time/{stat}/rank{r}"] for r in (0, 1)] == split[stat]
        assert all(0 <= w <= t for w, t in zip(split["wait_s"], split["step_time_s"]))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert record.user_summary()["final_val_loss"] == pytest.approx(summary["final_val_loss"])


def test_eval_tasks_reach_metrics_and_wandb_and_meshrun_eval_rescores_them(runs):
    """Scored at steps 10 and 20 (the resumed leg), logged to metrics.jsonl and W&B as
    eval/mc/acc; `meshrun eval` through lm-eval on the export gives the step-20 scores and
    appends them as a row of its own."""
    run_dir = runs["b"]
    rows = [r for r in map(json.loads, (run_dir / "metrics.jsonl").open())
            if r["kind"] == "task_eval"]
    assert [r["step"] for r in rows] == [10, 20] and rows[-1]["eval/mc/n"] == 5
    logged = [h for h in read_runs(run_dir).user_history() if "eval/mc/acc" in h]
    assert [h["eval/mc/acc_norm"] for h in logged] == [r["eval/mc/acc_norm"] for r in rows]
    result = meshrun("eval", str(run_dir), f"tasks=mc={runs['task']}", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    scored = json.loads(result.stdout)
    assert scored["harness"] == "lm_eval"
    again = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert again["source"] == "meshrun eval" and again["step"] == 20
    for key in ("acc", "acc_norm", "n"):
        assert scored["scores"]["mc"][key] == rows[-1][f"eval/mc/{key}"] == again[f"eval/mc/{key}"]


def test_resume_under_another_world_size_stops_with_a_clear_error(runs):
    result = meshrun("resume", str(runs["a"]), "parallel=single")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "world size 1 differs from the checkpoint's 2" in result.stderr


def test_a_failing_rank_fails_the_run_with_its_error(tmp_path):
    import numpy as np

    bad = tmp_path / "tokens.npy"
    tokens = np.arange(4096, dtype=np.int64) % 200
    tokens[1500:2500] = 999  # beyond the tiny vocab of 256, between the head and tail that
    np.save(bad, tokens)     # resolve() samples: only a rank reading it finds them
    result = meshrun("run", *SMALL, "data=files", f"data.train_files={bad}",
                     f"data.val_files={bad}", f"runs_dir={tmp_path / 'runs'}")
    assert result.returncode != 0
    assert "run failed" in result.stderr and "999" in result.stderr


def test_default_experiment_learns(tmp_path):
    """`meshrun run` with no arguments (only the runs dir moved): val loss falls by >= 30%."""
    result = meshrun("run", f"runs_dir={tmp_path}", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["val_loss_drop"] >= 0.30, summary


def test_preflight_command_checks_joins_all_reduce_and_bandwidth(tmp_path):
    result = meshrun("preflight", "model=tiny", "cluster.procs_per_node=2",
                     f"runs_dir={tmp_path}")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((only_run_dir(tmp_path) / "preflight.json").read_text())
    assert report["world_size"] == 2 and report["all_reduce_check"]["passed"]
    sizes = [row["size_bytes"] for row in report["bandwidth"]]
    assert sizes[0] == 4 * 1024 and sizes[-1] == 64 * 1024**2
    assert "64 MiB" in result.stdout and "all-reduce check passed" in result.stdout
    run_dir = only_run_dir(tmp_path)
    assert RunDir(run_dir).torchrun_log.read_text().startswith(WARM_MARK)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in rows] == ["preflight passed"]  # nothing trained
    # a finished state, not "running" forever, in `meshrun status` and in compare
    status = meshrun("status", str(run_dir), "--json")
    assert json.loads(status.stdout)["state"] == "preflight passed", status.stdout + status.stderr
    from sweeps.compare import collect_runs
    assert [r.state for r in collect_runs(paths=[run_dir])] == ["preflight passed"]
