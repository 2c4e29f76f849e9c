"""data.sources / data.weights: samples drawn from several prepared dirs by weight, the same
for any dp degree, resumable from the batch state dict, each source visiting every window once
per epoch of its own; resolve() checks the sources and weights."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from conf.errors import ConfigError
from launcher.data.hf_tokenizer import train_bpe
from launcher.data.token_shards import PrepareOptions, prepare
from launcher.data.sft_prepare import SftOptions, prepare_sft
from training.data.token_windows import TokenDataset
from training.data.mixture import MixtureBatches

SEQ = 15
WORDS = {"a": "alpha beta gamma delta".split(), "z": "zulu yankee xray whiskey".split()}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two prepared dirs whose texts share no word, so no window of one is a window of the
    other; one tokenizer."""
    root = tmp_path_factory.mktemp("mix")
    rnd = random.Random(0)
    corpora = {}
    for name, words in WORDS.items():
        corpora[name] = root / f"{name}.txt"
        corpora[name].write_text("\n".join(" ".join(rnd.choices(words, k=40))
                                           for _ in range(40)))
    tok = train_bpe(list(corpora.values()), vocab_size=300, out_dir=root / "tok").parent
    dirs = []
    for name, corpus in corpora.items():
        docs = root / f"{name}_docs"
        docs.mkdir()
        for i, line in enumerate(corpus.read_text().splitlines()):
            (docs / f"{i:03d}.txt").write_text(line)
        prepare([str(docs)], tokenizer=str(tok), out_dir=str(root / f"prep_{name}"),
                options=PrepareOptions(val_fraction=0.1, shard_tokens=500), workers=1)
        dirs.append(str(root / f"prep_{name}"))
    return dirs


def _batches(sources, **kw):
    args = dict(sources=sources, weights=(3.0, 1.0), seq_len=SEQ, seed=5, global_batch_size=8,
                micro_batch_size=2, grad_accum_steps=4, dp_rank=0, dp_size=1, vocab_size=300)
    return MixtureBatches(**{**args, **kw})


def _windows_of(source: str) -> set[tuple]:
    from conf.data_contract.prepared_corpus import read_manifest, shard_paths

    m = read_manifest(source)
    data = TokenDataset(shard_paths(source, m, "train"), dtype=m["dtype"], seq_len=SEQ)
    return {tuple(w) for w in data.windows(np.arange(data.n_windows))}


def _rows(micro_batches) -> list[tuple]:
    return [tuple(inputs[r].tolist()) + (int(targets[r, -1]),)
            for inputs, targets in micro_batches for r in range(len(inputs))]


def test_samples_follow_the_weights_and_each_source_visits_its_windows_once(sources):
    sets = [_windows_of(s) for s in sources]
    assert not sets[0] & sets[1]
    batches = _batches(sources)
    drawn = {0: [], 1: []}
    for _ in range(60):
        for row in _rows(batches.next_step()):
            (k,) = [k for k in (0, 1) if row in sets[k]]
            drawn[k].append(row)
    n = len(drawn[0]) + len(drawn[1])
    assert abs(len(drawn[0]) / n - 0.75) < 3 * (0.75 * 0.25 / n) ** 0.5, len(drawn[0])
    assert batches.taken == [len(drawn[0]), len(drawn[1])]
    for k in (0, 1):  # within each epoch of a source, no window twice
        size = len(sets[k])
        for start in range(0, len(drawn[k]) - size + 1, size):
            assert len(set(drawn[k][start:start + size])) == size


def test_any_dp_degree_sees_the_same_global_batches_and_resume_is_exact(sources):
    whole = _batches(sources)
    halves = [_batches(sources, dp_rank=r, dp_size=2, grad_accum_steps=2) for r in (0, 1)]
    for _ in range(3):
        expected = _rows(whole.next_step())
        assert _rows(halves[0].next_step()) + _rows(halves[1].next_step()) == expected
    state = whole.state_dict()
    resumed = _batches(sources, dp_rank=1, dp_size=2, grad_accum_steps=2)
    resumed.load_state_dict(state)
    assert _rows(resumed.next_step()) == _rows(whole.next_step())[4:]
    with pytest.raises(ValueError, match="cannot resume the data mixture"):
        _batches(sources, weights=(1.0, 1.0)).load_state_dict(state)


def test_resolve_checks_sources_and_weights(sources, tmp_path):
    from tests.support.specs import cpu_spec
    from training.data.build import build_train_batches

    base = ["model=tiny", "data=files", "parallel=single", "model.vocab_size=300",
            f"training.seq_len={SEQ}", f"data.sources=[{sources[0]},{sources[1]}]"]
    spec = cpu_spec(*base, "data.weights=[3,1]")
    assert spec.data.sources == tuple(sources) and spec.data.weights == (3.0, 1.0)
    assert len(spec.data.val_files) == 2
    assert isinstance(build_train_batches(spec.data, spec.training, dp_rank=0, dp_size=1),
                      MixtureBatches)
    with pytest.raises(ConfigError, match=r"data.weights=\[1.0\]: needs one positive weight"):
        cpu_spec(*base, "data.weights=[1]")
    with pytest.raises(ConfigError, match="together with data.prepared"):
        cpu_spec(*base, f"data.prepared={sources[0]}")
    from conf.compose import compose_config
    from conf.resolve import resolve
    from tests.support.specs import CPU_HOST

    cfg = compose_config(["logging=disabled", *base[:-1],
                          f"data.sources=[{sources[0]},{tmp_path}]"])
    with pytest.raises(ConfigError, match=f"data.sources={tmp_path}: holds no manifest.json"):
        resolve(cfg, host=CPU_HOST, check_paths=True)
    chats = tmp_path / "c.jsonl"
    chats.write_text('{"messages": [{"role": "user", "content": "alpha"}, '
                     '{"role": "assistant", "content": "zulu"}]}\n' * 4)
    tok = str(Path(sources[0]).parent / "tok")
    sft, *_ = prepare_sft([str(chats)], tokenizer=tok, out_dir=str(tmp_path / "sft"),
                          options=SftOptions(seq_len=SEQ * 8 + 1, val_fraction=0.25))
    with pytest.raises(ConfigError, match="is SFT data"):
        cpu_spec(*base[:-1], f"data.sources=[{sources[0]},{sft}]")
