"""Document masking in one process (parallel/document_masking.py, training/models/llama/model.py): document ids
and positions from EOS tokens, a packed batch equal to its documents run one by one (per
document losses and logits, RoPE rows, gradients; fp32), the knob off leaving the model's
plain causal path untouched, and resolve() refusing data.document_mask where no token ends a
document. The tp / cp / pp layouts: tests/distributed/test_document_mask_layouts.py."""
from __future__ import annotations

import json

import pytest
import torch

from conf.compose import compose_config
from conf.errors import ConfigError
from conf.resolve import resolve
from conf.spec import HostSpec
from parallel.document_masking import document_ids_and_positions
from tests.support.packed_documents import (
    ATOL, EOS, LENGTHS, NO_AUTOCAST, RTOL, document_batches, document_targets_count,
    packed_batch, packed_documents,
)
from tests.support.specs import tiny_model_spec
from training.loss import IGNORE_INDEX
from training.model_builder import build_model
from training.parallel_model import ParallelModel
from training.step import forward_backward, token_loss_sum

CPU = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=8)


def test_ids_and_positions_restart_after_each_eos():
    tokens = torch.tensor([[5, 6, EOS, 7, EOS, EOS, 8, 9],
                           [EOS, 4, 4, 4, 4, EOS, 4, 4]])
    ids, positions = document_ids_and_positions(tokens, eos_id=EOS)
    assert ids.tolist() == [[0, 0, 0, 1, 1, 2, 3, 3], [0, 1, 1, 1, 1, 1, 2, 2]]
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0, 0, 1], [0, 0, 1, 2, 3, 4, 0, 1]]


def _recording_rope_inputs(model) -> list[torch.Tensor]:
    """Record the rotated queries every attention core receives (first layer only)."""
    seen = []
    attention = model.layers["0"].attention
    core = attention.core_attention

    def record(q, k, v, **kwargs):
        seen.append(q.detach())
        return core(q, k, v, **kwargs)

    attention.core_attention = record
    return seen


def test_packed_equals_documents_one_by_one():
    """Per document: logits, first-layer rotated queries (RoPE restarts per document) and
    loss equal the document run alone; gradients equal the sum over documents."""
    torch.manual_seed(0)
    model = build_model(tiny_model_spec(), device=torch.device("cpu"), seed=7)
    rows = packed_documents(LENGTHS)
    inputs, targets = packed_batch(rows)
    queries = _recording_rope_inputs(model)
    layout = ParallelModel.single(model)
    layout.document_eos_id = EOS
    loss = forward_backward(layout, [(inputs, targets)], device=torch.device("cpu"),
                            autocast=NO_AUTOCAST)
    packed_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ids, positions = document_ids_and_positions(inputs, eos_id=EOS)
    with torch.no_grad():
        logits = model(inputs, doc_ids=ids, doc_positions=positions)
    packed_q = queries[-1]

    total = 0.0
    starts = [[sum(len(d) for d in docs[:i]) for i in range(len(docs))] for docs in rows]
    batches = iter(document_batches(rows))
    n_targets = document_targets_count(rows)
    for row, docs in enumerate(rows):
        for doc, start in zip(docs, starts[row]):
            x, y = next(batches)
            part = slice(start, start + len(doc))
            one = token_loss_sum(model, x, y, NO_AUTOCAST)
            (one / n_targets).backward()
            torch.testing.assert_close(queries[-1][0], packed_q[row, :, part], rtol=RTOL,
                                       atol=ATOL)
            with torch.no_grad():
                torch.testing.assert_close(model(x)[0], logits[row, part], rtol=RTOL, atol=ATOL)
            packed_doc_loss = torch.nn.functional.cross_entropy(
                logits[row, part], y[0], ignore_index=IGNORE_INDEX, reduction="sum")
            torch.testing.assert_close(packed_doc_loss, one.detach(), rtol=RTOL, atol=ATOL)
            total += float(one.detach())
    assert loss.global_tokens == n_targets
    assert float(loss.local_loss_sum) == pytest.approx(total, rel=RTOL)
    for name, param in model.named_parameters():
        torch.testing.assert_close(packed_grads[name], param.grad, rtol=RTOL, atol=ATOL,
                                   msg=lambda m, n=name: f"grad {n}: {m}")


def test_knob_off_keeps_the_plain_causal_model():
    """document_eos_id None (data.document_mask=false): the step calls the model without
    document keywords, so it is bit for bit the plain causal model, EOS tokens or not."""
    model = build_model(tiny_model_spec(), device=torch.device("cpu"), seed=7)
    inputs, targets = packed_batch(packed_documents(LENGTHS))
    loss = forward_backward(ParallelModel.single(model), [(inputs, targets)],
                            device=torch.device("cpu"), autocast=NO_AUTOCAST)
    with torch.no_grad():
        plain = token_loss_sum(model, inputs, targets, NO_AUTOCAST)
        masked = token_loss_sum(model, inputs, targets, NO_AUTOCAST,
                                dict(zip(("doc_ids", "doc_positions"),
                                         document_ids_and_positions(inputs, eos_id=EOS))))
    assert torch.equal(loss.local_loss_sum, plain)
    assert abs(float(masked) - float(plain)) > 1e-2  # the mask matters on this batch


