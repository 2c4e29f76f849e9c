"""Precision policy at run time: autocast context and the fp16 loss scaler."""
from __future__ import annotations

import contextlib

import torch

from conf.schema import DType, Precision
from conf.spec import PrecisionSpec
from training.models import family_of

TORCH_DTYPES = {DType.fp32: torch.float32, DType.bf16: torch.bfloat16, DType.fp16: torch.float16}


def autocast_context(precision: PrecisionSpec, device: torch.device):
    """Matmuls in the compute dtype; parameters stay fp32 (the master weights)."""
    dtype = TORCH_DTYPES[precision.compute_dtype]
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def mixed_precision_policy(precision: PrecisionSpec):
    """FSDP2: compute in the compute dtype from fp32 master shards; reduce in reduce_dtype."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    compute = precision.compute_dtype
    param_dtype = None if compute is DType.fp32 else TORCH_DTYPES[compute]
    return MixedPrecisionPolicy(param_dtype=param_dtype,
                                reduce_dtype=TORCH_DTYPES[precision.reduce_dtype])


def build_grad_scaler(precision: PrecisionSpec):
    """A dynamic loss scaler for fp16 (agreeing across sharded ranks); None otherwise."""
    if not precision.uses_loss_scaling:
        return None
    from training.loss_scale import DynamicLossScaler

    return DynamicLossScaler(init_scale=precision.loss_scale_init)


def apply_fp8(model: torch.nn.Module, precision: PrecisionSpec) -> None:
    """fp8 matmuls through torchao (resolve() allows fp8 only on CUDA cc >= 8.9)."""
    if precision.name is not Precision.fp8:
        return
    from torchao.float8 import convert_to_float8_training

    head = family_of(model.spec).head  # the output head stays in bf16
    convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != head)
