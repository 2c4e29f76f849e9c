"""tiktoken BPE rank files (Llama 3's `tokenizer.model` format) as a tokenizer kind: a tiny rank
file is trained here with tiktoken's own reference trainer (no download); meshrun's ids equal
tiktoken's and its pure-Python reference encoder's, text round-trips, the Llama 3 special
tokens (BOS/EOS/pad) follow the ranks, `data prepare` shards documents as [BOS] ids EOS, and a
missing `tiktoken` package is a clear error."""
from __future__ import annotations

import base64
import json
import sys

import numpy as np
import pytest

from conf.data_contract.tokenizer_info import LLAMA3_SPECIALS, read_tokenizer_info, tokenizer_file
from launcher.data.hf_tokenizer import load_tokenizer

tiktoken = pytest.importorskip("tiktoken")
from tiktoken._educational import SimpleBytePairEncoding, bpe_train  # noqa: E402

N_RANKS = 300
META_LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"  # noqa: E501
"""The split pattern of Meta's llama3 tokenizer.py (and transformers' TikTokenConverter): the
reference meshrun's LLAMA3_PATTERN is checked against through the ids."""
CORPUS = ("The tokenizer splits text with Llama 3's pattern, then merges bytes by rank. "
          "Numbers 12345 and 2026, punctuation!? and whitespace\n\n  are split too. "
          "Ünïcödé text — and emoji 🙂 — fall back to bytes. Years 2026, 2025; ids 123 451 "
          "234 520 26. ") * 6
SAMPLES = ["the tokenizer merges bytes", "Ünïcödé 🙂 and 98765\n\tindent",
           "quoting <|end_of_text|> is ordinary text", "", "id 123451234520262026"]


@pytest.fixture(scope="module")
def ranks() -> dict[bytes, int]:
    return bpe_train(CORPUS, N_RANKS, META_LLAMA3_PATTERN, visualise=None)


def write_rank_file(path, ranks: dict[bytes, int]):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{base64.b64encode(token).decode()} {rank}"
             for token, rank in sorted(ranks.items(), key=lambda item: item[1])]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def tok_dir(tmp_path, ranks):
    write_rank_file(tmp_path / "tok" / "tokenizer.model", ranks)
    return tmp_path / "tok"


def test_info_places_llama3_specials_after_the_ranks(tok_dir, tmp_path, ranks):
    info = read_tokenizer_info(tok_dir)
    assert info.kind == "tiktoken" and info.path.endswith("tokenizer.model")
    assert info.vocab_size == N_RANKS + 256 == N_RANKS + len(LLAMA3_SPECIALS)
    assert (info.bos_id, info.eos_id, info.pad_id) == (N_RANKS, N_RANKS + 1, N_RANKS + 4)
    assert read_tokenizer_info(tok_dir, eos_token="<|eot_id|>").eos_id == N_RANKS + 9
    with pytest.raises(ValueError, match="'<eos>' is not in the tokenizer's vocabulary"):
        read_tokenizer_info(tok_dir, eos_token="<eos>")
    other = write_rank_file(tmp_path / "cl" / "tiny.tiktoken", ranks)  # a *.tiktoken file
    assert tokenizer_file(other.parent) == other and read_tokenizer_info(other).kind == "tiktoken"


def test_other_files_are_not_taken_for_rank_files(tmp_path):
    sentencepiece = tmp_path / "sp" / "tokenizer.model"
    sentencepiece.parent.mkdir()
    sentencepiece.write_bytes(b"\n\x0e\n\x05<unk>\x15\x00\x00\x00\x00\x18\x02")
    with pytest.raises(ValueError, match="no tokenizer.json at .*nor a tiktoken"):
        read_tokenizer_info(sentencepiece.parent)
    gapped = tmp_path / "gap.tiktoken"
    gapped.write_text("YQ== 0\nYg== 2\n")
    with pytest.raises(ValueError, match="ranks of a tiktoken file must be 0..n-1"):
        read_tokenizer_info(gapped)


def test_ids_equal_tiktokens_and_text_round_trips(tok_dir, ranks):
    tok = load_tokenizer(tok_dir)
    direct = tiktoken.Encoding(name="direct", pat_str=META_LLAMA3_PATTERN,
                               mergeable_ranks=ranks, special_tokens={})
    reference = SimpleBytePairEncoding(pat_str=META_LLAMA3_PATTERN, mergeable_ranks=ranks)
    batch = tok.encode_batch(SAMPLES)
    for text, ids in zip(SAMPLES, batch):
        assert ids == direct.encode_ordinary(text) == reference.encode(text, visualise=None)
        assert tok.encode(text) == ids and tok.decode(ids) == text
    assert len(batch[0]) < len(SAMPLES[0].encode())  # merges happened
    assert N_RANKS + 1 not in batch[2]  # a special token's text is not the special token
    assert tok.decode([N_RANKS, *batch[0], N_RANKS + 1]) == \
        f"<|begin_of_text|>{SAMPLES[0]}<|end_of_text|>"