def _tokenizer(tmp_path, *, with_eos: bool) -> str:
    vocab = {chr(ord("a") + i): i for i in range(8)}
    added = [{"content": "</s>", "id": 8}] if with_eos else []
    path = tmp_path / ("eos" if with_eos else "no_eos") / "tokenizer.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab, "merges": []},
                                "added_tokens": added}))
    return str(path)


def _resolve(*overrides: str):
    cfg = compose_config(["model=tiny", "logging=disabled", *overrides])
    return resolve(cfg, host=CPU, check_paths=False)


FILES = ("data=files", "data.train_files=/data/train.bin", "data.val_files=/data/val.bin")


@pytest.mark.parametrize("overrides, reason", [
    (("data=stdlib",), "data=stdlib has no token that ends a document"),
    (("data=synthetic",), "data=synthetic has no token that ends a document"),
    (FILES, "raw token files name no end-of-document token"),
])
def test_resolve_refuses_document_mask_without_a_separator(overrides, reason):
    with pytest.raises(ConfigError) as info:
        _resolve(*overrides, "data.document_mask=true")
    message = str(info.value)
    assert "data.document_mask=true:" in message and reason in message
    assert "data.prepared" in message and "data.document_mask=false" in message  # the fix


def test_resolve_takes_the_tokenizer_eos_or_refuses_one_without(tmp_path):
    spec = _resolve(*FILES, f"data.tokenizer={_tokenizer(tmp_path, with_eos=True)}",
                    "data.document_mask=true")
    assert spec.data.document_mask and spec.data.eos_id == 8
    no_eos = _tokenizer(tmp_path, with_eos=False)
    with pytest.raises(ConfigError, match="no EOS token known"):
        _resolve(*FILES, f"data.tokenizer={no_eos}", "data.document_mask=true")
    off = _resolve(*FILES, f"data.tokenizer={no_eos}")
    assert not off.data.document_mask and off.data.eos_id is None


