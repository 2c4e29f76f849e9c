"""TensorBoard and MLflow beside W&B, for real: one 2-rank run of the tiny model trained in two
legs (the second resumes from an older checkpoint and replays two steps, as after a crash),
read back with tensorboard's own EventAccumulator, MLflow's own MlflowClient and the W&B
reader; then each tracker's UI is started on this machine and opened in headless Chromium.
Also: an MLflow server that is down is named once and the run's rows still all land."""
from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path

import pytest

from conf.run_dir.metrics_rows import read_metrics_rows
from conf.run_dir.paths import RunDir
from tests.support.loop_runs import prepare_run_dir
from tests.support.resumed_legs import train_two_legs
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec
from tests.support.tracker_uis import chromium_or_skip, open_page, served
from tests.support.wandb_reader import read_runs

pytestmark = pytest.mark.distributed

STEPS, PAUSE_AT, KEEP_STEP = 6, 4, 2
TRAIN_STEPS = list(range(1, STEPS + 1))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trackers")
    spec = cpu_spec("model=tiny", "data=synthetic", "training.seq_len=32",
                    "cluster.procs_per_node=2", f"training.steps={STEPS}",
                    f"training.stop_at_step={PAUSE_AT}", "checkpoint.every_steps=2",
                    "training.eval_every=3", "checkpoint.export_safetensors=false",
                    "training.cpu_peak_flops=1e11",  # not timed: a second less per leg
                    "logging=offline", "logging.wandb_system_metrics=false",
                    "logging.wandb_console=false", "logging.tensorboard=true",
                    "logging.mlflow=true", f"runs_dir={root / 'runs'}")
    path = prepare_run_dir(spec)
    outcomes = run_on_ranks(train_two_legs, world_size=2, workdir=root, timeout_s=300,
                            kwargs={"run_dir": str(path), "keep_step": KEEP_STEP})
    assert outcomes == [["paused", "finished"]] * 2
    return path


def last_rows(run_dir: Path, kind: str) -> dict[int, dict]:
    """metrics.jsonl's rows of `kind` by step, replayed steps as the last leg wrote them."""
    return {r["step"]: r for r in read_metrics_rows(RunDir(run_dir).metrics_file)
            if r["kind"] == kind}


def wandb_keys(run_dir: Path) -> set[str]:
    keys = set().union(*(row.keys() for row in read_runs(run_dir).user_history()))
    return keys - {"step"}


def tb_events(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(RunDir(run_dir).tensorboard_dir),
                              size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def mlflow_run(run_dir: Path):
    from mlflow.tracking import MlflowClient

    kept = json.loads(RunDir(run_dir).mlflow_run_file.read_text())
    client = MlflowClient(tracking_uri=kept["tracking_uri"])
    return client, client.get_run(kept["run_id"])


def test_tensorboard_has_every_wandb_series_each_step_once(run_dir):
    events = tb_events(run_dir)
    scalars = set(events.Tags()["scalars"])
    assert wandb_keys(run_dir) <= scalars
    assert {"memory/mem_peak_gib/rank1", "rank_time/compute_s/rank1"} <= scalars
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == TRAIN_STEPS  # the replayed steps 3, 4 once: purged
    rows = last_rows(run_dir, "train")
    assert [e.value for e in loss] == pytest.approx([rows[s]["loss"] for s in TRAIN_STEPS])
    assert [e.step for e in events.Scalars("eval/val_loss")] == [0, 3, 6]
    texts = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(tag)]
             for tag in ("events/text_summary", "summary/text_summary", "config/text_summary")}
    events_at = {step: text for step, text in texts["events/text_summary"]}
    assert sorted(events_at) == [KEEP_STEP, PAUSE_AT, STEPS]  # text is not purged, as scalars are
    assert "**paused**" in events_at[PAUSE_AT] and "**resumed**" in events_at[KEEP_STEP]
    assert "**finished**" in events_at[STEPS]
    assert "| steps_done | 6 |" in texts["summary/text_summary"][-1][1]
    assert [s for s, _ in texts["config/text_summary"]] == [0, KEEP_STEP]  # once per leg
    assert '"dim": 64' in texts["config/text_summary"][0][1]
    hparams = events.PluginTagToContent("hparams")
    assert b"model.dim" in b"".join(hparams.values())


