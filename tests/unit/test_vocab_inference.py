"""model.vocab_size inferred from the data when the user gives none (conf/data_contract/
vocab_inference.py): the prepared corpus's manifest, else data.tokenizer; padded to a multiple
of parallel.tp; a value given on the command line is kept, and refused when too small."""
from __future__ import annotations

import pytest

from conf.compose import compose_config
from conf.errors import ConfigError
from conf.hf_model_config import explicit_model_keys
from conf.resolve import resolve
from launcher.data.hf_tokenizer import train_bpe
from launcher.data.token_shards import PrepareOptions, prepare
from tests.support.meshrun_cli import REPO, meshrun
from tests.support.specs import CPU_HOST
from tests.support.text_corpora import write_corpus

VOCAB = 301  # odd: tp=2 pads it to 302


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab")
    corpus = write_corpus(root)
    tok = train_bpe(sorted(corpus.glob("*.txt")), vocab_size=VOCAB, out_dir=root / "tok")
    out = root / "prep"
    prepare([str(corpus)], tokenizer=str(tok.parent), out_dir=str(out),
            options=PrepareOptions(val_fraction=0.2, shard_tokens=3000, text_field="body"),
            workers=1)
    return {"tok": tok, "prep": out}


def _spec(*overrides: str):
    """As the CLI resolves: the keys the overrides set are explicit."""
    lines = ["model=tiny", "logging=disabled", "data=files", "training.seq_len=32", *overrides]
    return resolve(compose_config(lines), host=CPU_HOST, explicit=explicit_model_keys(lines))


def test_inferred_from_the_manifest_and_from_the_tokenizer(prepared):
    assert _spec(f"data.prepared={prepared['prep']}").model.vocab_size == VOCAB
    tp = _spec(f"data.prepared={prepared['prep']}", "parallel.tp=2")
    assert tp.model.vocab_size == VOCAB + 1  # a multiple of tp: the head splits evenly
    by_tokenizer = _spec(f"data.tokenizer={prepared['tok']}",
                         f"data.train_files={prepared['prep']}/train_00000.bin",
                         f"data.val_files={prepared['prep']}/val_00000.bin")
    assert by_tokenizer.model.vocab_size == VOCAB
    assert _spec("data=synthetic").model.vocab_size == 256  # nothing to infer from


def test_a_given_value_is_kept_or_refused_never_replaced(prepared):
    wider = _spec(f"data.prepared={prepared['prep']}", "model.vocab_size=384")
    assert wider.model.vocab_size == 384
    with pytest.raises(ConfigError) as err:
        _spec(f"data.prepared={prepared['prep']}", "model.vocab_size=256")
    assert [p.key for p in err.value.problems] == ["model.vocab_size"]
    assert f"set model.vocab_size={VOCAB}" in str(err.value)


def test_dry_run_says_where_the_vocab_came_from(prepared, tmp_path):
    proc = meshrun("run", "--dry-run", "model=tiny", "data=files", "training.seq_len=32",
                   f"data.prepared={prepared['prep']}", f"runs_dir={tmp_path}", columns=250,
                   env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"tokenizer vocab {VOCAB} (the manifest of" in proc.stdout
    assert f"model.vocab_size {VOCAB}" in proc.stdout
