"""SFT data: chat template masks, first-fit-decreasing packing, `data prepare-sft`, and the
training batches and loss on the packed bins. The tokenizer is a BPE trained here (no
downloads); conversations are made here."""
from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from conf.data_contract.prepared_corpus import MANIFEST
from launcher.data.hf_tokenizer import load_tokenizer
from launcher.data.sft_pack import first_fit_decreasing, packing_efficiency
from launcher.data.sft_prepare import SftOptions, encode_conversation, prepare_sft
from launcher.data.sft_template import ChatTemplate, DEFAULT_CHAT_TEMPLATE, load_chat_template
from tests.support.meshrun_cli import meshrun
from tests.support.sft_shards import hand_loss, read_split
from tests.support.text_corpora import TWO_TURNS, WORDS, trained_tokenizer
from training.loss import IGNORE_INDEX

CHATML = ("{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim "
          "+ '<|im_end|>' + '\\n' }}{% endfor %}")
"""A Qwen2-style ChatML template: a default system turn, trimmed content, <|im_end|> turns."""


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return trained_tokenizer(tmp_path_factory.mktemp("sft_tok"))


def _learned_spans(text: str, learned: list[str]) -> set[int]:
    """Character offsets of `text` inside the learned strings, found left to right."""
    offsets, at = set(), 0
    for span in learned:
        start = text.index(span, at)
        offsets.update(range(start, start + len(span)))
        at = start + len(span)
    return offsets


def _check_token_by_token(tok, conv, rendered: str, learned: list[str], *, bos: bool):
    """Walk the tokens over the rendered text: each token's mask is 1 exactly when its text
    lies inside an expected learned span (BOS and the closing EOS are 0)."""
    ids, mask = conv.tokens.tolist(), conv.mask.tolist()
    if bos:
        assert ids[0] == tok.info.bos_id and mask[0] == 0
        ids, mask = ids[1:], mask[1:]
    assert ids[-1] == tok.info.eos_id and mask[-1] == 0
    inside, at = _learned_spans(rendered, learned), 0
    for token, bit in zip(ids[:-1], mask[:-1]):
        piece = tok.decode([token])
        assert rendered.startswith(piece, at), (piece, rendered[at:at + 20])
        span = set(range(at, at + len(piece)))
        assert span <= inside if bit else not span & inside, (piece, bit)
        at += len(piece)
    assert at == len(rendered)
    assert sum(mask) == sum(len(tok.encode(s)) for s in learned)


def test_default_template_masks_exactly_the_assistant_turns(tok_dir):
    tok = load_tokenizer(tok_dir)
    template = load_chat_template(tok.info.path)
    assert template.origin == "default"
    conv = encode_conversation(TWO_TURNS, tok, template)
    rendered = ChatTemplate(DEFAULT_CHAT_TEMPLATE).render(TWO_TURNS)
    assert rendered.count("<|assistant|>\n") == 2
    _check_token_by_token(tok, conv, rendered, ["the quick brown fox<|end|>",
                                                "the loss falls<|end|>"], bos=True)


def test_tokenizer_chat_template_is_used_and_masked(tok_dir, tmp_path):
    folder = tmp_path / "chatml"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((tok_dir / "tokenizer.json").read_bytes())
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHATML}))
    tok = load_tokenizer(folder)
    template = load_chat_template(tok.info.path)
    assert template.origin.endswith("tokenizer_config.json")
    messages = [{**m, "content": f" {m['content']} "} for m in TWO_TURNS[1:]]  # trimmed
    conv = encode_conversation(messages, tok, template)
    rendered = template.render(messages)
    assert rendered.startswith("<|im_start|>system\nYou are helpful.<|im_end|>\n")
    _check_token_by_token(tok, conv, rendered, ["the quick brown fox<|im_end|>",
                                                "the loss falls<|im_end|>"], bos=False)


def test_eos_inside_conversations_is_counted_and_warned(tok_dir, tmp_path):
    """A template that ends turns with EOS: counted, and conversations end with another token
    (tests/unit/test_sft_document_mask.py: document masking keeps them whole)."""
    folder = tmp_path / "eos_turns"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((tok_dir / "tokenizer.json").read_bytes())
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    template = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + eos_token }}"
                "{% endfor %}")
    (folder / "tokenizer_config.json").write_text(json.dumps({**config,
                                                              "chat_template": template}))
    chats = tmp_path / "c.jsonl"
    chats.write_text(json.dumps({"messages": TWO_TURNS}) + "\n")
    done = meshrun("data", "prepare-sft", "--tokenizer", str(folder), "--seq-len", "255",
                   "--val-fraction", "0", "--out", str(tmp_path / "out"), str(chats), timeout=120)
    assert done.returncode == 0, done.stderr
    m = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert m["eos_inside_conversations"] == len(TWO_TURNS)
    assert m["document_separator_id"] == m["pad_id"] != m["tokenizer"]["eos_id"]
    assert ("5 EOS tokens inside conversations (the chat template ends turns with EOS): "
            "conversations end with '<pad>' (id 2) instead") in done.stdout