def test_mlflow_run_is_resumed_with_config_and_every_wandb_series(run_dir):
    client, run = mlflow_run(run_dir)
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert len(client.search_runs([run.info.experiment_id])) == 1  # leg 2 continued it
    assert run.data.params["model.dim"] == "64"
    assert run.data.params["training.steps"] == str(STEPS)
    assert wandb_keys(run_dir) <= set(run.data.metrics)
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted({m.step for m in history}) == TRAIN_STEPS
    rows = last_rows(run_dir, "train")  # a replayed step keeps both legs' points; the last
    last = {m.step: m.value for m in sorted(history, key=lambda m: m.timestamp)}  # is leg 2's
    assert [last[s] for s in TRAIN_STEPS] == pytest.approx([rows[s]["loss"] for s in TRAIN_STEPS])
    mem = client.get_metric_history(run.info.run_id, "memory/mem_peak_gib/rank1")
    assert sorted({m.step for m in mem}) == TRAIN_STEPS
    tags = run.data.tags
    assert {f"event.{PAUSE_AT}.paused", f"event.{STEPS}.finished"} <= set(tags)
    assert tags["meshrun.state"] == "finished"
    assert run.data.metrics["summary/steps_done"] == STEPS
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["spec.json"]


def test_wandb_still_gets_its_run_beside_them(run_dir):
    run = read_runs(run_dir)
    assert run.exit_code == 0
    assert max(row["step"] for row in run.user_history()) == STEPS


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_tensorboard_ui_shows_the_run_and_its_metric(run_dir, tmp_path):
    chromium = chromium_or_skip()
    port = free_port()
    command = ["-m", "tensorboard.main", "--logdir", str(run_dir.parent), "--host",
               "127.0.0.1", "--port", str(port)]
    with served(command, f"http://127.0.0.1:{port}/data/runs", log=tmp_path / "tb.log"):
        page = open_page(chromium, f"http://127.0.0.1:{port}/#timeseries",
                         profile=tmp_path / "p", screenshot_name="tensorboard.png")
    assert f"{run_dir.name}/tensorboard" in page  # the run, and cards of its first sections
    assert "eval/val_loss" in page and "memory/mem_peak_gib/rank1" in page


def test_mlflow_ui_shows_the_run_and_its_metric(run_dir, tmp_path):
    chromium = chromium_or_skip()
    _, run = mlflow_run(run_dir)
    port = free_port()
    store = json.loads(RunDir(run_dir).mlflow_run_file.read_text())["tracking_uri"]
    command = ["-m", "mlflow", "server", "--backend-store-uri", store, "--host", "127.0.0.1",
               "--port", str(port), "--workers", "1"]
    url = f"http://127.0.0.1:{port}"
    with served(command, f"{url}/health", log=tmp_path / "mlflow.log"):
        page = open_page(chromium, f"{url}/#/experiments/{run.info.experiment_id}/runs/"
                         f"{run.info.run_id}", profile=tmp_path / "p",
                         screenshot_name="mlflow.png")
    assert run_dir.name in page and "model.dim" in page  # the run, its params, its metrics
    assert "train/loss" in page and "memory/mem_peak_gib/rank1" in page
    assert repr(last_rows(run_dir, "train")[STEPS]["loss"]) in page  # its last value


def test_mlflow_server_down_is_named_once_and_training_rows_all_land(tmp_path, caplog):
    from training.loggers import RunLoggers

    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    spec = cpu_spec("model=tiny", "logging.mlflow=true", f"logging.mlflow_tracking_uri={uri}",
                    "logging.tensorboard=true", f"runs_dir={tmp_path}")
    run_dir = prepare_run_dir(spec)
    caplog.set_level(logging.WARNING, logger="meshrun.loggers")
    began = time.perf_counter()
    loggers = RunLoggers(spec, run_dir, resume_step=None)
    for step in (1, 2, 3):
        loggers.log({"kind": "train", "step": step, "loss": 5.0 - step})
    logging_s = time.perf_counter() - began
    loggers.event({"kind": "event", "event": "finished", "step": 3})
    loggers.finish({"steps_done": 3})
    named = [r.getMessage() for r in caplog.records if "MLflow" in r.getMessage()]
    assert len(named) == 1 and "training goes on" in named[0] and uri in named[0]
    assert logging_s < 2.0  # the rows never waited for the store
    assert [r["step"] for r in read_metrics_rows(RunDir(run_dir).metrics_file)] == [1, 2, 3, 3]
    assert [e.step for e in tb_events(run_dir).Scalars("train/loss")] == [1, 2, 3]
    assert not RunDir(run_dir).mlflow_run_file.exists()
