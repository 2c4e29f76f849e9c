"""Rank-side code of the pipeline checks in tests/distributed/test_activation_memory.py: what
a pipeline rank keeps for backward at its fullest moment, and the peak of its whole step.

A pipeline rank's forwards and backwards interleave inside torch's schedule, so there is no
one moment "after forward": the kept bytes are read at every moment a micro-batch's chunk
has just run forward, or is about to run backward (the loss of the last stage then exists),
and the largest reading is the rank's. A reading counts the storages made during the step
that are still alive (activation_memory._Storages), less the weights, autocast's weight casts
and the gradients, plus the receive buffers that hold the inputs of the chunks in flight.

torch's PipelineStage allocates its receive buffers once (activations: one per micro-batch;
gradients: one per micro-batch) in the first step and reuses them: one warm-up step runs
first, so the measured step is any step after the first, and those buffers are the rank's
state from then on (registered before the step, as the parameters are).
"""
from __future__ import annotations

import gc

import torch

from tests.support.activation_memory import (DEBUG, _Storages, _key, _live_bytes, _weights,
                                             least_peak)
from tests.support.peak_memory import LiveBytes, state_tensors, warm_optimizers

CPU = torch.device("cpu")


def stages_of(layout) -> list:
    schedule = layout.schedule
    return list(getattr(schedule, "_stages", None) or [schedule._stage])


def recv_buffers(stage, *, chunks=None, grads: bool = False) -> list[torch.Tensor]:
    """The stage's receive buffers (activations, or gradients), of `chunks` (default all)."""
    infos = stage.grad_recv_info if grads else stage.args_recv_info
    return [info.buffer for chunk, recv in infos.items() if chunks is None or chunk in chunks
            for info in recv if getattr(info, "buffer", None) is not None]


def pipeline_buffers(layout) -> list[torch.Tensor]:
    return [buffer for stage in stages_of(layout)
            for grads in (False, True) for buffer in recv_buffers(stage, grads=grads)]


class _Readings:
    """The largest kept-bytes reading over the schedule's forward exits and backward
    entries (module docstring)."""

    def __init__(self, layout, recorder: _Storages, before: set[int], buffers: list) -> None:
        self.layout, self.recorder, self.before, self.buffers = layout, recorder, before, buffers
        self.most = 0
        self.backward_made: set[int] = set()

    def read(self) -> None:
        gc.collect()
        layout = self.layout
        grads = {_key(t.grad) for t in [*layout.parameters(), *self.buffers]
                 if t.grad is not None}  # a received input's gradient too (a leaf)
        excluded = (self.before | _weights(layout) | self.recorder.weight_casts | grads
                    | self.backward_made)
        made = sum(_live_bytes(ref) for key, ref in self.recorder.refs.items()
                   if key not in excluded)
        inputs = sum(b.untyped_storage().nbytes() for stage in stages_of(layout)
                     for b in recv_buffers(stage, chunks=set(stage.fwd_cache)))
        if DEBUG and made + inputs > self.most:
            print(torch.distributed.get_rank(), "reading", made, inputs, [
                (_live_bytes(ref), self.recorder.info.get(key))
                for key, ref in self.recorder.refs.items()
                if key not in excluded and _live_bytes(ref)], flush=True)
        self.most = max(self.most, made + inputs)

    def wrap(self, stage) -> None:
        forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

        def forward_one_chunk(*args, **kwargs):
            out = forward(*args, **kwargs)
            self.read()
            return out

        def backward_one_chunk(*args, **kwargs):
            self.read()
            known = set(self.recorder.refs)
            try:
                return backward(*args, **kwargs)
            finally:  # gradients (a received input's, on its way back), not activations
                self.backward_made |= set(self.recorder.refs) - known

        stage.forward_one_chunk, stage.backward_one_chunk = forward_one_chunk, backward_one_chunk


def pipeline_step(layout, spec, batches, optimizers, *, slack: float) -> tuple[int, LiveBytes]:
    """(the largest kept reading, the step's LiveBytes) of one training step after a
    warm-up step."""
    from training.precision import autocast_context
    from training.step import clip_and_step, forward_backward

    autocast = autocast_context(spec.precision, CPU)
    forward_backward(layout, batches, device=CPU, autocast=autocast)  # warm-up: the buffers
    for part in layout.parts:
        part.zero_grad(set_to_none=True)
    buffers = pipeline_buffers(layout)
    inputs = [t for batch in batches for t in batch]
    with LiveBytes([*state_tensors(layout, optimizers), *buffers, *inputs], slack=slack) as live:
        recorder = _Storages()
        readings = _Readings(layout, recorder, {_key(t) for t in [*buffers, *inputs]},
                              buffers)
        for stage in stages_of(layout):
            readings.wrap(stage)
        with recorder:
            forward_backward(layout, batches, device=CPU, autocast=autocast)
        clip_and_step(layout, optimizers, grad_clip=spec.optim.grad_clip)
    return readings.most, live


def pipeline_rows(layout, spec, batches, optimizers, *, rank: int, slack: float) -> dict:
    from parallel.cost.memory import estimate_memory, layout_activation_bytes

    warm_optimizers(layout, optimizers)
    plan_peak = estimate_memory(spec, rank=rank).total
    kept, live = least_peak(lambda: pipeline_step(layout, spec, batches, optimizers,
                                                  slack=slack), plan_peak)
    return {"name": spec.parallel.name, "rank": rank, "measured": kept,
            "microbatches": spec.parallel.pp_microbatches * spec.parallel.pp_virtual_stages,
            "plan": layout_activation_bytes(spec, rank), "peak": live.peak,
            "peak_at": live.peak_at, "plan_peak": plan_peak}
