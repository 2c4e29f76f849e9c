"""The one small interface every experiment tracker sits behind (W&B, TensorBoard, MLflow), and
`QueuedBackend`, which runs a tracker in a thread of its own so that it can neither stop nor
slow training.

RunLoggers (training/loggers.py) fans each metrics row out to every backend as flat numeric
values (`train/loss`, `memory/mem_peak_gib/rank1`, ...), each event row as it is, and the
summary once at the end.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Protocol

log = logging.getLogger("meshrun.loggers")

START_WAIT_S = 300.0
"""How long the end of a leg waits for a tracker still starting (importing mlflow takes 3-30 s
on a busy CPU host; a store that hangs fails within MLflow's HTTP timeouts, ~100 s)."""
FINISH_WAIT_S = 60.0
"""Then how long it waits for the tracker to write what it was given."""


class LoggerBackend(Protocol):
    """What RunLoggers calls on each tracker (rank 0 only)."""

    name: str
    """Shown in the log (`MLflow`, `TensorBoard`, `W&B`)."""

    def log(self, values: dict[str, float], *, step: int, tokens_seen: int) -> None:
        """One row of metrics at training step `step`."""

    def event(self, row: dict[str, Any]) -> None:
        """An event row (`{"kind": "event", "event": "finished", "step": 20, ...}`)."""

    def finish(self, summary: dict[str, Any], *, exit_code: int) -> None:
        """The leg's summary (None values dropped), then close; 0 = ended normally."""


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"model": {"dim": 64}} -> {"model.dim": 64}: the spec as hparams / params."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_config(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def numbers(values: dict[str, Any]) -> dict[str, float]:
    """The numeric entries (not bools) of a summary, as floats."""
    return {k: float(v) for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


class QueuedBackend:
    """A tracker started and fed in a worker thread: `log`/`event` only enqueue, so a slow
    or unreachable store never holds a step. The first error (at start or at any call) is
    named once in the log and the tracker is off for the rest of the leg; training goes on.
    `finish` waits for the start (at most START_WAIT_S), then at most `finish_wait_s` for what
    is queued to be written."""

    def __init__(self, name: str, start: Callable[[], LoggerBackend], *,
                 finish_wait_s: float = FINISH_WAIT_S) -> None:
        self.name = name
        self.failed = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._finish_wait_s = finish_wait_s
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(start,), daemon=True,
                                        name=f"meshrun-{name.lower()}")
        self._thread.start()

    def log(self, values: dict[str, float], *, step: int, tokens_seen: int) -> None:
        if not self.failed:
            self._queue.put(("log", (values,), {"step": step, "tokens_seen": tokens_seen}))

    def event(self, row: dict[str, Any]) -> None:
        if not self.failed:
            self._queue.put(("event", (row,), {}))

    def finish(self, summary: dict[str, Any], *, exit_code: int) -> None:
        self._queue.put(("finish", (summary,), {"exit_code": exit_code}))
        self._started.wait(START_WAIT_S)
        self._thread.join(self._finish_wait_s)
        if self._thread.is_alive() and not self.failed:
            self.failed = True
            log.warning("%s did not finish writing within %g s (about %d calls left "
                        "unwritten); the run goes on without it", self.name,
                        self._finish_wait_s, self._queue.qsize())

    def _work(self, start: Callable[[], LoggerBackend]) -> None:
        backend = self._call(start)
        self._started.set()
        while True:
            method, args, kwargs = self._queue.get()
            if backend is not None and not self.failed:
                self._call(getattr(backend, method), *args, **kwargs)
            if method == "finish":
                return

    def _call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # any tracker failure: named once, never raised into training
            if not self.failed:
                self.failed = True
                log.warning("%s logging failed and is off for the rest of this leg (training "
                            "goes on): %s: %s", self.name, type(exc).__name__,
                            str(exc).splitlines()[0] if str(exc) else "")
            return None
