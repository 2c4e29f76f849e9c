"""Activation recompute and offload: same numbers as no recompute, same names, the saved
activation memory the plan's formula says, and composition with torch.compile and FSDP2.

Saved-activation bytes are measured (tests/support/recompute_storages.py) as the storages created during forward that are still alive
when forward returns (everything backward will use), unique storages, bytes. `saved_tensors_hooks`
alone cannot see what selective recompute keeps: checkpointing installs its own hooks inside each
checkpointed region, and the ops policy caches op outputs outside autograd's saved tensors.
"""
from __future__ import annotations

import copy
import itertools

import pytest
import torch

from conf.rules.split_rules import RECOMPUTE_TARGETS
from conf.schema import RecomputeMode
from conf.spec import RecomputeSpec
from parallel.cost.activations import activation_bytes, activation_elements_per_token_per_layer
from parallel.recompute import (
    apply_recompute,
    block_targets,
    is_offloadable,
)
from tests.support.recompute_storages import (
    BATCH, BYTES_FP32, POLICIES, SEQ, next_token_loss, recompute_model, saved_activation_bytes,
    selective, token_batch,
)
from tests.support.specs import tiny_model_spec
from training.model_builder import build_model

CPU = torch.device("cpu")
ALL_TARGET_SETS = [combo for n in range(1, len(RECOMPUTE_TARGETS) + 1)
                   for combo in itertools.combinations(RECOMPUTE_TARGETS, n)]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: a second intra-op thread only adds contention (10x slower on a
    busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _loss_and_grads(model, batch):
    loss = next_token_loss(model, batch)
    loss.backward()
    return loss.detach(), {name: _full(p.grad) for name, p in model.named_parameters()}


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # FSDP2 DTensor


def _assert_same(loss, grads, reference_loss, reference_grads):
    torch.testing.assert_close(loss, reference_loss, atol=1e-6, rtol=0)
    assert list(grads) == list(reference_grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_recompute_gives_same_loss_and_gradients(policy, tied):
    batch = token_batch()
    reference = _loss_and_grads(recompute_model(POLICIES["none"], tie_embeddings=tied), batch)
    _assert_same(*_loss_and_grads(recompute_model(POLICIES[policy], tie_embeddings=tied), batch),
                 *reference)


@pytest.mark.parametrize("policy", POLICIES)
def test_recompute_keeps_names(policy):
    reference = recompute_model(POLICIES["none"])
    model = recompute_model(POLICIES[policy])
    assert list(model.state_dict()) == list(reference.state_dict())
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in reference.named_parameters()]
    assert [n for n, _ in model.named_modules()] == [n for n, _ in reference.named_modules()]
    model.load_state_dict(reference.state_dict())  # loads without any key translation


def _class_names(model) -> dict[str, str]:
    return {name: type(module).__name__ for name, module in model.named_modules()
            if type(module).__name__.startswith(("Recompute", "Offload"))}


def test_each_policy_swaps_the_classes_it_names():
    layers = dict(n_layers=3)
    assert _class_names(recompute_model(POLICIES["full_every2"], **layers)) == {
        "layers.0": "RecomputeTransformerBlock", "layers.2": "RecomputeTransformerBlock"}
    assert _class_names(recompute_model(selective("swiglu", "norm", "attention", "ffn"), n_layers=1)) == {
        "layers.0.attention_norm": "RecomputeRMSNorm", "layers.0.ffn_norm": "RecomputeRMSNorm",
        "layers.0.attention": "RecomputeCoreAttention",
        "layers.0.feed_forward": "RecomputeFeedForward"}  # ffn covers swiglu
    assert _class_names(recompute_model(selective("swiglu"), n_layers=1)) == {
        "layers.0.feed_forward": "RecomputeSwigluFeedForward"}
    assert _class_names(recompute_model(selective("ops", "norm", "swiglu"), n_layers=1)) == {
        "layers.0": "RecomputeTransformerBlock"}
    assert _class_names(recompute_model(selective("block", "attention"), n_layers=1)) == {
        "layers.0": "RecomputeTransformerBlock"}
    assert _class_names(recompute_model(POLICIES["offload_every2"], **layers)) == {
        "layers.0": "OffloadTransformerBlock", "layers.2": "OffloadTransformerBlock"}


def test_every_n_layers_counts_global_layer_indices():
    every3 = RecomputeSpec(mode=RecomputeMode.full, every_n_layers=3)
    assert [i for i in range(8) if every3.applies_to(i)] == [0, 3, 6]
    model = build_model(tiny_model_spec(n_layers=4), device=CPU, seed=0)
    del model.layers["0"], model.layers["1"]  # a pipeline stage holding blocks 2 and 3
    apply_recompute(model, recompute=POLICIES["full_every2"])
    assert _class_names(model) == {"layers.2": "RecomputeTransformerBlock"}


def test_block_targets_drop_what_another_target_covers():
    assert block_targets(mode=RecomputeMode.full) == {"block"}
    assert block_targets(mode=RecomputeMode.selective, targets=["block", "ops", "norm"]) == {"block"}
    assert block_targets(mode=RecomputeMode.selective, targets=["ops", "attention", "ffn", "norm"]) == {
        "ops", "attention"}
    assert block_targets(mode=RecomputeMode.selective, targets=["ffn", "swiglu", "norm"]) == {"ffn", "norm"}


def test_mode_accepts_plain_strings_and_none_changes_nothing():
    model = recompute_model(POLICIES["none"])
    assert all(type(block).__name__ == "TransformerBlock" for block in model.layers.values())
    apply_recompute(model, recompute=RecomputeSpec(mode=RecomputeMode.selective))
    assert all(type(block).__name__ == "RecomputeTransformerBlock"
               for block in model.layers.values())
    with pytest.raises(AssertionError, match="applied twice"):
        apply_recompute(model, recompute=RecomputeSpec(mode=RecomputeMode.selective, targets=("norm",)))


@pytest.mark.parametrize("policy", ["ops", "swiglu_norm_attention", "offload"])
def test_recomputed_model_survives_deepcopy(policy):
    model = recompute_model(POLICIES[policy])
    clone = copy.deepcopy(model)
    batch = token_batch()
    torch.testing.assert_close(next_token_loss(clone, batch), next_token_loss(model, batch))
    next_token_loss(clone, batch).backward()
    assert model.layers["0"].attention.wq.weight.grad is None  # the copy owns its parameters


@pytest.mark.parametrize("policy", ["full", "ops_attention", "ops_alternate",
                                    "swiglu_norm_attention", "ffn", "offload_every2"])
def test_compiled_blocks_give_same_numbers_without_graph_breaks(policy):
    """What the trainer does: recompute, then `block.compile()` per block (aot_eager here: the
    same Dynamo and AOTAutograd tracing as inductor, without a C++ compiler)."""
    from torch._dynamo.utils import counters

    batch = token_batch()
    reference = _loss_and_grads(recompute_model(POLICIES["none"]), batch)
    torch._dynamo.reset()
    counters.clear()
    model = recompute_model(POLICIES[policy])
    for block in model.layers.values():
        block.compile(backend="aot_eager")
    _assert_same(*_loss_and_grads(model, batch), *reference)
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_fsdp2_swaps_classes_again_on_top(one_rank_group):
    """fully_shard after recompute derives FSDP<class> from the swapped class; numbers and
    names stay (one rank: the point is the class machinery, not the sharding)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh("cpu", (1,))
    batch = token_batch()
    reference = _loss_and_grads(recompute_model(POLICIES["none"]), batch)
    for policy in ["full", "ops", "swiglu_norm_attention", "offload"]:
        model = recompute_model(POLICIES[policy])
        for block in model.layers.values():
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        assert isinstance(model.layers["0"], FSDPModule)
        _assert_same(*_loss_and_grads(model, batch), *reference)


def test_saved_activation_bytes_order():
    batch = token_batch()
    saved = {name: saved_activation_bytes(recompute_model(policy), batch)
             for name, policy in POLICIES.items()}
    print("saved activation bytes:", saved)
    assert saved["full"] == saved["block"] < saved["ops_alternate"] < saved["ops"] < saved["none"]
    assert saved["ops_alternate_attention"] < saved["ops_alternate"]
    assert saved["full"] < saved["full_every2"] < saved["none"]
    for name in ["ffn", "swiglu", "norm", "attention", "swiglu_norm_attention"]:
        assert saved[name] < saved["none"], name
    assert saved["offload"] == saved["none"]  # on a CPU device host memory is device memory


def _check_plan_estimate(recompute: RecomputeSpec, batch: torch.Tensor) -> None:
    tokens = BATCH * SEQ
    measured = {n: saved_activation_bytes(recompute_model(recompute, n_layers=n), batch) for n in (2, 3)}
    per_layer = activation_elements_per_token_per_layer(tiny_model_spec(), recompute=recompute,
                                                        device_type="cpu")
    if recompute.applies_to(2):
        assert measured[3] - measured[2] == per_layer * tokens * BYTES_FP32, recompute
    for n, bytes_ in measured.items():
        estimate = activation_bytes(tiny_model_spec(n_layers=n), tokens=tokens,
                                    recompute=recompute, dtype_bytes=BYTES_FP32,
                                    device_type="cpu")
        # _loss slices the targets out of the batch, so flatten copies them (8 B a token);
        # the trainer's targets are contiguous and not activations
        assert 0 <= bytes_ - estimate - 8 * tokens <= 64, (recompute, n, bytes_, estimate)


@pytest.mark.parametrize("policy", POLICIES)
def test_saved_activation_bytes_match_the_plan_estimate(policy):
    """The plan's activation formula (parallel/cost/activations.py) against what forward keeps:
    per block exactly (3 layers minus 2), and in total within the few bytes of scalars."""
    _check_plan_estimate(POLICIES[policy], token_batch())


def test_plan_estimate_matches_every_combination_of_targets():
    batch = token_batch()
    for targets in ALL_TARGET_SETS:
        _check_plan_estimate(selective(*targets), batch)


def test_offload_moves_every_saved_activation_and_no_parameter():
    """What offload's hooks would move off a GPU: every storage none keeps (so an offloaded
    block keeps nothing in GPU memory, as the plan says for device_type="cuda") and no
    parameter storage. On this CPU machine the hooks' decision is checked, not the copy."""
    model, batch = recompute_model(POLICIES["none"]), token_batch()
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    buffers = {b.untyped_storage().data_ptr() for b in [*model.buffers(), batch]}
    moved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        assert is_offloadable(tensor) != (storage.data_ptr() in parameters), tensor.shape
        if is_offloadable(tensor) and storage.data_ptr() not in buffers:
            moved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = next_token_loss(model, batch)
    kept = saved_activation_bytes(recompute_model(POLICIES["none"]), batch)
    assert sum(moved.values()) + BYTES_FP32 == kept  # the loss itself is alive, not saved
    loss.backward()
