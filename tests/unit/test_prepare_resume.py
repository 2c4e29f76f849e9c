"""A killed `meshrun data prepare` continues from its finished shards: the rerun tokenizes only
the chunks after the last saved progress and writes byte-for-byte what an uninterrupted run
writes; progress of other inputs, or with a shard gone, is not trusted."""
from __future__ import annotations

import pytest

from launcher.data import token_shards
from launcher.data.token_shards import PROGRESS, PrepareOptions, prepare
from launcher.data.hf_tokenizer import train_bpe
from tests.support.text_corpora import write_corpus

OPTS = PrepareOptions(text_field="body", val_fraction=0.2, shard_tokens=1500)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    corpus = write_corpus(root)
    tok = train_bpe(sorted(corpus.glob("*.txt")), vocab_size=320, out_dir=root / "tok")
    return {"root": root, "corpus": corpus, "tok": tok}


def _run(made, out):
    return prepare([str(made["corpus"])], tokenizer=str(made["tok"].parent), out_dir=str(out),
                   options=OPTS, workers=1)


def _files(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def _interrupt_after_shards(made, out, monkeypatch, n: int) -> None:
    real_write, calls = token_shards.ShardWriter._write, []

    def dies(self, tokens):
        if len(calls) == n:
            raise KeyboardInterrupt
        calls.append(1)
        real_write(self, tokens)

    monkeypatch.setattr(token_shards.ShardWriter, "_write", dies)
    with pytest.raises(KeyboardInterrupt):
        _run(made, out)
    monkeypatch.setattr(token_shards.ShardWriter, "_write", real_write)


def _counting_chunks(monkeypatch) -> list:
    real, seen = token_shards._encode_chunk, []
    monkeypatch.setattr(token_shards, "_encode_chunk",
                        lambda task: seen.append(task[0]) or real(task))
    return seen


def test_killed_prepare_resumes_and_matches_an_uninterrupted_run(made, monkeypatch):
    monkeypatch.setattr(token_shards, "CHUNK_DOCS", 2)  # 20 documents: 10 chunks
    reference = _run(made, made["root"] / "whole")
    assert len(reference.manifest["splits"]["train"]["shards"]) >= 4
    out = made["root"] / "killed"
    _interrupt_after_shards(made, out, monkeypatch, 3)
    assert (out / PROGRESS).is_file() and not (out / "manifest.json").exists()
    seen = _counting_chunks(monkeypatch)
    resumed = _run(made, out)
    assert not resumed.skipped and 0 < len(seen) < 10 and min(seen) > 0  # skipped done chunks
    assert resumed.manifest == reference.manifest
    assert _files(out) == _files(made["root"] / "whole")  # no progress or tails left behind
    assert _run(made, out).skipped


def test_progress_is_not_trusted_when_a_shard_is_gone_or_inputs_changed(made, monkeypatch):
    monkeypatch.setattr(token_shards, "CHUNK_DOCS", 2)
    reference = _run(made, made["root"] / "whole2")
    out = made["root"] / "gone"
    _interrupt_after_shards(made, out, monkeypatch, 3)
    (out / "train_00000.bin").unlink()
    seen = _counting_chunks(monkeypatch)
    assert _run(made, out).manifest == reference.manifest and len(seen) == 10  # started over
    changed = made["root"] / "changed"
    _interrupt_after_shards(made, changed, monkeypatch, 3)
    (made["corpus"] / "doc00.txt").write_text("a different first document\n")
    seen.clear()
    result = _run(made, changed)
    assert len(seen) == 10 and result.manifest["fingerprint"] != reference.manifest["fingerprint"]
