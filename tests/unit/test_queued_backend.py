"""A tracker behind QueuedBackend (training/logger_backend.py) can neither stop nor hold
training: a start that raises is named once and the rest is dropped; a tracker that stops
answering holds the leg's end for `finish_wait_s` only, named once; a working one gets every
call in order. (The real MLflow with its server down: tests/distributed/test_tensorboard_mlflow.py.)"""
from __future__ import annotations

import threading
import time

from training.logger_backend import QueuedBackend, flat_config


class Recorder:
    name = "Recorder"

    def __init__(self, calls: list, *, answers: threading.Event | None = None) -> None:
        self.calls, self.answers = calls, answers

    def log(self, values, *, step, tokens_seen):
        if self.answers is not None:
            self.answers.wait()  # a store that stopped answering
        self.calls.append(("log", step, values))

    def event(self, row):
        self.calls.append(("event", row["event"]))

    def finish(self, summary, *, exit_code):
        self.calls.append(("finish", summary, exit_code))


def named(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "meshrun.loggers"]


def test_every_call_arrives_in_order():
    calls: list = []
    backend = QueuedBackend("Recorder", lambda: Recorder(calls))
    backend.log({"train/loss": 1.0}, step=1, tokens_seen=8)
    backend.event({"kind": "event", "event": "finished", "step": 1})
    backend.finish({"steps_done": 1}, exit_code=0)
    assert calls == [("log", 1, {"train/loss": 1.0}), ("event", "finished"),
                     ("finish", {"steps_done": 1}, 0)]


def test_a_start_that_fails_is_named_once_and_nothing_raises(caplog):
    def start():
        raise ConnectionError("store at http://127.0.0.1:9 refused\nsecond line")

    backend = QueuedBackend("Store", start)
    for step in range(3):
        backend.log({"x": 1.0}, step=step, tokens_seen=0)
    backend.finish({}, exit_code=0)
    assert named(caplog) == ["Store logging failed and is off for the rest of this leg "
                             "(training goes on): ConnectionError: store at "
                             "http://127.0.0.1:9 refused"]


def test_a_tracker_that_stops_answering_holds_the_end_for_the_wait_only(caplog):
    calls: list = []
    answers = threading.Event()
    backend = QueuedBackend("Hung", lambda: Recorder(calls, answers=answers), finish_wait_s=0.5)
    began = time.perf_counter()
    for step in range(3):
        backend.log({"x": 1.0}, step=step, tokens_seen=0)
    assert time.perf_counter() - began < 0.1  # logging never waits for the store
    backend.finish({}, exit_code=0)
    assert time.perf_counter() - began < 5
    [message] = named(caplog)
    assert message.startswith("Hung did not finish writing within 0.5 s"), message
    backend.log({"x": 1.0}, step=9, tokens_seen=0)  # off now: not even queued
    answers.set()


def test_flat_config_names_nested_keys_with_dots():
    assert flat_config({"model": {"dim": 64, "rope": {"theta": 1e4}}, "name": "run"}) == {
        "model.dim": 64, "model.rope.theta": 1e4, "name": "run"}

