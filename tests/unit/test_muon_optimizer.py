"""optim=muon in one process: Muon steps exactly the 2-D weights inside the blocks, AdamW the
rest; one step equals torch.optim.Muon and torch.optim.AdamW stepped side by side (bit for
bit); a state dict saved after a step and loaded into a fresh optimizer continues exactly;
the plan's optimizer state equals what the optimizer holds."""
from __future__ import annotations

import copy

import torch

from parallel.cost.memory import static_bytes
from parallel.cost.optimizer_state import newton_schulz_flops
from tests.support.specs import cpu_spec
from training.model_builder import build_model
from training.muon import MuonWithAdamW
from training.optim import build_optimizer, param_groups

MUON = ("model=tiny", "optim=muon", "optim.lr=1e-2", "optim.weight_decay=0.1")


def _model(spec):
    return build_model(spec.model, device=torch.device("cpu"), seed=0)


def _set_grads(model, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator)


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
    spec = cpu_spec(*MUON)
    model = _model(spec)
    optimizer = build_optimizer(model, optim=spec.optim)
    assert isinstance(optimizer, MuonWithAdamW)
    names = {p: n for n, p in model.named_parameters()}
    muon = {names[p] for g in optimizer.muon.param_groups for p in g["params"]}
    adamw = {names[p] for g in optimizer.adamw.param_groups for p in g["params"]}
    assert muon == {n for n, p in model.named_parameters()
                    if n.startswith("layers.") and p.ndim == 2}
    assert "tok_embeddings.weight" in adamw and "output.weight" in adamw
    assert "layers.0.attention_norm.weight" in adamw and not muon & adamw
    assert optimizer.param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"


def test_one_step_equals_torch_muon_and_adamw_side_by_side():
    spec = cpu_spec(*MUON)
    ours, theirs = _model(spec), _model(spec)
    optimizer = build_optimizer(ours, optim=spec.optim)
    matrices = [p for n, p in theirs.named_parameters() if n.startswith("layers.") and p.ndim == 2]
    rest = [p for p in theirs.parameters() if all(p is not m for m in matrices)]
    o = spec.optim
    torch_muon = torch.optim.Muon(matrices, lr=o.lr, weight_decay=o.weight_decay,
                                  momentum=o.momentum, nesterov=o.nesterov,
                                  ns_steps=o.ns_steps, adjust_lr_fn="match_rms_adamw")
    torch_adamw = torch.optim.AdamW(param_groups(rest, o.weight_decay), lr=o.lr,
                                    betas=(o.beta1, o.beta2), eps=o.eps, foreach=True)
    for seed in range(2):
        _set_grads(ours, seed)
        _set_grads(theirs, seed)
        optimizer.step()
        torch_muon.step()
        torch_adamw.step()
    for (name, mine), other in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.equal(mine, other), name
        assert not torch.equal(mine, _model(spec).state_dict()[name]), name


def test_state_dict_round_trip_continues_exactly():
    spec = cpu_spec(*MUON)
    first = _model(spec)
    optimizer = build_optimizer(first, optim=spec.optim)
    _set_grads(first, 0)
    optimizer.step()
    second = _model(spec)
    second.load_state_dict(first.state_dict())
    loaded = build_optimizer(second, optim=spec.optim)
    loaded.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # no shared tensors
    assert loaded.muon.state is loaded.state and loaded.adamw.param_groups[0] is loaded.param_groups[-2]
    for model, opt in ((first, optimizer), (second, loaded)):
        _set_grads(model, 1)
        opt.step()
    for (name, a), b in zip(first.named_parameters(), second.parameters()):
        assert torch.equal(a, b), name


def test_plan_counts_one_muon_buffer_and_two_adamw_moments():
    spec = cpu_spec(*MUON, "cluster.procs_per_node=1", "parallel=single")
    model = _model(spec)
    optimizer = build_optimizer(model, optim=spec.optim)
    _set_grads(model, 0)
    optimizer.step()
    held = sum(t.numel() * t.element_size() for state in optimizer.state.values()
               for t in state.values())
    assert static_bytes(spec, 0).optimizer == held
    adamw_spec = cpu_spec("model=tiny", "cluster.procs_per_node=1", "parallel=single")
    assert static_bytes(spec, 0).optimizer < static_bytes(adamw_spec, 0).optimizer


def test_newton_schulz_flops_count_the_quintic_per_iteration():
    # m=2 <= n=3: X X^T 2*2*2*3, its square 2*2^3, the product with X 2*2*2*3 = 64 a step
    assert newton_schulz_flops((3, 2), 5) == newton_schulz_flops((2, 3), 5) == 5 * 64


def test_plan_times_newton_schulz_and_gathers_only_what_is_sharded():
    from parallel.cost.plan import make_plan
    from parallel.cost.step_time import estimate_time

    def breakdown(*overrides):
        spec = cpu_spec("model=tiny", "cluster.procs_per_node=2", *overrides)
        return estimate_time(spec, make_plan(spec)).breakdown

    adamw, ddp, fsdp = (breakdown("parallel=ddp"), breakdown("parallel=ddp", "optim=muon"),
                        breakdown("parallel=zero3", "optim=muon"))
    assert adamw.muon_s == 0 and "muon" not in adamw.comm_by_axis
    assert ddp.muon_s > 0 and ddp.optimizer_s == adamw.optimizer_s + ddp.muon_s
    assert "muon" not in ddp.comm_by_axis  # DDP's matrices are whole: nothing gathered
    assert fsdp.comm_by_axis["muon"] > 0 and fsdp.muon_s == ddp.muon_s  # every rank: all
