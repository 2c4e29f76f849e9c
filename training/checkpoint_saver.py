"""Checkpoint saves as the loop sees them: synchronous, or asynchronous (checkpoint.async_save).

Async: the step waits only for `stage_checkpoint` (state dicts copied to host memory, pinned
where CUDA exists); the DCP write, the SHA-256 of every file, meta.json and the rename run in a
background thread, on a process group of their own (gloo), so they never interleave with the
training collectives. At most one save is in flight: the next save, the end of the run, a stop
or a failure waits for it (`wait`). The complete-checkpoint rule is unchanged: the thread
publishes `step_N` only after its meta.json lists every file. A failure in the thread is
raised on every rank at the next wait, with the same message.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import torch.distributed as dist

from training.checkpoint import CheckpointError, save_checkpoint, stage_checkpoint, write_staged


class CheckpointSaver:
    """One per rank. `save` returns when the step may go on; `wait` when the last save is
    published (or raises its error). `last_published` is the newest published checkpoint."""

    def __init__(self, *, async_save: bool) -> None:
        self.async_save = async_save
        self.last_published = ""
        self.stall_s: list[float] = []
        """How long each save held the step (async: waiting for the previous save, if still in
        flight, then staging)."""
        self.waited_s: list[float] = []
        """Of each stall, the wait for the previous save in flight."""
        self.publish_s: list[float] = []
        """From each save's start until its checkpoint was published."""
        self._thread: threading.Thread | None = None
        self._outcome: dict = {}
        self._group = None
        self._buffers: dict | None = None

    def save(self, root: Path, *, step: int, model, optimizer, extra: dict, metadata: dict,
             keep_last: int | None) -> None:
        started = time.perf_counter()
        self.wait()  # at most one save in flight
        self.waited_s.append(time.perf_counter() - started)
        if not self.async_save:
            path = save_checkpoint(root, step=step, model=model, optimizer=optimizer,
                                   extra=extra, metadata=metadata, keep_last=keep_last)
            self.last_published = str(path)
            self.publish_s.append(time.perf_counter() - started)
        else:
            staged = stage_checkpoint(root, step=step, model=model, optimizer=optimizer,
                                      extra=extra, metadata=metadata, keep_last=keep_last,
                                      buffers=self._buffers)
            self._buffers = staged.state  # reused by the next save, once this one is written
            self._start(staged, started=started)
        self.stall_s.append(time.perf_counter() - started)

    def _start(self, staged, *, started: float) -> None:
        if self._group is None and dist.is_available() and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")  # collective: every rank saves here
        outcome: dict = {}

        def write() -> None:
            try:
                outcome["path"] = str(write_staged(staged, group=self._group))
                outcome["publish_s"] = time.perf_counter() - started
            except BaseException as exc:  # noqa: BLE001 - raised by wait() on this rank
                outcome["error"] = exc

        self._outcome = outcome
        self._thread = threading.Thread(target=write, name=f"checkpoint-step-{staged.step}",
                                        daemon=True)
        self._thread.start()

    @property
    def in_flight(self) -> bool:
        return self._thread is not None

    def wait(self) -> None:
        """Block until the save in flight is published; raise its error (once)."""
        if self._thread is None:
            return
        self._thread.join()
        self._thread, outcome = None, self._outcome
        if "error" in outcome:
            error = outcome["error"]
            if isinstance(error, CheckpointError):
                raise error
            raise CheckpointError(f"background checkpoint save failed: "
                                  f"{type(error).__name__}: {error}") from error
        self.last_published = outcome["path"]
        self.publish_s.append(outcome["publish_s"])