def test_a_template_that_hides_the_content_is_refused(tok_dir):
    tok = load_tokenizer(tok_dir)
    template = ChatTemplate("{% for m in messages %}{{ m['role'] }}{% endfor %}", origin="t")
    with pytest.raises(ValueError, match="cannot find the content"):
        encode_conversation(TWO_TURNS, tok, template)


def _first_fit_reference(sizes, capacity):
    """Plain first fit over the items sorted longest first: the O(n * bins) definition."""
    free, bins = [], []
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        b = next((b for b, room in enumerate(free) if room >= sizes[i]), len(free))
        if b == len(free):
            free.append(capacity)
            bins.append([])
        free[b] -= sizes[i]
        bins[b].append(i)
    return bins


def _optimum(sizes, capacity) -> int:
    """Fewest bins, by trying k = ceil(total/capacity), ... with backtracking."""
    order = sorted(sizes, reverse=True)
    for k in itertools.count(math.ceil(sum(sizes) / capacity)):
        free = [capacity] * k

        def place(i):
            if i == len(order):
                return True
            tried = set()
            for b in range(k):
                if free[b] >= order[i] and free[b] not in tried:
                    tried.add(free[b])
                    free[b] -= order[i]
                    if place(i + 1):
                        return True
                    free[b] += order[i]
            return False

        if place(0):
            return k


def test_ffd_places_each_item_once_never_overflows_and_is_near_optimal():
    rnd = random.Random(3)
    worst = 0.0
    for trial in range(60):
        capacity = rnd.choice([10, 17, 32])
        sizes = [rnd.randint(1, capacity) for _ in range(rnd.randint(1, 11))]
        bins = first_fit_decreasing(sizes, capacity)
        assert bins == _first_fit_reference(sizes, capacity)
        assert sorted(i for b in bins for i in b) == list(range(len(sizes)))
        assert all(sum(sizes[i] for i in b) <= capacity for b in bins)
        opt = _optimum(sizes, capacity)
        assert opt <= len(bins) <= 11 / 9 * opt + 1, (sizes, capacity)
        worst = max(worst, len(bins) / opt)
    # the classic instance where first-fit-decreasing needs 11/9 of the optimum
    tight = [51] * 6 + [27] * 6 + [26] * 6 + [23] * 12  # optimum: 6x(51+26+23), 3x(27+27+23+23)
    assert len(first_fit_decreasing(tight, 100)) == 11 == 11 / 9 * math.ceil(sum(tight) / 100)
    big = [rnd.randint(1, 500) for _ in range(3000)]
    bins = first_fit_decreasing(big, 1024)
    assert bins == _first_fit_reference(big, 1024)
    assert len(bins) <= 11 / 9 * math.ceil(sum(big) / 1024) + 1
    with pytest.raises(ValueError, match="outside 1..capacity"):
        first_fit_decreasing([5, 11], 10)


def _chats(path: Path, n: int, *, seed: int, long_every: int = 0) -> Path:
    rnd = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            messages = []
            for _ in range(rnd.randint(1, 2)):
                for role, k in (("user", rnd.randint(2, 8)), ("assistant", rnd.randint(2, 16))):
                    messages.append({"role": role, "content": " ".join(rnd.choices(WORDS, k=k))})
            if long_every and i % long_every == 0:
                messages[-1]["content"] += " " + " ".join(rnd.choices(WORDS, k=200))
            f.write(json.dumps({"chat": messages}) + "\n")
    return path