def test_flex_block_mask_equals_the_sdpa_mask():
    """The flex-attention BlockMask (CUDA's path) allows exactly what the boolean SDPA mask
    allows: a context-parallel-like shard of queries over the whole sequence, lengths that are
    not multiples of flex's block size. Eager flex attention on CPU (slow, exact)."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    from parallel.document_masking import DenseDocumentMask, document_mask, masked_attention

    torch.manual_seed(0)
    tokens = torch.randint(EOS + 1, 50, (2, 40))
    tokens[0, [5, 17, 30]] = EOS
    tokens[1, [9, 10]] = EOS
    ids, _ = document_ids_and_positions(tokens, eos_id=EOS)
    q_pos = torch.tensor([*range(0, 10), *range(30, 40)])  # cp rank 0 of 2, balanced
    k_pos = torch.arange(40)
    q, k, v = torch.randn(2, 4, 20, 8), torch.randn(2, 2, 40, 8), torch.randn(2, 2, 40, 8)
    masks = {flex: document_mask(ids[:, q_pos], ids, q_positions=q_pos, k_positions=k_pos,
                                 flex=flex) for flex in (False, True)}
    assert isinstance(masks[False], DenseDocumentMask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        out = flex_attention(q, k, v, block_mask=masks[True], enable_gqa=True)
    torch.testing.assert_close(out, masked_attention(q, k, v, mask=masks[False]))


@pytest.mark.parametrize("policy", ["full", "ops_attention", "attention"])
def test_recompute_passes_the_document_mask_through(policy):
    """Recompute re-runs blocks / the attention core with the same document mask: the same
    loss and gradients as without recompute."""
    from parallel.recompute import apply_recompute
    from tests.support.recompute_storages import POLICIES

    inputs, targets = packed_batch(packed_documents(LENGTHS))
    results = []
    for recompute in (None, POLICIES[policy]):
        model = build_model(tiny_model_spec(), device=torch.device("cpu"), seed=7)
        if recompute is not None:
            apply_recompute(model, recompute=recompute)
        layout = ParallelModel.single(model)
        layout.document_eos_id = EOS
        loss = forward_backward(layout, [(inputs, targets)], device=torch.device("cpu"),
                                autocast=NO_AUTOCAST)
        results.append((loss.local_loss_sum, {n: p.grad for n, p in model.named_parameters()}))
    (loss, grads), (ref_loss, ref_grads) = results[1], results[0]
    torch.testing.assert_close(loss, ref_loss, rtol=RTOL, atol=ATOL)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=RTOL, atol=ATOL)


def test_the_end_token_is_learned_and_the_next_documents_first_is_not():
    """Under document masking the target of a document's EOS (the next document's first token)
    is neither learned nor counted, in training and in evaluation; the EOS itself stays the
    target of the token before it. Without the knob every next token is a target."""
    from training.step import document_targets, eval_loss_sum

    rows = packed_documents(LENGTHS)
    inputs, targets = packed_batch(rows)
    model = build_model(tiny_model_spec(), device=torch.device("cpu"), seed=7)
    layout = ParallelModel.single(model)
    layout.document_eos_id = EOS
    [(_, own)] = document_targets(layout, [(inputs, targets)])
    ends = inputs == EOS
    assert ends.sum() >= 5 and bool((own[ends] == IGNORE_INDEX).all())
    assert torch.equal(own[~ends], targets[~ends])
    assert int((own == EOS).sum()) == int((targets == EOS).sum()) > 0  # EOS still learned
    _, counted = eval_loss_sum(layout, inputs, targets, device=torch.device("cpu"),
                               autocast=NO_AUTOCAST)
    crossing = int((targets[ends] != IGNORE_INDEX).sum())  # not the window's last EOS
    assert counted == document_targets_count(rows) == int((targets != IGNORE_INDEX).sum()) \
        - crossing and crossing >= 4
    layout.document_eos_id = None
    assert document_targets(layout, [(inputs, targets)])[0][1] is targets


@pytest.mark.parametrize("batch, q_len, k_len, chunk, full_tiles", [
    (2, 300, 300, 1, True), (1, 200, 400, 300 * 400, False), (3, 130, 260, 50_000, False)])
def test_blockwise_block_mask_equals_torchs_dense_build(batch, q_len, k_len, chunk,
                                                        full_tiles):
    """The BlockMask built a few query tiles at a time (CUDA's path; bounded memory) equals
    torch's create_block_mask, which materialises the whole dense mask: the same partial and
    full tiles, kv indices and dense expansion; several chunks, ragged last tiles, a cp-like
    query shard (q_len < k_len) and one-chunk builds."""
    from torch.nn.attention.flex_attention import create_block_mask

    from parallel.document_masking import _allowed, blockwise_block_mask

    torch.manual_seed(1)
    tokens = torch.randint(EOS + 1, 50, (batch, k_len))
    tokens[1:][torch.rand(batch - 1, k_len) < 0.01] = EOS
    at = torch.arange(k_len)
    tokens[0, (at >= 270) & (at % 9 == 0)] = EOS  # row 0: one long document first
    ids, _ = document_ids_and_positions(tokens, eos_id=EOS)
    k_pos = torch.arange(k_len)
    q_pos = torch.cat([k_pos[:q_len // 2], k_pos[k_len - (q_len - q_len // 2):]])
    q_ids = ids[:, q_pos]

    def mask_mod(b, h, q, kv):
        return _allowed(q_ids[b, q], ids[b, kv], q_pos[q], k_pos[kv])

    ours = blockwise_block_mask(mask_mod, q_ids, ids, q_pos, k_pos, chunk_elements=chunk)
    torch_s = create_block_mask(mask_mod, batch, None, q_len, k_len, device="cpu")
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                 "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
        assert torch.equal(getattr(ours, name), getattr(torch_s, name)), name
    assert ours.seq_lengths == torch_s.seq_lengths and ours.BLOCK_SIZE == torch_s.BLOCK_SIZE
    assert torch.equal(ours.to_dense(), torch_s.to_dense())
    assert int(torch_s.kv_num_blocks.sum()) > 0
    assert (int(torch_s.full_kv_num_blocks.sum()) > 0) == full_tiles


def test_blockwise_block_mask_never_makes_the_whole_dense_mask():
    """The largest tensor made while building the BlockMask: at most one chunk of query tiles
    (padded to whole tiles) x all keys, where torch's create_block_mask makes B x Tq x Tk."""
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from parallel.document_masking import FLEX_BLOCK, _allowed, blockwise_block_mask

    class Largest(TorchDispatchMode):
        bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self.bytes = max(self.bytes, leaf.untyped_storage().nbytes())
            return out

    tokens = torch.randint(EOS + 1, 50, (2, 1024))
    tokens[:, ::100] = EOS
    ids, _ = document_ids_and_positions(tokens, eos_id=EOS)
    pos = torch.arange(1024)

    def mask_mod(b, h, q, kv):
        return _allowed(ids[b, q], ids[b, kv], pos[q], pos[kv])

    chunk = 2 * FLEX_BLOCK * 1024 * 2  # two query tiles of both rows
    with Largest() as ours:
        blockwise_block_mask(mask_mod, ids, ids, pos, pos, chunk_elements=chunk)
    with Largest() as whole:
        create_block_mask(mask_mod, 2, None, 1024, 1024, device="cpu")
    dense = 2 * 1024 * 1024
    assert whole.bytes >= dense and ours.bytes <= chunk < dense
    print(f"largest tensor building a 2 x 1024 x 1024 BlockMask: {ours.bytes} bytes blockwise,"
          f" {whole.bytes} by create_block_mask")
