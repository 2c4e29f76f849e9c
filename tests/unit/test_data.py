"""Corpus preparation (launcher/data/stdlib_corpus.py) and rank-side batches (training/data/batches.py)."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conf.schema import DataKind, DeviceKind
from conf.spec import TOKEN_DTYPES, DataSpec, TrainingSpec
from launcher.data import stdlib_corpus as data_prep
from training.data.batches import SyntheticBatches, TrainBatches, val_batches
from training.data.build import build_train_batches, build_val_batches
from training.data.token_windows import TokenDataset, check_token_ids
from launcher.data.stdlib_corpus import expand_token_files, prepare_stdlib_corpus, stdlib_corpus_dir

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stdlib_corpus(tmp_path_factory):
    return prepare_stdlib_corpus(cache_dir=tmp_path_factory.mktemp("cache"), val_every_nth_file=50)


@pytest.fixture
def token_file(tmp_path) -> str:
    """A uint16 .bin of 10_000 tokens whose values equal their index mod 60_000."""
    path = tmp_path / "tokens.bin"
    (np.arange(10_000) % 60_000).astype(np.uint16).tofile(path)
    return str(path)


def _loader(files, *, dp_size=1, dp_rank=0, micro=4, accum=2, global_batch=None, seed=7,
            seq_len=15) -> TrainBatches:
    return TrainBatches(files=files, dtype="uint16", seq_len=seq_len, seed=seed,
                        global_batch_size=global_batch or micro * accum * dp_size,
                        micro_batch_size=micro, grad_accum_steps=accum, dp_rank=dp_rank,
                        dp_size=dp_size)


def _step_inputs(batches) -> torch.Tensor:
    return torch.cat([inputs for inputs, _ in batches.next_step()])


# --- corpus preparation ---------------------------------------------------------------------

def test_stdlib_manifest_counts_and_checksums(stdlib_corpus):
    manifest = data_prep.read_manifest(stdlib_corpus.manifest_path)
    paths = data_prep.list_source_files(data_prep.default_stdlib_dir())
    assert not any("site-packages" in p for p in paths)
    assert stdlib_corpus.train_source_files + stdlib_corpus.val_source_files == len(paths)
    assert stdlib_corpus.val_source_files == len(paths) // 50
    assert manifest["dtype"] == "uint8" and manifest["vocab_size"] == 256
    for name, files, tokens in [("train", stdlib_corpus.train_files, stdlib_corpus.train_tokens),
                                ("val", stdlib_corpus.val_files, stdlib_corpus.val_tokens)]:
        content = Path(files[0]).read_bytes()
        assert len(content) == tokens == manifest["splits"][name]["tokens"]
        assert hashlib.sha256(content).hexdigest() == manifest["splits"][name]["sha256"]
    assert stdlib_corpus.train_tokens > 10 * stdlib_corpus.val_tokens > 0


def test_stdlib_val_files_disjoint_and_content(stdlib_corpus):
    source = data_prep.default_stdlib_dir()
    splits = data_prep.split_source_files(data_prep.list_source_files(source),
                                          val_every_nth_file=50)
    assert not set(splits["train"]) & set(splits["val"])
    expected_val = data_prep.SEPARATOR.join((source / p).read_bytes() for p in splits["val"])
    assert Path(stdlib_corpus.val_files[0]).read_bytes() == expected_val


def test_stdlib_second_call_reuses(stdlib_corpus):
    cache_dir = stdlib_corpus.directory.parent
    again = prepare_stdlib_corpus(cache_dir=cache_dir, val_every_nth_file=50)
    assert again.reused and not stdlib_corpus.reused
    assert again.directory == stdlib_corpus.directory == stdlib_corpus_dir(
        cache_dir=cache_dir, val_every_nth_file=50)
    assert [p.name for p in cache_dir.iterdir()] == [stdlib_corpus.directory.name]  # no temp left


def _small_source(tmp_path) -> Path:
    source = tmp_path / "src"
    for i in range(10):
        (source / f"pkg{i % 2}").mkdir(parents=True, exist_ok=True)
        (source / f"pkg{i % 2}" / f"m{i}.py").write_text(f"x = {i}\n")
    (source / "site-packages").mkdir()
    (source / "site-packages" / "skip.py").write_text("skip\n")
    (source / "notes.txt").write_text("not python\n")
    return source


def test_small_source_split_and_rebuild_of_broken_copy(tmp_path):
    source = _small_source(tmp_path)
    corpus = prepare_stdlib_corpus(cache_dir=tmp_path / "c", val_every_nth_file=3,
                                   source_dir=source)
    assert (corpus.train_source_files, corpus.val_source_files) == (7, 3)
    assert b"skip" not in Path(corpus.train_files[0]).read_bytes()
    Path(corpus.train_files[0]).write_bytes(b"truncated")
    rebuilt = prepare_stdlib_corpus(cache_dir=tmp_path / "c", val_every_nth_file=3,
                                    source_dir=source)
    assert not rebuilt.reused and Path(rebuilt.train_files[0]).stat().st_size == corpus.train_tokens
    with pytest.raises(ValueError, match="val_every_nth_file"):
        prepare_stdlib_corpus(cache_dir=tmp_path / "c", val_every_nth_file=1, source_dir=source)


def test_concurrent_preparers_agree(tmp_path):
    source = _small_source(tmp_path)
    code = ("import sys; from pathlib import Path; from launcher.data.stdlib_corpus import "
            "prepare_stdlib_corpus as p; c = p(cache_dir=Path(sys.argv[1]), val_every_nth_file=3, "
            "source_dir=Path(sys.argv[2])); print(c.directory)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "c"), str(source)],
                              cwd=REPO, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outputs = {proc.communicate(timeout=60)[0].strip() for proc in procs}
    assert all(proc.returncode == 0 for proc in procs)
    assert len(outputs) == 1 and [p.name for p in (tmp_path / "c").iterdir()] == [
        Path(outputs.pop()).name]


def test_data_prep_imports_neither_torch_nor_numpy():
    code = ("import sys, launcher.data.stdlib_corpus; "
            "assert not {'torch', 'numpy', 'hydra', 'omegaconf'} & set(sys.modules)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_expand_token_files(tmp_path):
    for name in ["b.bin", "a.bin", "c.npy", "skip.txt"]:
        (tmp_path / name).write_bytes(b"\0\0")
    assert expand_token_files(str(tmp_path / "*.bin")) == [str(tmp_path / "a.bin"),
                                                           str(tmp_path / "b.bin")]
    assert expand_token_files(str(tmp_path / "c.npy")) == [str(tmp_path / "c.npy")]
    assert expand_token_files(str(tmp_path)) == [str(tmp_path / n) for n in ["a.bin", "b.bin",
                                                                              "c.npy"]]
    assert expand_token_files(str(tmp_path / "none-*.bin")) == []
    assert expand_token_files(str(tmp_path / "missing.bin")) == []
    assert expand_token_files("") == []


# --- token files and batches ----------------------------------------------------------------

def test_npy_and_bin_uint16_concatenate_logically(tmp_path):
    tokens = np.arange(1000, dtype=np.int64) + 40_000
    np.save(tmp_path / "a.npy", tokens[:333].astype(np.int32))
    tokens[333:].astype(np.uint16).tofile(tmp_path / "b.bin")
    dataset = TokenDataset([str(tmp_path / "a.npy"), str(tmp_path / "b.bin")], dtype="uint16",
                           seq_len=9)
    assert dataset.n_windows == 100
    windows = dataset.windows(np.array([33, 0, 99]))  # window 33 spans both files
    assert windows.dtype == np.int64
    np.testing.assert_array_equal(windows, tokens.reshape(100, 10)[[33, 0, 99]])


@pytest.mark.parametrize("dtype", list(TOKEN_DTYPES))
def test_every_token_dtype_resolve_accepts_is_read(tmp_path, dtype):
    """conf.spec.TOKEN_DTYPES is the one table: resolve() accepts these, the reader reads them."""
    tokens = np.arange(40, dtype=np.int64) % 200
    tokens.astype(dtype).tofile(tmp_path / "t.bin")
    dataset = TokenDataset([str(tmp_path / "t.bin")], dtype=dtype, seq_len=9)
    assert dataset.n_tokens == 40
    np.testing.assert_array_equal(dataset.windows(np.arange(4)), tokens.reshape(4, 10))


def test_negative_token_ids_are_reported(tmp_path):
    np.full(20, -1, dtype=np.int32).tofile(tmp_path / "neg.bin")
    dataset = TokenDataset([str(tmp_path / "neg.bin")], dtype="int32", seq_len=9)
    with pytest.raises(ValueError, match="token id -1 .* is negative"):
        check_token_ids(dataset.windows(np.arange(2)), vocab_size=256, files=dataset.files)


def test_raw_file_with_wrong_dtype_is_reported(tmp_path):
    (tmp_path / "odd.bin").write_bytes(b"\0" * 7)
    with pytest.raises(ValueError, match="whole number of uint16"):
        TokenDataset([str(tmp_path / "odd.bin")], dtype="uint16", seq_len=2)


def test_inputs_and_targets_are_shifted_windows(token_file):
    (inputs, targets), _ = _loader([token_file]).next_step()
    assert inputs.shape == targets.shape == (4, 15) and inputs.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert torch.all(inputs[:, 0] % 16 == 0)  # windows start on multiples of seq_len+1


def test_order_is_deterministic_from_seed(token_file):
    first, same, other = _loader([token_file]), _loader([token_file]), _loader([token_file], seed=8)
    a, b, c = _step_inputs(first), _step_inputs(same), _step_inputs(other)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("dp_size,micro,accum", [(1, 2, 8), (2, 2, 4), (2, 4, 2), (4, 1, 4),
                                                  (4, 4, 1)])
def test_dp_ranks_together_equal_single_rank_batch(token_file, dp_size, micro, accum):
    reference = _loader([token_file], micro=16, accum=1)
    ranks = [_loader([token_file], dp_size=dp_size, dp_rank=r, micro=micro, accum=accum)
             for r in range(dp_size)]
    for _ in range(3):
        expected = _step_inputs(reference)
        combined = torch.cat([_step_inputs(rank) for rank in ranks])
        assert torch.equal(combined, expected)


def test_resume_continues_exactly_even_with_other_dp(token_file):
    original = _loader([token_file], micro=4, accum=2)
    for _ in range(5):
        original.next_step()
    state = original.state_dict()
    assert state["position"] == 40
    resumed = [_loader([token_file], dp_size=2, dp_rank=r, micro=4, accum=1) for r in range(2)]
    for rank in resumed:
        rank.load_state_dict(state)
    for _ in range(3):
        assert torch.equal(_step_inputs(original),
                           torch.cat([_step_inputs(rank) for rank in resumed]))
    with pytest.raises(ValueError, match="seed"):
        _loader([token_file], seed=99).load_state_dict(state)


def test_epoch_wraps_to_a_new_permutation(token_file):
    loader = _loader([token_file], micro=5, accum=1, seq_len=99)  # 100 windows, 20 steps/epoch
    assert loader.dataset.n_windows == 100
    starts = [int(x) for _ in range(40) for x in _step_inputs(loader)[:, 0]]
    first, second = starts[:100], starts[100:]
    assert sorted(first) == sorted(second) == list(range(0, 10_000, 100))
    assert first != second and loader.epoch == 2.0


def test_batch_spanning_epoch_boundary(token_file):
    loader = _loader([token_file], micro=7, accum=1, seq_len=99)  # 100 windows, 7 per step
    starts = [int(x) for _ in range(30) for x in _step_inputs(loader)[:, 0]]
    assert sorted(starts[:100]) == sorted(starts[100:200]) == list(range(0, 10_000, 100))


def test_layout_mismatch_is_reported(token_file):
    with pytest.raises(ValueError, match="global_batch_size"):
        _loader([token_file], micro=4, accum=2, dp_size=2, global_batch=12)


def test_token_ids_beyond_vocab_are_reported(token_file):
    loader = TrainBatches(files=[token_file], dtype="uint16", seq_len=15, seed=0,
                          global_batch_size=4, micro_batch_size=4, grad_accum_steps=1,
                          dp_rank=0, dp_size=1, vocab_size=256)
    with pytest.raises(ValueError, match="vocab_size"):
        for _ in range(200):
            loader.next_step()


def test_val_batches_fixed_sharded_and_cycled(token_file):
    def collect(dp_size, rank, n_batches=3, micro=4):
        batches = val_batches(files=[token_file], dtype="uint16", seq_len=999,
                              micro_batch_size=micro, n_batches=n_batches, dp_rank=rank,
                              dp_size=dp_size)
        return [inputs for inputs, _ in batches], batches

    single, batches = collect(1, 0)
    assert all(torch.equal(a, b) for a, b in zip(single, collect(1, 0)[0]))
    assert all(torch.equal(a, b) for a, (b, _) in zip(single, batches))  # re-iterable
    assert [int(x) for x in torch.cat(single)[:, 0]] == [1000 * (i % 10) for i in range(12)]
    halves = [collect(2, r, micro=2)[0] for r in range(2)]
    for i in range(3):  # val micro-batch i over both ranks == single-rank micro-batch i
        assert torch.equal(torch.cat([halves[0][i], halves[1][i]]), single[i])
    assert batches.n_distinct_samples == 10


def test_synthetic_is_deterministic_and_resumable():
    def make(rank=0, dp=1, accum=2):
        return SyntheticBatches(vocab_size=50, seq_len=8, seed=3, global_batch_size=8,
                                micro_batch_size=8 // (dp * accum), grad_accum_steps=accum,
                                dp_rank=rank, dp_size=dp)

    reference, resumed = make(), make(rank=1, dp=2, accum=1)
    first = _step_inputs(reference)
    assert int(first.max()) < 50 and torch.equal(first, _step_inputs(make()))
    resumed.load_state_dict(reference.state_dict())
    assert torch.equal(_step_inputs(resumed), _step_inputs(reference)[4:])


def _spec(kind, train, val, *, dtype="uint16") -> tuple[DataSpec, TrainingSpec]:
    data = DataSpec(kind=DataKind(kind), train_files=tuple(train), val_files=tuple(val),
                    dtype=dtype, cache_dir="/tmp", val_every_nth_file=50, vocab_size=256)
    training = TrainingSpec(steps=10, seq_len=32, micro_batch_size=2, grad_accum_steps=2,
                            global_batch_size=8, seed=1, eval_every=5, eval_batches=3,
                            log_every=1, device=DeviceKind.cpu, compile=False, stop_at_step=0,
                            cpu_peak_flops=0.0)
    return data, training


def test_builders_pick_by_kind(stdlib_corpus):
    data, training = _spec("stdlib", stdlib_corpus.train_files, stdlib_corpus.val_files)
    train = build_train_batches(data, training, dp_rank=1, dp_size=2)
    assert isinstance(train, TrainBatches) and train.dataset.n_tokens == stdlib_corpus.train_tokens
    assert [x.shape for x, _ in train.next_step()] == [(2, 32), (2, 32)]
    assert len(list(build_val_batches(data, training, dp_rank=1, dp_size=2))) == 3
    synthetic = build_train_batches(*_spec("synthetic", [], []), dp_rank=0, dp_size=2)
    assert isinstance(synthetic, SyntheticBatches)
    with pytest.raises(ValueError, match="data.val_files is empty"):
        build_val_batches(*_spec("files", stdlib_corpus.train_files, []), dp_rank=0, dp_size=1)


def test_manifest_is_json_with_format_version(stdlib_corpus):
    manifest = json.loads(stdlib_corpus.manifest_path.read_text())
    assert manifest["format_version"] == data_prep.FORMAT_VERSION
    assert manifest["source_dir"] == str(data_prep.default_stdlib_dir())
