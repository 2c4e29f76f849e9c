"""Tokenizers and `meshrun data prepare`: ids equal the `tokenizers` library's, shards and
manifests reproducible, a second call does nothing, a torn shard is never read as complete,
and resolve() refuses a tokenizer/vocab mismatch before launch. Corpus and tokenizer are made
here (no downloads)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conf.compose import compose_config
from conf.errors import ConfigError
from conf.hf_model_config import explicit_model_keys
from conf.data_contract.prepared_corpus import MANIFEST, read_manifest
from conf.resolve import resolve
from conf.spec import HostSpec
from launcher.data import token_shards
from launcher.data.token_shards import PrepareOptions, prepare, token_dtype
from launcher.data.hf_tokenizer import load_tokenizer, train_bpe
from tests.support.meshrun_cli import meshrun
from tests.support.text_corpora import write_corpus

CPU = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=8)
TEXTS = ["plain ascii text, with punctuation!", "  leading spaces\tand tabs\nnew lines\n",
         "unicode: é ü ß 漢字 🙂 — done", ""]
OPTS = PrepareOptions(val_fraction=0.2, shard_tokens=3000)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    corpus = write_corpus(root)
    tok = train_bpe(sorted(corpus.glob("*.txt")), vocab_size=320, out_dir=root / "tok")
    return {"root": root, "corpus": corpus, "tok": tok}


def _prepare(made, out, *, workers=1, options=OPTS):
    return prepare([str(made["corpus"])], tokenizer=str(made["tok"].parent), out_dir=str(out),
                   options=PrepareOptions(**{**options.__dict__, "text_field": "body"}),
                   workers=workers)


def test_ids_equal_the_tokenizers_library_and_round_trip(made):
    import tokenizers

    ours = load_tokenizer(made["tok"].parent)
    theirs = tokenizers.Tokenizer.from_file(str(made["tok"]))
    assert ours.vocab_size == theirs.get_vocab_size(with_added_tokens=True) == 320
    assert (ours.info.bos_id, ours.info.eos_id, ours.info.pad_id) == (0, 1, 2)
    for text in TEXTS + [(made["corpus"] / "doc00.txt").read_text()]:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False).ids
        assert ours.decode(ids) == text
    assert ours.encode_batch(TEXTS) == [ours.encode(t) for t in TEXTS]


def test_named_special_tokens_and_missing_ones(made):
    info = load_tokenizer(made["tok"], eos_token="<pad>", bos_token="</s>").info
    assert (info.bos_id, info.eos_id) == (1, 2)
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        load_tokenizer(made["tok"], eos_token="<|nope|>")


def test_prepare_counts_checksums_reproducible_and_worker_independent(made):
    one = _prepare(made, made["root"] / "w1", workers=1).manifest
    two = _prepare(made, made["root"] / "w2", workers=2).manifest
    strip = lambda m: {k: v for k, v in m.items() if k != "inputs"}  # noqa: E731
    assert strip(one) == strip(two)
    assert one["dtype"] == "uint16" and one["documents"] == 20
    assert (one["splits"]["train"]["documents"], one["splits"]["val"]["documents"]) == (16, 4)
    assert len(one["splits"]["train"]["shards"]) > 1
    # the shards hold exactly [BOS] ids EOS of each document, in order
    tok = load_tokenizer(made["tok"])
    docs = [p.read_text() for p in sorted(made["corpus"].glob("*.txt"))]
    docs += [json.loads(line)["body"] for line in (made["corpus"] / "records.jsonl").open()]
    assert sorted(made["corpus"].iterdir())[-1].name == "records.jsonl"  # input order
    expected = {"train": [], "val": []}
    for i, text in enumerate(docs):
        split = "val" if int((i + 1) * 0.2) > int(i * 0.2) else "train"
        expected[split] += [0] + tok.encode(text) + [1]
    for split in ("train", "val"):
        got = np.concatenate([np.fromfile(made["root"] / "w1" / s["file"], dtype="uint16")
                              for s in one["splits"][split]["shards"]])
        assert got.tolist() == expected[split]
        assert one["splits"][split]["tokens"] == len(expected[split])


def test_second_run_does_nothing(made):
    out = made["root"] / "again"
    first = _prepare(made, out)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    second = _prepare(made, out)
    assert not first.skipped and second.skipped
    assert second.manifest == first.manifest
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps


def test_cli_prepare_says_it_did_nothing_the_second_time(made, tmp_path):
    args = ["data", "prepare", "--tokenizer", str(made["tok"]), "--out", str(tmp_path / "p"),
            "--text-field", "body", "--workers", "1", str(made["corpus"])]
    first = meshrun(*args, timeout=120)
    second = meshrun(*args, timeout=120)
    assert first.returncode == 0 and ": prepared" in first.stdout, first.stderr
    assert second.returncode == 0 and "nothing to do" in second.stdout, second.stderr
    bad = meshrun(*args[:-1], str(tmp_path / "missing"), timeout=120)
    assert bad.returncode == 2 and "no such file" in bad.stderr and "Traceback" not in bad.stderr


def _resolve(*overrides: str):
    return resolve(compose_config(["model=tiny", "training.seq_len=64", "data=files",
                                   *overrides]), host=CPU, explicit=explicit_model_keys(overrides))


def test_torn_shard_is_never_read_as_complete(made, monkeypatch):
    out = made["root"] / "torn"
    real_write, calls = token_shards.ShardWriter._write, []

    def dies_on_third(self, tokens):
        calls.append(1)
        if len(calls) == 3:  # killed mid-write: a .tmp half written, never renamed
            (self.out / f"{self.split}_{len(self.shards):05d}.bin.tmp").write_bytes(b"\0" * 7)
            raise KeyboardInterrupt
        real_write(self, tokens)

    monkeypatch.setattr(token_shards.ShardWriter, "_write", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        _prepare(made, out)
    assert not (out / MANIFEST).exists() and list(out.glob("*.tmp"))
    with pytest.raises(ConfigError, match="did not finish"):
        _resolve(f"data.prepared={out}", "model.vocab_size=320")
    monkeypatch.setattr(token_shards.ShardWriter, "_write", real_write)
    result = _prepare(made, out)  # the rerun continues from the finished shards and finishes
    assert not result.skipped and not list(out.glob("*.tmp"))
    # a listed shard cut short (disk full, copied half-way) is refused, then rebuilt
    shard = out / result.manifest["splits"]["train"]["shards"][0]["file"]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ConfigError, match="cut short"):
        _resolve(f"data.prepared={out}", "model.vocab_size=320")
    assert not _prepare(made, out).skipped
    spec = _resolve(f"data.prepared={out}", "model.vocab_size=320")
    assert spec.data.dtype == "uint16" and len(spec.data.train_files) > 1


def test_resolve_refuses_tokenizer_vocab_mismatch(made, tmp_path):
    out = tmp_path / "p"
    _prepare(made, out)
    with pytest.raises(ConfigError) as err:  # given explicitly: checked, never replaced
        _resolve(f"data.prepared={out}", "model.vocab_size=256")  # 256 < 320
    assert "model.vocab_size=256" in str(err.value) and "model.vocab_size=320" in str(err.value)
    assert len(err.value.problems) == 1
    with pytest.raises(ConfigError, match="set model.vocab_size=320"):
        _resolve(f"data.tokenizer={made['tok']}", "data.train_files=x", "data.val_files=y",
                 "model.vocab_size=256")
    other = train_bpe([made["corpus"] / "doc01.txt"], vocab_size=300, out_dir=tmp_path / "t2")
    with pytest.raises(ConfigError, match="is not the tokenizer"):
        _resolve(f"data.prepared={out}", f"data.tokenizer={other}", "model.vocab_size=320")
    with pytest.raises(ConfigError, match="needs data=files"):
        resolve(compose_config(["model=tiny", f"data.prepared={out}", "model.vocab_size=320"]),
                host=CPU)
    spec = _resolve(f"data.prepared={out}", f"data.tokenizer={made['tok'].parent}",
                    "model.vocab_size=320")
    assert spec.data.tokenizer == str(made["tok"].parent)


def test_jsonl_field_parquet_column_and_wide_vocab(made, tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "hi"}\n')
    with pytest.raises(ValueError, match="--text-field"):
        prepare([str(tmp_path / "bad.jsonl")], tokenizer=str(made["tok"]),
                out_dir=str(tmp_path / "o"), options=PrepareOptions(text_field="body"), workers=1)
    assert token_dtype(65536) == "uint16" and token_dtype(65537) == "uint32"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        (tmp_path / "x.parquet").write_bytes(b"PAR1")
        with pytest.raises(ValueError, match="pyarrow"):
            prepare([str(tmp_path / "x.parquet")], tokenizer=str(made["tok"]),
                    out_dir=str(tmp_path / "o"), options=OPTS, workers=1)
        return
    pq.write_table(pa.table({"content": ["one doc", "two docs here", "three"]}),
                   tmp_path / "x.parquet")
    m = prepare([str(tmp_path / "x.parquet")], tokenizer=str(made["tok"]),
                out_dir=str(tmp_path / "o"), options=PrepareOptions(column="content",
                                                                    val_fraction=0.34),
                workers=1).manifest
    assert (m["documents"], m["splits"]["val"]["documents"]) == (3, 1)
    assert read_manifest(tmp_path / "o")["tokens"] == m["tokens"]
