"""SFT x document masking with a chat template that ends every turn with the EOS token (as
Qwen2.5's `<|im_end|>` and Llama 3's `<|eot_id|>` instruct tokenizers do): `prepare-sft`
closes conversations with a separator no conversation holds and records it in the manifest,
resolve() makes it the document boundary, and a packed bin of two such conversations gives each
conversation the loss and gradients it has alone (fp32). A mask built from the EOS cuts the
conversations into turns and fails the same comparison (checked here too)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conf.errors import ConfigError
from launcher.data.hf_tokenizer import load_tokenizer
from launcher.data.sft_prepare import SftOptions, encode_conversation, prepare_sft
from launcher.data.sft_template import load_chat_template
from parallel.document_masking import document_ids_and_positions
from tests.support.specs import cpu_spec
from tests.support.text_corpora import TWO_TURNS, trained_tokenizer
from training.loss import IGNORE_INDEX

RTOL, ATOL = 1e-5, 1e-6
"""fp32: packed and alone run different matmul shapes, so rounding differs (~1e-7)."""
NO_AUTOCAST = torch.autocast("cpu", enabled=False)
EOS_TURNS = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + eos_token }}{% endfor %}"
"""Every turn ends with the EOS token (the assistant's EOS is learned as its turn end)."""
SECOND = [{"role": "user", "content": "where does the fox go"},
          {"role": "assistant", "content": "over a lazy dog"},
          {"role": "user", "content": "why"},
          {"role": "assistant", "content": "gradients flow"}]
SEQ_LEN = 255


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return trained_tokenizer(tmp_path_factory.mktemp("sft_tok"))


def eos_turns_tokenizer(tok_dir: Path, folder: Path) -> Path:
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((tok_dir / "tokenizer.json").read_bytes())
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config,
                                                              "chat_template": EOS_TURNS}))
    return folder


def _prepare(tok: Path, tmp_path: Path, conversations: list[list[dict]], *,
             parse_special: bool = False) -> tuple[Path, dict]:
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations))
    out, manifest, _ = prepare_sft([str(chats)], tokenizer=str(tok), out_dir=str(tmp_path / "p"),
                                   options=SftOptions(seq_len=SEQ_LEN, val_fraction=0.0,
                                                      parse_special=parse_special))
    return out, manifest


