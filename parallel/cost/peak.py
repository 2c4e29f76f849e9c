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

from functools import lru_cache

from conf.schema import RecomputeMode
from conf.spec import ModelSpec, RecomputeSpec, RunSpec
from parallel.cost.activations import (
    DTYPE_BYTES,
    ActivationSplit,
    activation_bytes,
    activation_dtypes,
)
from parallel.cost.params import fsdp_local_numel, held_layers, parameter_shapes, tp_local_shape
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


def block_numel(spec: RunSpec, rank: int, *, sharded: bool) -> int:
    """Elements of one block's parameters on `rank` (every block is alike, an FSDP unit of
    its own): tp-local, and FSDP-sharded when `sharded`."""
    dims = ParallelDims.from_spec(spec.parallel)
    coords = dims.coordinates(rank)
    if not (sharded and dims.uses_fsdp):
        return _block_numel(spec.model, tp=dims.tp, shards=1, index=0)
    return _block_numel(spec.model, tp=dims.tp, shards=dims.dp_shard * dims.cp,
                        index=coords["dp_shard"] * dims.cp + coords["cp"])


@lru_cache(maxsize=256)
def _block_numel(model: ModelSpec, *, tp: int, shards: int, index: int) -> int:
    return sum(fsdp_local_numel(tp_local_shape(name, shape, tp), shards=shards, index=index)
               for name, shape in parameter_shapes(model) if name.startswith("layers.0."))


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
    largest = block_numel(spec, rank, sharded=False)
    reduce = DTYPE_BYTES[spec.precision.reduce_dtype.value] * largest
    gather = DTYPE_BYTES[spec.precision.compute_dtype.value] * largest
    return reduce + (gather if dims.zero == 3 else 0)


def recompute_working_set_bytes(spec: RunSpec, layer: int, kwargs: dict) -> int:
    """What block `layer`'s backward re-creates at once: the activations it keeps without
    recompute less those its policy keeps (one block's full activations under full
    recompute; nothing without recompute, or under offload on a CPU device)."""
    return _block_bytes(spec, [layer], kwargs)[layer][1]


def _block_bytes(spec: RunSpec, layers: list[int], kwargs: dict) -> dict[int, tuple[int, int]]:
    """(kept, recompute working set) of each block in `layers`; blocks differ only in
    whether the policy applies to them, so each is computed once per answer."""
    first = {spec.recompute.applies_to(layer): layer for layer in reversed(layers)}
    by_policy = {applies: _one_block(spec.model, spec.recompute, layer, **kwargs)
                 for applies, layer in first.items()}
    return {layer: by_policy[spec.recompute.applies_to(layer)] for layer in layers}


@lru_cache(maxsize=1024)
def _one_block(model: ModelSpec, recompute: RecomputeSpec, layer: int, **kwargs
               ) -> tuple[int, int]:
    one = dict(layers=[layer], with_head=False, with_embedding=False, **kwargs)
    kept = activation_bytes(model, recompute=recompute, **one)
    return kept, activation_bytes(model, recompute=NO_RECOMPUTE, **one) - kept


@lru_cache(maxsize=1024)
def _head_bytes(model: ModelSpec, recompute: RecomputeSpec, **kwargs) -> int:
    return activation_bytes(model, recompute=recompute, layers=[], with_embedding=False,
                            **kwargs)


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
    blocks = _block_bytes(spec, layers, kwargs)
    if spec.parallel.pp > 1:  # backwards interleave with forwards: no one order to walk
        working = max((w for _, w in blocks.values()), default=0)
        phases["backward"] = grads + activations + working + buffers
        return phases
    block_grads = GRAD_BYTES * block_numel(spec, rank, sharded=True)
    kept = activations - _head_bytes(spec.model, spec.recompute, **kwargs)
    made = held or grads - block_grads * len(layers)  # the root's: embedding, norm, head
    for layer in reversed(layers):
        block_kept, working = blocks[layer]
        phases[f"backward layers.{layer}"] = kept + working + made + buffers
        kept -= block_kept
        made = held or made + block_grads
    return phases


def step_peak_bytes(spec: RunSpec, rank: int, **counts: int) -> int:
    """The fullest phase of `step_phase_bytes`."""
    return max(step_phase_bytes(spec, rank, **counts).values())
