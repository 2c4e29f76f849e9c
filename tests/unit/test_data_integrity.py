"""A prepared dir is trusted only as far as it checks out: its manifest is a schema (a wrong
key is named with the file), every shard path stays inside the dir, every shard's sha256 is
verified (before launch, sampled when large; by each rank on every shard it opens, a clean
named stop); special-token text in a document stays text; a full disk is one line and leaves
nothing complete-looking; the stdlib corpus's limits are config errors, not tracebacks."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conf.compose import compose_config
from conf.data_contract.prepared_corpus import MANIFEST, read_manifest, shard_checksums
from conf.data_contract.shard_checks import ShardChecksumError, damaged_shards
from conf.errors import ConfigError
from conf.resolve import resolve
from launcher.cli import main as meshrun
from launcher.commands import with_prepared_data
from launcher.data.token_shards import PrepareOptions, prepare
from tests.support.specs import CPU_HOST, cpu_spec
from tests.support.text_corpora import TWO_TURNS, trained_tokenizer, write_corpus
from training.data.token_windows import TokenDataset

SEQ = 16


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    tok = trained_tokenizer(root)
    corpus = write_corpus(root)
    prepared = prepare([str(corpus)], tokenizer=str(tok), out_dir=str(root / "prep"),
                       options=PrepareOptions(val_fraction=0.2, shard_tokens=2000,
                                              text_field="body"), workers=1)
    return {"root": root, "tok": tok, "corpus": corpus, "prep": prepared.out_dir}


@pytest.fixture
def copy(made, tmp_path):
    """A private copy of the prepared dir to damage."""
    return shutil.copytree(made["prep"], tmp_path / "prep")


def _edit(folder, change) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def _first_shard(m):
    return m["splits"]["train"]["shards"][0]


@pytest.mark.parametrize("change,key", [
    (lambda m: m.update(dtype="float16"), "dtype='float16'"),
    (lambda m: m.pop("splits"), "splits=None"),
    (lambda m: m["splits"].pop("val"), "splits.val=None"),
    (lambda m: m.pop("tokenizer"), "tokenizer=None"),
    (lambda m: m["tokenizer"].update(vocab_size="320"), "tokenizer.vocab_size='320'"),
    (lambda m: _first_shard(m).update(tokens="12"), "splits.train.shards[0].tokens='12'"),
    (lambda m: _first_shard(m).update(file="../outside.bin"), "no absolute path, no `..`"),
    (lambda m: _first_shard(m).update(file="/etc/hostname"), "no absolute path, no `..`"),
    (lambda m: _first_shard(m).update(file="link.bin"), "leads out of the prepared dir"),
    (lambda m: _first_shard(m).update(sha256="abc"), "splits.train.shards[0].sha256='abc'"),
])
def test_a_tampered_manifest_is_refused_naming_key_and_file(copy, change, key):
    (copy.parent / "outside.bin").write_bytes(b"\0" * 4000)
    (copy / "link.bin").symlink_to(copy.parent / "outside.bin")
    _edit(copy, change)
    with pytest.raises(ValueError, match="manifest.json") as err:
        read_manifest(copy)
    assert key in str(err.value)
    cfg = compose_config(["logging=disabled", "model=tiny", "data=files", "model.vocab_size=320",
                          f"data.prepared={copy}", f"training.seq_len={SEQ}"])
    with pytest.raises(ConfigError, match=f"data.prepared={copy}") as err:
        resolve(cfg, host=CPU_HOST, check_paths=True)
    assert key in str(err.value)


def test_a_flipped_byte_is_found_before_launch_by_the_ranks_and_by_a_rerun(made, copy):
    manifest = read_manifest(copy)
    shard = copy / manifest["splits"]["train"]["shards"][1]["file"]
    data = bytearray(shard.read_bytes())
    data[11] ^= 0x01
    shard.write_bytes(bytes(data))
    spec = cpu_spec("model=tiny", "data=files", "model.vocab_size=320", f"data.prepared={copy}",
                    f"training.seq_len={SEQ}")
    with pytest.raises(ConfigError, match=f"shard {shard}: sha256"):
        with_prepared_data(spec)
    checksums = shard_checksums(copy, manifest)
    bad, checked = damaged_shards(checksums, budget_bytes=1)  # a sample: one shard at least
    assert checked == 1 and len(bad) <= 1
    assert damaged_shards(checksums)[1] == len(checksums)  # small: every shard
    files = [str(copy / s["file"]) for s in manifest["splits"]["train"]["shards"]]
    windows = TokenDataset(files, dtype="uint16", seq_len=SEQ, checksums=checksums)
    windows.windows(np.array([0]))  # shard 0 is intact
    with pytest.raises(ShardChecksumError, match=str(shard)):
        windows.windows(np.array([2000 // (SEQ + 1) + 1]))  # the first window in shard 1
    again = prepare([str(made["corpus"])], tokenizer=str(made["tok"]), out_dir=str(copy),
                    options=PrepareOptions(val_fraction=0.2, shard_tokens=2000,
                                           text_field="body"), workers=1)
    assert not again.skipped and damaged_shards(shard_checksums(copy, again.manifest))[0] == []


def test_a_rank_stops_on_a_damaged_shard_with_one_named_line(made, copy, tmp_path):
    runs = tmp_path / "runs"
    assert meshrun(["run", "--prepare-only", "model=tiny", "data=files", "model.vocab_size=320",
                    f"data.prepared={copy}", f"training.seq_len={SEQ}", "training.steps=2",
                    "cluster.procs_per_node=1", "logging=disabled", f"runs_dir={runs}",
                    "training.eval_every=0", "checkpoint.every_steps=0",
                    "training.cpu_peak_flops=1e10"]) == 0
    (run_dir,) = runs.iterdir()
    for shard in read_manifest(copy)["splits"]["train"]["shards"]:  # damaged after the launcher
        (copy / shard["file"]).write_bytes(b"\1\0" * shard["tokens"])
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29000 + os.getpid() % 1000)}
    done = subprocess.run([sys.executable, "-m", "training", str(run_dir)], env=env,
                          capture_output=True, text=True, timeout=120)
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert done.returncode == 1, done.stderr[-2000:]
    assert "rank 0 failed: shard" in log and "sha256" in log
    assert "Traceback" not in log + done.stderr


def test_special_token_text_in_a_document_stays_text_unless_asked(made, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"{i}.txt").write_text(f"the quick </s> brown <s> fox {i}")
    for parse, eos_count in ((False, 3), (True, 6)):
        out = prepare([str(docs)], tokenizer=str(made["tok"]), out_dir=str(tmp_path / str(parse)),
                      options=PrepareOptions(val_fraction=0.0, parse_special=parse), workers=1)
        tokens = np.fromfile(out.out_dir / "train_00000.bin", dtype="uint16")
        assert int((tokens == 1).sum()) == eos_count  # EOS id 1: one per document by default


def _can_mount(folder) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("command", ["prepare", "prepare-sft"])
def test_disk_full_is_one_line_and_leaves_nothing_complete(made, tmp_path, capsys, command):
    full = tmp_path / "full"
    full.mkdir()
    if not _can_mount(full):
        pytest.skip("mounting a 64 KiB tmpfs needs root (CI runs as root)")
    try:
        out = full / "prep"
        if command == "prepare":
            argv = ["data", "prepare", "--tokenizer", str(made["tok"]), "--out", str(out),
                    "--workers", "1", "--shard-tokens", "4096", "--text-field", "body",
                    str(made["corpus"]), str(made["corpus"]), str(made["corpus"])]
        else:
            chats = tmp_path / "c.jsonl"
            chats.write_text("".join(
                json.dumps({"messages": TWO_TURNS}) + "\n" for _ in range(400)))
            argv = ["data", "prepare-sft", "--tokenizer", str(made["tok"]), "--out", str(out),
                    "--seq-len", "255", "--shard-tokens", "4096", str(chats)]
        assert meshrun(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("meshrun data: disk full writing ") and "MiB free" in err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        left = [p.name for p in full.rglob("*")]
        assert MANIFEST not in left and not [n for n in left if n.endswith(".tmp")]
        if command == "prepare-sft":
            assert left == []  # the staging folder is gone
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_stdlib_corpus_limits_are_config_errors(tmp_path):
    spec = cpu_spec("model=tiny", "data.val_every_nth_file=1000000",
                    f"data.cache_dir={tmp_path}")
    with pytest.raises(ConfigError, match="data.val_every_nth_file=1000000: corpus from"):
        with_prepared_data(spec)
