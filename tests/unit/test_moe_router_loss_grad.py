"""Router losses on pipeline stages (training/models/moe/model/router_loss_grad.py): the
output that carries a loss's gradient gives exactly the gradient of output + weight x loss;
tiny_moe cut into two stages run by hand as torch's schedule runs them (each stage's backward
from its output's gradient only) gives the one-process gradient of the language loss plus
the router losses x target tokens; a forward outside a stage's real forwards (torch's shape
inference) counts no load, and its input-only backward writes no parameter gradient."""
from __future__ import annotations

import torch

from parallel.pipeline import build_stage_module
from tests.support.specs import cpu_spec
from training.loss import token_cross_entropy_sum
from training.model_builder import build_model
from training.models.moe.model.router_loss_grad import with_router_loss_grad
from training.router_losses import moe_layers, with_router_losses


def test_the_gradient_is_that_of_output_plus_weighted_loss():
    torch.manual_seed(0)
    weight = torch.randn(4, 6, requires_grad=True)
    x = torch.randn(3, 4)
    hidden = x @ weight
    loss = torch.logsumexp(hidden, -1).pow(2).mean()
    upstream = torch.randn(3, 6)
    (with_router_loss_grad(hidden, loss, torch.tensor(2.5)) * upstream).sum().backward()
    got = weight.grad.clone()
    weight.grad = None
    hidden = x @ weight
    ((hidden * upstream).sum() + 2.5 * torch.logsumexp(hidden, -1).pow(2).mean()).backward()
    torch.testing.assert_close(got, weight.grad, atol=0, rtol=0)
    assert got.abs().sum() > 0
    carried = with_router_loss_grad(x @ weight, torch.zeros((), requires_grad=True), 1.0)
    carried.detach_()  # torch's split backward does this to stage outputs: not a view


def _spec():
    return cpu_spec("model=tiny_moe", "model.dim=16", "model.n_heads=2", "model.n_kv_heads=1",
                    "model.n_layers=4", "data=synthetic", "model.moe.aux_loss_coef=0.5",
                    "model.moe.z_loss_coef=0.1")


def _model_and_stages(spec):
    """tiny_moe and its two stages (cut after block 1), copies of the same weights."""
    model = build_model(spec.model, device=torch.device("cpu"), seed=0)
    return model, (build_stage_module(model, keep_layers=["0", "1"], first=True, last=False),
                   build_stage_module(model, keep_layers=["2", "3"], first=False, last=True))


def _one_process(model, tokens, targets):
    """The reference: language loss + router losses x target tokens, backward."""
    loss_sum = token_cross_entropy_sum(model(tokens), targets)
    with_router_losses(model, loss_sum, targets).backward()
    loads = {i: m.load_since_read.clone() for i, m in moe_layers([model]).items()}
    return {n: p.grad.clone() for n, p in model.named_parameters()}, loads


def _two_stages(first, last, tokens, targets, *, first_carries: bool = True):
    """The stages run as the schedule runs them: torch's metadata forward and input-only
    backward, then the real forward of each stage inside `pipeline_microbatch`, and each
    stage's backward from its output's gradient."""
    for stage in (first, last):
        stage.as_pipeline_stage()
    shape_inference = first(tokens).detach().requires_grad_()
    torch.autograd.grad(last(shape_inference).sum(), shape_inference)
    assert all(p.grad is None for s in (first, last) for p in s.parameters())
    assert all(m.load_since_read.sum() == 0 for m in moe_layers([first, last]).values())
    weight = torch.tensor(float(targets.numel()))  # target tokens x loss scale 1
    with first.pipeline_microbatch(weight if first_carries else None):
        hidden = first(tokens)
    received = hidden.detach().requires_grad_()
    with last.pipeline_microbatch(weight):
        token_cross_entropy_sum(last(received), targets).backward()
    hidden.backward(received.grad)
    grads = {n: p.grad for s in (first, last) for n, p in s.named_parameters()}
    return grads, {i: m.load_since_read for i, m in moe_layers([first, last]).items()}


def _batch(vocab: int):
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, vocab, (2, 12), generator=g),
            torch.randint(0, vocab, (2, 12), generator=g))


def test_two_stages_give_the_one_process_gradient_with_router_losses():
    spec = _spec()
    tokens, targets = _batch(spec.model.vocab_size)
    model, (first, last) = _model_and_stages(spec)
    reference, reference_loads = _one_process(model, tokens, targets)
    grads, loads = _two_stages(first, last, tokens, targets)
    assert grads.keys() == reference.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference[name], atol=1e-6, rtol=1e-5, msg=name)
    assert loads.keys() == reference_loads.keys() == {1, 2, 3}
    for i, load in loads.items():
        torch.testing.assert_close(load, reference_loads[i])  # counted once, not at inference


def test_a_stage_whose_output_carries_no_router_loss_misses_its_gradient():
    """The check above can fail: without the first stage's router losses on its output, its
    router's gradient is not the one-process one."""
    spec = _spec()
    tokens, targets = _batch(spec.model.vocab_size)
    model, (first, last) = _model_and_stages(spec)
    reference, _ = _one_process(model, tokens, targets)
    grads, _ = _two_stages(first, last, tokens, targets, first_carries=False)
    name = "layers.1.moe.router.weight"
    assert (grads[name] - reference[name]).abs().max() > 1e-4
    torch.testing.assert_close(grads["layers.3.moe.router.weight"],
                               reference["layers.3.moe.router.weight"], atol=1e-6, rtol=1e-5)