def _alone(tok: Path, messages: list[dict], separator: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One conversation as its own [1, n] batch, closed by `separator`: its learned next
    tokens as targets, none after its last token."""
    t = load_tokenizer(tok)
    template = load_chat_template(t.info.path, eos_token=t.backend.id_to_token(t.info.eos_id))
    conv = encode_conversation(messages, t, template)
    tokens = torch.from_numpy(conv.tokens.copy())
    tokens[-1] = separator
    targets = torch.full_like(tokens, IGNORE_INDEX)
    learned = torch.from_numpy(conv.mask[1:].astype(bool))
    targets[:-1] = torch.where(learned, tokens[1:], IGNORE_INDEX)
    return tokens[None], targets[None]


def _span(row: torch.Tensor, tokens: torch.Tensor) -> slice:
    """Where `tokens` [n] sit in the packed `row` [T] (exactly once)."""
    n = len(tokens)
    hits = [i for i in range(len(row) - n + 1) if torch.equal(row[i:i + n], tokens)]
    assert len(hits) == 1, hits
    return slice(hits[0], hits[0] + n)


def _packed_step(spec, model, inputs, targets, *, boundary: int):
    """Loss sum, targets and gradients of one packed step, documents ending at `boundary`;
    and the packed logits under that mask."""
    from training.parallel_model import ParallelModel
    from training.step import forward_backward

    layout = ParallelModel.single(model)
    layout.document_eos_id = boundary
    model.zero_grad(set_to_none=True)
    loss = forward_backward(layout, [(inputs, targets)], device=torch.device("cpu"),
                            autocast=NO_AUTOCAST)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    ids, positions = document_ids_and_positions(inputs, eos_id=boundary)
    with torch.no_grad():
        logits = model(inputs, doc_ids=ids, doc_positions=positions)
    return loss, grads, logits


def test_packed_conversations_with_eos_turns_equal_each_alone(tok_dir, tmp_path):
    from training.model_builder import build_model
    from training.data.sft_batches import PackedBins
    from training.step import token_loss_sum

    tok = eos_turns_tokenizer(tok_dir, tmp_path / "eos_turns")
    out, m = _prepare(tok, tmp_path, [TWO_TURNS, SECOND])
    eos, separator = m["tokenizer"]["eos_id"], m["document_separator_id"]
    assert m["eos_inside_conversations"] == len(TWO_TURNS) + len(SECOND)
    assert separator is not None and separator != eos and m["splits"]["train"]["bins"] == 1
    spec = cpu_spec("model=tiny", "data=files", f"data.prepared={out}", "model.vocab_size=320",
                    f"training.seq_len={SEQ_LEN}", "data.document_mask=true", "parallel=single",
                    "model.init_std=0.2")  # larger weights: context moves the loss more
    assert spec.data.eos_id == separator  # the manifest, not the tokenizer's EOS, decides
    inputs, targets = PackedBins(str(out), "train", seq_len=SEQ_LEN,
                                 vocab_size=320).micro_batch(np.array([0]))
    model = build_model(spec.model, device=torch.device("cpu"), seed=3)

    alone = [_alone(tok, messages, separator) for messages in (TWO_TURNS, SECOND)]
    n_targets = sum(int((y != IGNORE_INDEX).sum()) for _, y in alone)
    model.zero_grad(set_to_none=True)
    alone_losses = []
    for x, y in alone:
        one = token_loss_sum(model, x, y, NO_AUTOCAST)
        (one / n_targets).backward()
        alone_losses.append(one.detach())
    alone_grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    def per_conversation(logits):
        return [torch.nn.functional.cross_entropy(
            logits[0, _span(inputs[0], x[0])], y[0], ignore_index=IGNORE_INDEX,
            reduction="sum") for x, y in alone]

    loss, grads, logits = _packed_step(spec, model, inputs, targets, boundary=spec.data.eos_id)
    assert loss.global_tokens == n_targets
    for packed, one in zip(per_conversation(logits), alone_losses):
        torch.testing.assert_close(packed, one, rtol=RTOL, atol=ATOL)
    assert float(loss.local_loss_sum) == pytest.approx(float(sum(alone_losses)), rel=RTOL)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, alone_grads[name], rtol=RTOL, atol=ATOL,
                                   msg=lambda msg, n=name: f"grad {n}: {msg}")

    # the mutation: documents ending at the EOS cut each conversation into its turns, so a
    # reply no longer sees its question: losses and gradients move far beyond the tolerance
    _, eos_grads, eos_logits = _packed_step(spec, model, inputs, targets, boundary=eos)
    gaps = [abs(float(p - a)) / (ATOL + RTOL * abs(float(a)))
            for p, a in zip(per_conversation(eos_logits), alone_losses)]
    print(f"mask from EOS: per-conversation loss gaps {[round(g) for g in gaps]} x tolerance")
    assert min(gaps) > 100, gaps
    assert max(float((eos_grads[n] - g).abs().max()) for n, g in alone_grads.items()) > 1e-3


def test_the_separator_closes_every_conversation_and_is_never_learned(tok_dir, tmp_path):
    tok = eos_turns_tokenizer(tok_dir, tmp_path / "eos_turns")
    out, m = _prepare(tok, tmp_path, [TWO_TURNS, SECOND, SECOND[:2]])
    separator = m["document_separator_id"]
    tokens = np.fromfile(out / m["splits"]["train"]["shards"][0]["file"], dtype=m["dtype"])
    mask = np.fromfile(out / m["splits"]["train"]["shards"][0]["mask_file"], dtype=np.uint8)
    conversation_tokens = m["real_tokens"]
    ends = np.flatnonzero(tokens[:conversation_tokens] == separator)
    assert len(ends) == m["conversations"] == 3 and ends[-1] == conversation_tokens - 1
    assert not mask[tokens == separator].any()
    assert m["document_separator"] == load_tokenizer(tok).backend.id_to_token(separator)


def test_the_default_template_keeps_the_eos_as_separator(tok_dir, tmp_path):
    out, m = _prepare(tok_dir, tmp_path, [TWO_TURNS, SECOND])
    assert m["eos_inside_conversations"] == 0
    assert m["document_separator_id"] == m["tokenizer"]["eos_id"]
    spec = cpu_spec("model=tiny", "data=files", f"data.prepared={out}", "model.vocab_size=320",
                    f"training.seq_len={SEQ_LEN}", "data.document_mask=true")
    assert spec.data.eos_id == m["tokenizer"]["eos_id"]


def _rewrite_manifest(out: Path, **changes) -> None:
    path = out / "manifest.json"
    manifest = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps(manifest))


def test_resolve_refuses_sft_dirs_without_a_separator_that_keeps_conversations(
        tok_dir, tmp_path):
    """No free token (None recorded), or an older dir that recorded none while its
    conversations hold EOS: data.document_mask is refused, naming the fix; off, it resolves."""
    tok = eos_turns_tokenizer(tok_dir, tmp_path / "eos_turns")
    out, m = _prepare(tok, tmp_path, [TWO_TURNS, SECOND])
    args = ("model=tiny", "data=files", f"data.prepared={out}", "model.vocab_size=320",
            f"training.seq_len={SEQ_LEN}")
    _rewrite_manifest(out, document_separator_id=None)
    with pytest.raises(ConfigError, match="data.document_mask=true: .*every special token.*"
                                          "add an unused special token"):
        cpu_spec(*args, "data.document_mask=true")
    older = {k: v for k, v in m.items() if k not in ("document_separator_id",
                                                     "document_separator")}
    (out / "manifest.json").write_text(json.dumps(older))
    with pytest.raises(ConfigError, match="hold 9 EOS tokens.*run `meshrun data prepare-sft` "
                                          "again"):
        cpu_spec(*args, "data.document_mask=true")
    assert cpu_spec(*args).data.eos_id is None


def test_every_candidate_inside_conversations_records_none(tok_dir, tmp_path):
    """Conversations that hold the EOS, pad and BOS (the trained tokenizer's only specials;
    pad and BOS in content, so only with --parse-special): no separator, the conversations
    keep their EOS."""
    tok = eos_turns_tokenizer(tok_dir, tmp_path / "eos_turns")
    t = load_tokenizer(tok)
    specials = "".join(t.backend.id_to_token(i) for i in (t.info.bos_id, t.info.pad_id))
    chatty = [{"role": "user", "content": f"say {specials}"},
              {"role": "assistant", "content": "the fox"}]
    out, m = _prepare(tok, tmp_path, [TWO_TURNS, chatty], parse_special=True)
    assert m["document_separator_id"] is None
    tokens = np.fromfile(out / m["splits"]["train"]["shards"][0]["file"], dtype=m["dtype"])
    assert tokens[m["real_tokens"] - 1] == t.info.eos_id
