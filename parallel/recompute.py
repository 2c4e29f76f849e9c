"""Activation recompute (activation checkpointing) and activation offload, per transformer block.

Modes (`RecomputeSpec.mode`), each applied to the blocks `RecomputeSpec.applies_to` picks:
- none: keep every activation autograd saves.
- full: keep only each block's input; re-run the whole block in backward.
- selective: re-run the parts named in `RecomputeSpec.targets` (conf.choices.RecomputeTarget;
  see `block_targets`); the model family maps each module target to its block submodules and
  the method re-run (training/models/; Llama's named in brackets):
    ops        per-op policy over the block: keep matmul and attention outputs, re-compute the
               cheap element-wise work (norms, RoPE, SiLU, products, copies) (torchtitan "op")
    block      the whole block (the same as full)
    ffn        the feed-forward module (keeps its input) [SwiGLU]
    swiglu     only the MLP's activation product, silu(gate) * up (keeps gate and up)
    attention  only the attention core, softmax(QK^T)V (Megatron's "selective" core
               attention recompute; keeps q, k, v)
    norm       each block's norms (keeps their inputs)
- offload: keep every activation, but in host memory: the block's forward runs under
  saved-tensor hooks like `torch.autograd.graph.save_on_cpu` (`_SaveActivationsOnCpu`), which
  copy each saved activation to (pinned, when CUDA is available) CPU memory and back in
  backward; parameters stay put. On a CPU device this saves nothing: tensors already on the
  CPU are kept as they are, so offload keeps exactly what none keeps (and gives the same
  numbers).

Nothing is wrapped in another module: the class of each affected module is swapped for a
subclass whose method runs the original under `torch.utils.checkpoint` (non-reentrant), the way
FSDP2's `fully_shard` swaps classes. Parameter names and state-dict keys stay exactly as they
were, so checkpoints, export, TP plans and FSDP see the same names with or without recompute.
FSDP2 applied afterwards derives its class from the swapped one, and `torch.compile` of a block
traces the checkpointed calls as checkpoint regions, so both compose.
"""
from __future__ import annotations

import collections
import functools

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    _CachedTorchDispatchMode,
    _CachingTorchDispatchMode,
    checkpoint,
)

from conf.schema import OpsMatmuls, RecomputeMode, RecomputeTarget
from conf.spec import RecomputeSpec
from training.models import family_of
from training.models.family import BLOCKS, ModelFamily

OFFLOAD = "offload"
"""The pseudo-target mode=offload gives each chosen block (not a selective target)."""


def apply_recompute(model: nn.Module, *, recompute: RecomputeSpec) -> None:
    """Make the chosen blocks of `model` recompute (or offload) in backward, in place."""
    if recompute.mode is RecomputeMode.none:
        return
    assert not any(isinstance(m, _Swapped) for m in model.modules()), "recompute applied twice"
    targets = block_targets(mode=recompute.mode, targets=recompute.targets)
    family = family_of(model.spec)
    for index, block in _indexed_blocks(model):
        if recompute.applies_to(index):
            _apply_to_block(block, targets=targets, family=family,
                            alternate=recompute.ops_matmuls == OpsMatmuls.alternate)


def block_targets(*, mode: RecomputeMode,
                  targets: tuple[str, ...] | list[str] = (RecomputeTarget.ops,),
                  ) -> frozenset[str]:
    """What each chosen block gets, without targets that another one already covers.

    full = {block}; offload = {offload}. selective: block covers everything; ops already
    re-computes norms and SwiGLU, with attention it also re-computes the attention core, and it
    drops ffn (its policy cannot tell FFN matmuls from attention ones, and a plain checkpoint
    nested inside the ops region would save nothing: the region's cache keeps the matmul
    outputs anyway); ffn covers swiglu.
    """
    if mode is RecomputeMode.full:
        return frozenset({RecomputeTarget.block})
    if mode is RecomputeMode.offload:
        return frozenset({OFFLOAD})
    chosen = {RecomputeTarget(target) for target in targets}
    if RecomputeTarget.block in chosen:
        return frozenset({RecomputeTarget.block})
    if RecomputeTarget.ops in chosen:
        return frozenset(chosen & {RecomputeTarget.ops, RecomputeTarget.attention})
    if RecomputeTarget.ffn in chosen:
        chosen.discard(RecomputeTarget.swiglu)
    return frozenset(chosen)