@pytest.mark.parametrize("too_long", ["drop", "truncate"])
def test_prepare_sft_packs_counts_and_reports_efficiency(tok_dir, tmp_path, too_long):
    chats = _chats(tmp_path / "chats.jsonl", 120, seed=1, long_every=10)
    options = SftOptions(seq_len=191, messages_field="chat", val_fraction=0.1,
                         shard_tokens=192 * 7, too_long=too_long)
    out, m, skipped = prepare_sft([str(chats)], tokenizer=str(tok_dir),
                                  out_dir=str(tmp_path / "out"), options=options)
    assert not skipped and m["kind"] == "sft" and m["bin_tokens"] == 192
    assert m["splits"]["val"]["conversations"] + m["splits"]["train"]["conversations"] \
        + m["dropped_too_long"] + m["dropped_nothing_learned"] == 120
    long_ones = 12  # every 10th has a 200-word reply: longer than a bin
    assert (m["dropped_too_long"], m["truncated"]) == \
        ((long_ones, 0) if too_long == "drop" else (0, long_ones))
    eos, pad = m["tokenizer"]["eos_id"], m["pad_id"]
    for split in ("train", "val"):
        s = m["splits"][split]
        tokens, mask = read_split(out, m, split)
        assert len(tokens) == s["bins"] and len(s["shards"]) == math.ceil(s["bins"] / 7)
        real = int((tokens != pad).sum())
        assert real == s["real_tokens"] and int(mask.sum()) == s["learned_tokens"]
        assert s["packing_efficiency"] == pytest.approx(real / tokens.size)
        assert not mask[tokens == pad].any()
        # every whole conversation ends with its EOS; a truncated one lost it
        assert int((tokens == eos).sum()) == s["conversations"] - s["truncated"]
    assert m["packing_efficiency"] > 0.8  # mixed lengths of 20..190 tokens pack tightly
    again = prepare_sft([str(chats)], tokenizer=str(tok_dir), out_dir=str(tmp_path / "out"),
                        options=options)
    assert again[2] and again[1] == m


def test_cli_prints_packing_efficiency_and_refuses_bad_input(tok_dir, tmp_path):
    chats = _chats(tmp_path / "chats.jsonl", 40, seed=2)
    args = ["data", "prepare-sft", "--tokenizer", str(tok_dir), "--seq-len", "127",
            "--messages-field", "chat", "--val-fraction", "0.1", "--out", str(tmp_path / "out"),
            str(chats)]
    done = meshrun(*args, timeout=120)
    assert done.returncode == 0, done.stderr
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert f"packing efficiency (real tokens / bin capacity): {m['packing_efficiency']:.1%}" \
        in done.stdout
    bad = meshrun(*args[:-1], str(tmp_path / "chats.jsonl"), "--messages-field", "x",
                  timeout=120)
    assert bad.returncode == 2 and "no non-empty list field 'x'" in bad.stderr
    assert "Traceback" not in bad.stderr


def _prepared_two_turns(tok_dir, tmp_path, *, seq_len=191):
    """Eight short conversations (two of them TWO_TURNS) in 191+1-token bins."""
    rnd = random.Random(4)
    lines = [TWO_TURNS, TWO_TURNS] + [
        [{"role": "user", "content": " ".join(rnd.choices(WORDS, k=rnd.randint(2, 8)))},
         {"role": "assistant", "content": " ".join(rnd.choices(WORDS, k=rnd.randint(1, 9)))}]
        for _ in range(10)]
    chats = tmp_path / "two.jsonl"
    chats.write_text("".join(json.dumps({"messages": m}) + "\n" for m in lines))
    out, m, _ = prepare_sft([str(chats)], tokenizer=str(tok_dir), out_dir=str(tmp_path / "p"),
                            options=SftOptions(seq_len=seq_len, val_fraction=0.2))
    learned = [f"{msg['content']}<|end|>" for conv in lines for msg in conv
               if msg["role"] == "assistant"]
    return out, m, lines, learned


def _runs(targets: torch.Tensor) -> list[list[int]]:
    """Maximal runs of consecutive learned (not ignored) target ids in one row."""
    runs, current = [], []
    for t in targets.tolist() + [IGNORE_INDEX]:
        if t == IGNORE_INDEX:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(t)
    return runs


def test_batches_are_whole_bins_with_targets_masked_and_shifted(tok_dir, tmp_path):
    from training.data.sft_batches import PackedBins

    out, m, lines, learned = _prepared_two_turns(tok_dir, tmp_path)
    tok = load_tokenizer(tok_dir)
    seen = []
    for split in ("train", "val"):
        bins = PackedBins(str(out), split, seq_len=191, vocab_size=320)
        inputs, targets = bins.micro_batch(np.arange(bins.n_bins))
        tokens, mask = read_split(out, m, split)
        assert torch.equal(inputs, torch.from_numpy(tokens[:, :-1]))  # window == bin
        kept = targets != IGNORE_INDEX
        assert torch.equal(targets[kept], torch.from_numpy(tokens[:, 1:])[kept])
        seen += [tok.decode(run) for row in targets for run in _runs(row)]
    # each learned run is exactly one assistant reply + its end marker, nothing else
    assert sorted(seen) == sorted(learned)
    with pytest.raises(ValueError, match="bins of 192 tokens"):
        PackedBins(str(out), "train", seq_len=63, vocab_size=320)


def test_resolve_checks_seq_len_against_the_bins(tok_dir, tmp_path):
    from conf.compose import compose_config
    from conf.errors import ConfigError
    from conf.resolve import resolve
    from tests.support.specs import CPU_HOST

    out, *_ = _prepared_two_turns(tok_dir, tmp_path)
    cfg = compose_config(["logging=disabled", "model=tiny", "data=files", f"data.prepared={out}",
                          "model.vocab_size=320", "training.seq_len=64"])
    with pytest.raises(ConfigError, match="training.seq_len=64.*set training.seq_len=191"):
        resolve(cfg, host=CPU_HOST, check_paths=True)


