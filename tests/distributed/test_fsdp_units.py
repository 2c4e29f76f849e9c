"""FSDP units (parallel/fsdp.py) on 2 gloo ranks, bf16: which weights are still gathered
when forward ends, against the plan's weight copies (parallel/cost/memory.py).

zero=3: only the head unit (final norm + head; with tied embeddings the embedding too) stays
gathered — the untied embedding and every block were re-sharded after their forward; the
plan adds the block in use on top of that (the one prefetched in backward is a collective
buffer of the backward phases, parallel/cost/peak.py). zero=2: every
unit stays gathered, which is the whole plan term."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from conf.spec import RunSpec
from conf.run_dir.spec_io import spec_from_dict, spec_to_dict
from parallel.cost.activations import DTYPE_BYTES
from parallel.cost.memory import weight_copy_bytes
from parallel.cost.params import numel, parameter_shapes
from tests.support.layout_parity import CPU
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec

pytestmark = pytest.mark.distributed
BASE = ("model=tiny", "data=synthetic", "training.seq_len=32", "training.micro_batch_size=2",
        "precision=bf16", "parallel=fsdp", "cluster.procs_per_node=2")
CASES = {"zero3": ("parallel.zero=3",), "zero2": ("parallel.zero=2",),
         "zero3_tied": ("parallel.zero=3", "model.tie_embeddings=true")}


def gathered_after_forward(*, rank: int, world_size: int, spec_dicts: dict) -> dict:
    """Per case: {parameter name: bytes} of the weights not sharded when forward returns."""
    from training.data.build import build_train_batches
    from training.parallel_model import build_parallel_model
    from training.step import forward_backward
    from training.precision import autocast_context

    found = {}
    for case, spec_dict in spec_dicts.items():
        spec = spec_from_dict(RunSpec, spec_dict)
        layout = build_parallel_model(spec, rank=rank, device=CPU)
        part = layout.parts[0]
        seen: dict[str, int] = {}
        part.register_forward_hook(lambda module, args, out: seen.update(_gathered(module)))
        batches = build_train_batches(spec.data, spec.training, dp_rank=rank, dp_size=2)
        forward_backward(layout, batches.next_step(), device=CPU,
                         autocast=autocast_context(spec.precision, CPU))
        found[case] = seen
    return found


def _gathered(model: torch.nn.Module) -> dict[str, int]:
    """FSDP2 swaps each module's registered parameter for the unsharded (plain) tensor while a
    unit is gathered, and back to its sharded DTensor when it re-shards."""
    out = {}
    for module_name, module in model.named_modules():
        for name in module._parameters:
            tensor = getattr(module, name)
            if tensor is not None and not isinstance(tensor, DTensor):
                key = f"{module_name}.{name}" if module_name else name
                out[key] = tensor.numel() * tensor.element_size()
    return out


def test_units_left_gathered_after_forward_match_the_plan(tmp_path):
    specs = {case: cpu_spec(*BASE, *extra) for case, extra in CASES.items()}
    results = run_on_ranks(gathered_after_forward, world_size=2, workdir=tmp_path,
                           kwargs={"spec_dicts": {c: spec_to_dict(s) for c, s in specs.items()}})
    for rank, found in enumerate(results):
        assert set(found["zero3"]) == {"norm.weight", "output.weight"}, found["zero3"]
        assert set(found["zero3_tied"]) == {"tok_embeddings.weight", "norm.weight"}
        names = {name for name, _ in parameter_shapes(specs["zero2"].model)}
        assert set(found["zero2"]) == names
        assert sum(found["zero2"].values()) == weight_copy_bytes(specs["zero2"], rank)
        for case in ("zero3", "zero3_tied"):
            spec = specs[case]
            block = sum(numel(shape) for name, shape in parameter_shapes(spec.model)
                        if name.startswith("layers.0."))
            in_use = block * DTYPE_BYTES[spec.precision.compute_dtype.value]  # the prefetched
            # one is a collective buffer (parallel.cost.peak.collective_buffer_bytes)
            assert sum(found[case].values()) + in_use == weight_copy_bytes(spec, rank), case