def test_data_prepare_shards_documents_with_bos_and_eos(tok_dir, tmp_path):
    from launcher.data.token_shards import PrepareOptions, prepare

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in SAMPLES[:3]))
    result = prepare([str(docs)], tokenizer=str(tok_dir), out_dir=str(tmp_path / "prep"),
                     options=PrepareOptions(val_fraction=0.0), workers=1)
    manifest = result.manifest
    assert manifest["tokenizer"]["vocab_size"] == N_RANKS + 256 and manifest["dtype"] == "uint16"
    (shard,) = manifest["splits"]["train"]["shards"]
    tokens = np.fromfile(tmp_path / "prep" / shard["file"], dtype=np.uint16).tolist()
    tok = load_tokenizer(tok_dir)
    expected = [t for text in SAMPLES[:3]
                for t in [N_RANKS, *tok.encode(text), N_RANKS + 1]]
    assert tokens == expected


def test_sft_content_quoting_specials_stays_text_the_templates_are_special(tok_dir):
    """Issue 25 for `data prepare-sft` with a rank file: only the template's EOS/BOS are ids."""
    from launcher.data.sft_prepare import encode_conversation
    from launcher.data.sft_template import ChatTemplate

    template = ChatTemplate("{% for m in messages %}{{ bos_token + m['role'] + ': ' + "
                            "m['content'] + eos_token }}{% endfor %}", origin="eos-turns",
                            bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    messages = [{"role": "user", "content": "quoting <|end_of_text|> and <|begin_of_text|>"},
                {"role": "assistant", "content": "<|end_of_text|> is ordinary text here"}]
    tok = load_tokenizer(tok_dir)
    ids = encode_conversation(messages, tok, template).tokens.tolist()
    assert (ids.count(N_RANKS + 1), ids.count(N_RANKS)) == (len(messages) + 1, len(messages))
    parsed = encode_conversation(messages, tok, template, parse_special=True).tokens.tolist()
    assert (parsed.count(N_RANKS + 1), parsed.count(N_RANKS)) == (len(messages) + 3,
                                                                   len(messages) + 1)


def test_missing_tiktoken_is_a_clear_error(tok_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # `import tiktoken` raises ImportError
    with pytest.raises(ValueError, match=r"needs the `tiktoken` package.*pip install"):
        load_tokenizer(tok_dir)
    assert read_tokenizer_info(tok_dir).vocab_size == N_RANKS + 256  # resolve() needs no library


def test_export_writes_a_tokenizer_autotokenizer_loads(tok_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    from training.export import export_tokenizer

    out = tmp_path / "export"
    out.mkdir()
    info = export_tokenizer(str(tok_dir), out)
    assert sorted(p.name for p in out.iterdir()) == [
        "special_tokens_map.json", "tokenizer.model", "tokenizer_config.json"]
    loaded = transformers.AutoTokenizer.from_pretrained(out)  # converts the rank file
    ours = load_tokenizer(tok_dir)
    assert len(loaded) == info.vocab_size
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == \
        (info.bos_id, info.eos_id, info.pad_id)
    for text in SAMPLES:
        if "<|" not in text:  # transformers splits special-token text out; data prepare does not
            assert loaded(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert loaded.convert_ids_to_tokens([N_RANKS + 9]) == ["<|eot_id|>"]


LLAMA3_CHAT = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
               "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
               "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>"
               "\n\n{% endif %}")
"""Llama 3 instruct's chat template, shortened: every turn ends with <|eot_id|>."""


def test_prepare_sft_with_a_tiktoken_instruct_tokenizer(tok_dir, tmp_path):
    """SFT prepare with a tiktoken rank file and an instruct config (EOS = <|eot_id|>, which
    ends every turn): the template's markers become special ids, and conversations are
    separated by a token none of them holds (not the EOS)."""
    from launcher.data.sft_prepare import SftOptions, prepare_sft

    (tok_dir / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": LLAMA3_CHAT, "bos_token": "<|begin_of_text|>",
         "eos_token": "<|eot_id|>"}))
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"numbers {i} and {i + 7}?"},
        {"role": "assistant", "content": "the tokenizer merges bytes " * (1 + i % 3)}]}) + "\n"
        for i in range(12)))
    out, manifest, skipped = prepare_sft(
        [str(chats)], tokenizer=str(tok_dir), out_dir=str(tmp_path / "sft"),
        options=SftOptions(seq_len=127, val_fraction=0.0))
    tok = load_tokenizer(tok_dir)
    specials = {name: tok.info.vocab_size - len(tok.info.specials) + i
                for i, name in enumerate(tok.info.specials)}
    eot = specials["<|eot_id|>"]
    assert manifest["tokenizer"]["eos_id"] == eot and not skipped
    separator = manifest["document_separator_id"]
    assert separator != eot and separator in tok.special_ids()
    tokens = np.concatenate([np.fromfile(out / s["file"], dtype=manifest["dtype"])
                             for s in manifest["splits"]["train"]["shards"]])
    # each turn's markers are single special ids, not their text spelled in bytes
    assert int((tokens == specials["<|start_header_id|>"]).sum()) == 24
    assert int((tokens == eot).sum()) == 24  # inside the conversations: not a boundary
    assert manifest["splits"]["train"]["conversations"] == 12
    assert int((tokens == separator).sum()) >= 12  # each ends with it (pad may be it too)
    assert tok.token_text(eot) == "<|eot_id|>"