def test_one_training_step_loss_is_the_mean_over_assistant_tokens(tok_dir, tmp_path):
    """2 micro-batches of 1 bin with different learned counts: the step's loss and gradients
    are those of the mean over all learned tokens of both (not a mean of the two means)."""
    from tests.support.specs import cpu_spec
    from training.data.build import build_train_batches, build_val_batches
    from training.model_builder import build_model
    from training.data.sft_batches import PackedBins
    from training.parallel_model import ParallelModel
    from training.step import forward_backward

    out, m, *_ = _prepared_two_turns(tok_dir, tmp_path)
    spec = cpu_spec("model=tiny", "data=files", f"data.prepared={out}", "model.vocab_size=320",
                    "training.seq_len=191", "training.micro_batch_size=1",
                    "training.grad_accum_steps=2", "parallel=single")
    batches = build_train_batches(spec.data, spec.training, dp_rank=0, dp_size=1)
    assert type(batches).__name__ == "SftTrainBatches"
    val = list(build_val_batches(spec.data, spec.training, dp_rank=0, dp_size=1))
    val_bins = PackedBins(str(out), "val", seq_len=191, vocab_size=320)
    for i, (inputs, targets) in enumerate(val):  # the val split's bins in order, cycled
        expected = val_bins.micro_batch(np.array([i % val_bins.n_bins]))
        assert torch.equal(inputs, expected[0]) and torch.equal(targets, expected[1])
    assert len(val) == spec.training.eval_batches
    bin_ids = batches.order.window_indices(np.arange(2))
    micro = batches.next_step()
    counts = [int((t != IGNORE_INDEX).sum()) for _, t in micro]
    model = build_model(spec.model, device=torch.device("cpu"), seed=0)
    loss = forward_backward(ParallelModel.single(model), micro, device=torch.device("cpu"),
                            autocast=torch.autocast("cpu", enabled=False))
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    hand = hand_loss(model, out, m, bin_ids)
    hand.backward()
    assert loss.global_tokens == sum(counts) and counts[0] != counts[1]
    assert float(loss.local_loss_sum) / loss.global_tokens == pytest.approx(
        float(hand.detach()), rel=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-6, rtol=1e-4, msg=name)
    # the test can tell a mean over tokens from a mean of the two micro-batches' means
    model.zero_grad()
    (sum(hand_loss(model, out, m, [b]) for b in bin_ids) / 2).backward()
    gaps = [float((grads[n] - p.grad).abs().max() / (1e-6 + 1e-4 * p.grad.abs().max()))
            for n, p in model.named_parameters()]
    assert max(gaps) > 100, gaps


def test_packing_efficiency_of_a_chat_length_distribution():
    """Log-normal conversation lengths (median ~300 tokens, capped at one 2049-token bin), as
    chat data tends to have: FFD fills the bins to within a few percent."""
    rnd = np.random.default_rng(0)
    sizes = np.minimum(rnd.lognormal(mean=math.log(300), sigma=0.8, size=4000), 2049)
    sizes = [max(1, int(s)) for s in sizes]
    bins = first_fit_decreasing(sizes, 2049)
    efficiency = packing_efficiency(sizes, n_bins=len(bins), capacity=2049)
    assert efficiency == sum(sizes) / (len(bins) * 2049)
    print(f"FFD packing efficiency, 4000 log-normal lengths into 2049-token bins: "
          f"{efficiency:.2%} ({len(bins)} bins, lower bound {math.ceil(sum(sizes) / 2049)})")
    assert efficiency > 0.97
    assert packing_efficiency([], n_bins=0, capacity=2049) == 0.0


def test_sft_batches_resume_after_a_step_and_refuse_other_data(tok_dir, tmp_path):
    from training.data.sft_batches import SftTrainBatches

    out, *_ = _prepared_two_turns(tok_dir, tmp_path)
    common = dict(prepared=str(out), seq_len=191, seed=7, global_batch_size=2,
                  micro_batch_size=1, grad_accum_steps=2, dp_rank=0, dp_size=1)
    first = SftTrainBatches(**common)
    first.next_step()
    state = first.state_dict()
    expected = first.next_step()
    again = SftTrainBatches(**common)
    again.load_state_dict(state)
    for (a_in, a_t), (b_in, b_t) in zip(again.next_step(), expected):
        assert torch.equal(a_in, b_in) and torch.equal(a_t, b_t)
    with pytest.raises(ValueError, match="cannot resume"):
        SftTrainBatches(**{**common, "seed": 8}).load_state_dict(state)
