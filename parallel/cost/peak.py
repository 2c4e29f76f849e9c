"""A step's fullest moment on one rank, by phase. Torch-free.

Beyond what a rank holds throughout (fp32 parameters, optimizer state, and the weight copies
held from forward to backward), a step holds, at each of its moments:
- the loss (backward's start): every kept activation, the loss's transient, and the
  gradients only where they outlive a step (`grads_outlive_backward`); elsewhere
  `zero_grad(set_to_none=True)` dropped them and backward makes them anew;
- each block's backward, the last block first: the activations still kept (the head's and
  the later blocks' are freed), the block's recompute working set, the gradients made so far
  (the head's and the later blocks'), and the collective buffers of the unit in flight;
- the optimizer step: every gradient, and AdamW's temporaries (`optimizer_transient_bytes`).
Measured against the ranks' real storages in tests/distributed/test_activation_memory.py.
The function is pure in the spec sections it reads (model, parallel, precision, recompute,
training) and the per-rank byte counts it is given, so a search may memoise it by them.
"""
from __future__ import annotations

from conf.schema import RecomputeMode
from conf.spec import RecomputeSpec, RunSpec
from parallel.cost.activations import (
    DTYPE_BYTES,
    ActivationSplit,
    activation_bytes,
    activation_dtypes,
)
from parallel.cost.params import fsdp_local_numel, held_layers, held_parameters, numel, tp_local_shape
from parallel.dims import ParallelDims

GRAD_BYTES = 4
NO_RECOMPUTE = RecomputeSpec(mode=RecomputeMode.none)


def grads_outlive_backward(spec: RunSpec) -> bool:
    """Are gradients alive before backward starts? Under DDP (its buckets are the gradients:
    gradient_as_bucket_view, and the buckets stay between steps), with pipeline stages
    (micro-batches' backwards interleave with later forwards) and with gradient
    accumulation (the second micro-batch's forward runs over the first's gradients)."""
    dims = ParallelDims.from_spec(spec.parallel)
    return dims.uses_ddp or dims.pp > 1 or spec.training.grad_accum_steps > 1


def activation_kwargs(spec: RunSpec, rank: int) -> dict:
    """What activations.activation_bytes needs of a rank, besides its layers: one
    micro-batch's tokens (its pipeline micro-batch, its cp share), dtypes and split."""
    p, t = spec.parallel, spec.training
    dims = ParallelDims.from_spec(p)
    micro_batch = t.micro_batch_size // p.pp_microbatches
    return dict(tokens=micro_batch * t.seq_len // p.cp, micro_batch=micro_batch,
                device_type=t.device, split=ActivationSplit.of(p),
                dtypes=activation_dtypes(spec.precision, uses_fsdp=dims.uses_fsdp))


def unit_numels(spec: RunSpec, rank: int, *, sharded: bool) -> dict[str, int]:
    """Elements of `rank`'s parameters by FSDP unit: each block ("layers.N") and the root
    (everything else); tp-local, and FSDP-sharded when `sharded`."""
    dims = ParallelDims.from_spec(spec.parallel)
    coords = dims.coordinates(rank)
    shards, index = dims.dp_shard * dims.cp, coords["dp_shard"] * dims.cp + coords["cp"]
    units: dict[str, int] = {}
    for name, shape in held_parameters(spec, coords["pp"]):
        local = tp_local_shape(name, shape, dims.tp)
        size = (fsdp_local_numel(local, shards=shards, index=index)
                if sharded and dims.uses_fsdp else numel(local))
        unit = ".".join(name.split(".")[:2]) if name.startswith("layers.") else "root"
        units[unit] = units.get(unit, 0) + size
    return units


