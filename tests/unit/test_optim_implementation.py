"""AdamW's kernel choice: fused when every parameter is on CUDA; foreach on CPU where one list
can take every parameter (plain tensors, or DTensors of one mesh), which must then update the
weights bit for bit like torch's per-tensor loop (the CPU references depend on it)."""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from tests.support.specs import cpu_spec
from training.optim import build_optimizer, implementation, param_groups


def test_cpu_parameters_take_foreach_meta_and_none_keep_torchs_default():
    assert implementation([torch.zeros(2), torch.zeros(2, 2)]) == {"foreach": True}
    assert implementation([torch.empty(2, device="meta")]) == {}
    assert implementation([]) == {}
    optimizer = build_optimizer(torch.nn.Linear(4, 4), optim=cpu_spec("model=tiny").optim)
    assert optimizer.defaults["foreach"] and not optimizer.defaults["fused"]


def test_a_mix_of_plain_tensors_and_dtensors_keeps_torchs_default(tmp_path):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", [0])
        shard = DTensor.from_local(torch.zeros(2), mesh, [Replicate()])
        assert implementation([shard, shard]) == {"foreach": True}
        assert implementation([shard, torch.zeros(2)]) == {}
    finally:
        dist.destroy_process_group()


def _updated(kwargs: dict) -> list[torch.Tensor]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in [(64, 32), (32,), (96, 64)]]
    optimizer = torch.optim.AdamW(param_groups(params, 0.1), lr=3e-3, betas=(0.9, 0.95),
                                  eps=1e-8, **kwargs)
    grads = torch.Generator().manual_seed(1)
    for _ in range(4):
        for p in params:
            p.grad = torch.randn(p.shape, generator=grads)
        optimizer.step()
    return [p.detach() for p in params]


def test_foreach_updates_cpu_weights_bit_for_bit_like_the_per_tensor_loop():
    loop, foreach = _updated({"foreach": False}), _updated(implementation([torch.zeros(1)]))
    assert all(torch.equal(a, b) for a, b in zip(loop, foreach))
