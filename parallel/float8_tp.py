"""fp8 under tensor parallel: torchao's Float8 TP styles where fp8 converted a block's linears.

With precision=fp8 the block linears are torchao `Float8Linear`s (training/precision.py
`apply_fp8`, before TP). The plain DTensor styles would all-gather their inputs in bf16 and
hand them to a Float8Linear that casts after the gather; torchao's styles
(`torchao.float8.float8_tensor_parallel`: `Float8ColwiseParallel`, `Float8RowwiseParallel`,
`PrepareFloat8ModuleInput`, as torchtitan's `parallelize_llama` uses them) cast to fp8 first,
so under sequence parallel the all-gather of a column-parallel input moves fp8 (e4m3,
forward) and so does the all-gather of a row-parallel output's gradient (e5m2, backward:
the gradient is cast before the gather); the reduce-scatters stay in bf16. The weights are
split exactly as by the plain styles. The cost model counts the same bytes
(parallel/cost/comm.py `tp_gather_bytes`).

Only modules fp8 converted get a Float8 style (the output head stays bf16, and anything else
`convert_to_float8_training` left alone keeps its plain style); a gathered input is cast to
fp8 only where every linear under it is a converted tp module (a consumer in bf16 would get
an fp8 tensor). CUDA only: torchao is imported here, inside the functions, and only when
precision=fp8, so the CPU path never imports it.
"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

from training.models.family import TpPlan


def is_float8_linear(module: nn.Module) -> bool:
    from torchao.float8.float8_linear import Float8Linear

    return isinstance(module, Float8Linear)


def float8_paths(block: nn.Module, tp: TpPlan, *,
                 converted: Callable[[nn.Module], bool] = is_float8_linear) -> frozenset[str]:
    """The block's tp modules (column, row) that fp8 converted, and its gathered-input modules
    every linear under which is one of them (`converted` tells a converted module)."""
    split = [path for path in (*tp.column, *tp.row)
             if _find(block, path) is not None and converted(_find(block, path))]
    gathered = []
    for path in tp.gathered_inputs:
        module = _find(block, path)
        if module is None:
            continue
        linears = [f"{path}.{name}" for name, sub in module.named_modules()
                   if isinstance(sub, nn.Linear)]
        if linears and all(name in split for name in linears):
            gathered.append(path)
    return frozenset((*split, *gathered))


def float8_styles() -> tuple[type, type, type]:
    """torchao's (column, row, gathered-input) styles."""
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    return Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput


def _find(block: nn.Module, path: str) -> nn.Module | None:
    try:
        return block.get_submodule(path)
    except AttributeError:
        return None