def collective_buffer_bytes(spec: RunSpec, rank: int) -> int:
    """Bytes of collective buffers alive during one unit's backward.
    FSDP: the reduce-scatter's input, the unit's whole gradient in the reduce dtype, and
    under zero=3 the all-gather output (compute dtype, whole over the shards) of the next
    unit, prefetched while this one runs; the unit in flight has been copied out of its own
    buffer (freed) into its parameters, which are the weight copies. DDP: none beyond the gradients (its buckets are
    the gradients, gradient_as_bucket_view). TP: none beyond the activations (its gathers are
    what the matmuls keep, counted there)."""
    dims = ParallelDims.from_spec(spec.parallel)
    if not dims.uses_fsdp:
        return 0
    blocks = [n for unit, n in unit_numels(spec, rank, sharded=False).items() if unit != "root"]
    largest = max(blocks, default=0)
    reduce = DTYPE_BYTES[spec.precision.reduce_dtype.value] * largest
    gather = DTYPE_BYTES[spec.precision.compute_dtype.value] * largest
    return reduce + (gather if dims.zero == 3 else 0)


def recompute_working_set_bytes(spec: RunSpec, layer: int, kwargs: dict) -> int:
    """What block `layer`'s backward re-creates at once: the activations it keeps without
    recompute less those its policy keeps (one block's full activations under full
    recompute; nothing without recompute, or under offload on a CPU device)."""
    one = dict(layers=[layer], with_head=False, with_embedding=False, **kwargs)
    return (activation_bytes(spec.model, recompute=NO_RECOMPUTE, **one)
            - activation_bytes(spec.model, recompute=spec.recompute, **one))


def optimizer_transient_bytes(spec: RunSpec, optimizer: int) -> int:
    """AdamW's temporaries beyond its state (`optimizer`: the state's bytes). torch's
    multi-tensor (foreach) AdamW, used off CUDA with fp32 moments (training/optim.py), makes
    one temporary list the size of the second moments (`_foreach_sqrt`; all else is in
    place): half the state. CUDA's fused kernel makes none; the bf16-state AdamW
    (training/adamw_bf16.py) makes its temporaries one tensor at a time (not counted)."""
    foreach = (spec.training.device != "cuda"
               and spec.precision.optimizer_state_dtype.value != "bf16")
    return optimizer // 2 if foreach else 0


def step_phase_bytes(spec: RunSpec, rank: int, *, grads: int, optimizer: int,
                     activations: int, loss_peak: int) -> dict[str, int]:
    """Bytes alive at each phase (module docstring) beyond parameters, optimizer state and
    weight copies; `grads`, `optimizer`, `activations`, `loss_peak`: the rank's bytes
    (memory.static_bytes, layout_activation_bytes, loss_peak_bytes_of)."""
    held = grads if grads_outlive_backward(spec) else 0
    phases = {"loss": held + activations + loss_peak,
              "optimizer step": grads + optimizer_transient_bytes(spec, optimizer)}
    kwargs = activation_kwargs(spec, rank)
    buffers = collective_buffer_bytes(spec, rank)
    layers = held_layers(spec, ParallelDims.from_spec(spec.parallel).coordinates(rank)["pp"])
    working = {layer: recompute_working_set_bytes(spec, layer, kwargs) for layer in layers}
    if spec.parallel.pp > 1:  # backwards interleave with forwards: no one order to walk
        phases["backward"] = grads + activations + max(working.values(), default=0) + buffers
        return phases
    units = unit_numels(spec, rank, sharded=True)
    kept = activations - activation_bytes(spec.model, recompute=spec.recompute, layers=[],
                                          with_embedding=False, **kwargs)
    made = held or GRAD_BYTES * units["root"]
    for layer in reversed(layers):
        phases[f"backward layers.{layer}"] = kept + working[layer] + made + buffers
        kept -= activation_bytes(spec.model, recompute=spec.recompute, layers=[layer],
                                 with_head=False, with_embedding=False, **kwargs)
        made = held or made + GRAD_BYTES * units[f"layers.{layer}"]
    return phases


def step_peak_bytes(spec: RunSpec, rank: int, **counts: int) -> int:
    """The fullest phase of `step_phase_bytes`."""
    return max(step_phase_bytes(spec, rank, **counts).values())