def matmul_policy(*, alternate: bool, keep_attention: bool):
    """The ops policy: keep matmul, attention and TP-collective outputs, re-compute the rest.
    `alternate`: keep only the 1st, 3rd, 5th ... matmul of each checkpointed call (counted
    apart in forward and in its re-run, which see the same calls) and re-compute the others,
    as torchtitan's op SAC. `keep_attention`=False re-computes the attention core too."""
    counts = {False: 0, True: 0}

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if alternate and op in _matmul_ops():
            counts[ctx.is_recompute] += 1
            if counts[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        if op in _saved_ops() and (keep_attention or op not in _attention_ops()):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


@functools.cache
def selective_context_fn(*, alternate: bool = False, keep_attention: bool = True):
    """A checkpoint `context_fn` giving each checkpointed call fresh (forward, recompute)
    contexts under `matmul_policy` (one per setting: the same object for every block)."""
    return lambda: selective_contexts(
        matmul_policy(alternate=alternate, keep_attention=keep_attention))


def selective_contexts(policy) -> tuple:
    """torch's `create_selective_checkpoint_contexts(policy)`, except that the profiler's
    record_function markers (`_uncounted`) run as they come, neither cached nor counted.
    torch keys its cache by (op, call index) and demands the re-run call each op as often as
    forward did; an FSDP unit nested in a checkpointed block (expert parallelism's experts,
    parallel/fsdp.py `shard_experts_units`) runs its hooks' markers a different number of
    times in the re-run (its gathers then happen inside the block), and backward failed with
    "profiler._record_function_enter_new ... not found in storage". A marker returns a
    handle, not an activation: nothing to save."""
    storage: dict = collections.defaultdict(dict)
    return _SavingMode(policy, storage), _ReplayingMode(None, storage)


def _uncounted(func) -> bool:
    return getattr(func, "namespace", None) == "profiler"


class _SavingMode(_CachingTorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _uncounted(func):
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


class _ReplayingMode(_CachedTorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _uncounted(func):
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


def _apply_to_block(block: nn.Module, *, targets: frozenset[str], family: ModelFamily,
                    alternate: bool) -> None:
    if RecomputeTarget.ops in targets:
        _swap(block, _selective_forward(alternate=alternate,
                                        keep_attention=RecomputeTarget.attention not in targets))
        return
    if OFFLOAD in targets:
        _swap(block, _OffloadForward)
        return
    for target in sorted(targets):
        part = family.recompute[target]
        mixin = _CheckpointForward if part.method == "forward" else _checkpoint_method(part.method)
        for name in part.submodules:
            _swap(block.get_submodule(name), mixin)


class _Swapped:
    """Base of every mixin placed in front of a module's class; marks a recompute swap."""

    prefix = "Recompute"


class _CheckpointForward(_Swapped):
    """The whole forward under checkpoint: keeps only the inputs."""

    def forward(self, *args, **kwargs):
        return checkpoint(super().forward, *args, use_reentrant=False, **kwargs)


@functools.cache
def _selective_forward(*, alternate: bool, keep_attention: bool) -> type:
    """A mixin running the forward under checkpoint with the ops policy (`matmul_policy`)."""
    context_fn = selective_context_fn(alternate=alternate, keep_attention=keep_attention)

    def forward(self, *args, **kwargs):
        # context_fn only when needed: torch.compile rejects an explicit noop_context_fn.
        return checkpoint(super(mixin, self).forward, *args, use_reentrant=False,
                          context_fn=context_fn, **kwargs)

    name = "_Selective" + ("Alternate" if alternate else "") + ("" if keep_attention
                                                                else "NotAttention")
    mixin = type(name, (_Swapped,), {"forward": forward})
    return mixin


@functools.cache
def _checkpoint_method(method: str) -> type:
    """A mixin running `method` (a part of a module's forward the family names, such as an
    MLP's activation product or the attention core) under checkpoint: keeps the method's
    inputs, re-runs it in backward. Named Recompute<first word of the method>."""

    def checkpointed(self, *args, **kwargs):
        original = getattr(super(mixin, self), method)
        return checkpoint(original, *args, use_reentrant=False, **kwargs)

    prefix = "Recompute" + method.split("_")[0].capitalize()
    mixin = type(f"_Checkpoint_{method}", (_Swapped,), {method: checkpointed, "prefix": prefix})
    return mixin


class _OffloadForward(_Swapped):
    """The forward with every activation saved for backward moved to CPU memory."""

    prefix = "Offload"

    # Dynamo cannot trace into saved-tensor hooks: this frame stays eager (a compiled block
    # compiles the original forward it calls, as one graph) and the hooks see what the
    # compiled graph saves.
    @torch.compiler.disable(recursive=False)
    def forward(self, *args, **kwargs):
        with _SaveActivationsOnCpu(pin_memory=torch.cuda.is_available()):
            return super().forward(*args, **kwargs)


class _SaveActivationsOnCpu(torch.autograd.graph.saved_tensors_hooks):
    """`torch.autograd.graph.save_on_cpu`, except that only plain activations move. Parameters
    (and views of them, such as the transposed weight a matmul saves) stay: copying weights to
    the host every forward costs bandwidth and host memory, and under FSDP2 it would hold a
    host copy of every unsharded weight. Tensor subclasses stay too (eager tensor parallelism
    saves DTensors; a compiled block saves plain local tensors, which do move), and so do
    tensors already on the CPU."""

    def __init__(self, *, pin_memory: bool):
        def pack(tensor: torch.Tensor):
            if tensor.device.type == "cpu" or not is_offloadable(tensor):
                return None, tensor
            packed = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout,
                                 pin_memory=pin_memory)
            packed.copy_(tensor)
            return tensor.device, packed

        def unpack(packed):
            device, tensor = packed
            return tensor if device is None else tensor.to(device, non_blocking=pin_memory)

        super().__init__(pack, unpack)


def is_offloadable(tensor: torch.Tensor) -> bool:
    """A plain tensor that is not a parameter or a view of one (offload moves only these)."""
    return type(tensor) is torch.Tensor and not isinstance(tensor._base, nn.Parameter)


def _swap(module: nn.Module, mixin: type) -> None:
    module.__class__ = _swapped_class(mixin, type(module))


@functools.cache
def _swapped_class(mixin: type, module_class: type) -> type:
    return type(f"{mixin.prefix}{module_class.__name__}", (mixin, module_class), {})


@functools.cache
def _attention_ops() -> frozenset:
    return frozenset(op for op in _saved_ops() if "scaled_dot_product" in str(op))


@functools.cache
def _matmul_ops() -> frozenset:
    return frozenset(op for op in _saved_ops() if op not in _attention_ops()
                     and "reduce_scatter" not in str(op))


@functools.cache
def _saved_ops() -> frozenset:
    aten = torch.ops.aten
    names = [
        "mm", "addmm", "bmm", "_scaled_mm", "_grouped_mm",  # _grouped_mm: MoE experts
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable",
    ]
    ops = {getattr(aten, name).default for name in names if hasattr(aten, name)}
    c10d = getattr(torch.ops, "_c10d_functional", None)
    if c10d is not None and hasattr(c10d, "reduce_scatter_tensor"):
        ops.add(c10d.reduce_scatter_tensor.default)  # SP outputs: never re-communicate
    return frozenset(ops)


def _indexed_blocks(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(global layer index, block): a ModuleDict's keys are the global indices, so a pipeline
    stage that holds blocks 4..7 picks the same blocks a whole model would."""
    layers = getattr(model, BLOCKS)
    if isinstance(layers, nn.ModuleDict):
        return [(int(key), block) for key, block in layers.items()]
    return list(enumerate(layers))
