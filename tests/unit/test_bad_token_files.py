"""Token files that would train on garbage are refused before launch (the bad-config corpus's
data half: tests/unit/test_bad_config.py has the rest): a wrong dtype, a size that is not
whole tokens, too few tokens, ids beyond the vocabulary, unreadable or mis-shaped .npy files,
a glob that matches only a folder. Each message names the file, the rule and the fix."""
from __future__ import annotations

import pytest

from conf.compose import compose_config
from conf.errors import ConfigError
from conf.resolve import resolve
from conf.spec import HostSpec

CPU = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=8)


def _error_for(overrides: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        resolve(compose_config(overrides), host=CPU)
    return info.value


def test_data_glob_matching_only_a_directory_is_refused(tmp_path):
    (tmp_path / "shards").mkdir()
    err = _error_for(["data=files", f"data.train_files={tmp_path}/shards",
                      f"data.val_files={tmp_path}/*"])
    assert [p.key for p in err.problems] == ["data.train_files", "data.val_files"]
    assert "matches no file" in str(err)


def _write_tokens(tmp_path, name: str, what: str):
    """A token file of kind `what` at tmp_path/name (ids of a 256-token vocabulary)."""
    import numpy as np

    path = tmp_path / name
    ids = (np.arange(5000) * 7) % 251 + 1
    if what == "uint32":
        ids.astype(np.uint32).tofile(path)
    elif what == "uint32-big-vocab":
        (ids * 500).astype(np.uint32).tofile(path)  # ids up to 125,500: high halves 0 or 1
    elif what == "uint16":
        ids.astype(np.uint16).tofile(path)
    elif what == "odd-bytes":
        path.write_bytes(ids.astype(np.uint16).tobytes() + b"\0")
    elif what == "empty":
        path.write_bytes(b"")
    elif what == "short":
        ids[:20].astype(np.uint16).tofile(path)
    elif what == "big-ids":
        (ids + 1000).astype(np.uint16).tofile(path)
    elif what == "npy-float":
        np.save(path, ids.astype(np.float32))
    elif what == "npy-2d":
        np.save(path, ids[:4000].reshape(40, 100))
    elif what == "npy-big-ids":
        np.save(path, np.full(4096, 999, dtype=np.int64))
    elif what == "npy-not-npy":
        path.write_bytes(b"not numpy at all")
    return path


TOKEN_FILE_CASES = {
    # id: (file kind, file name, extra overrides, substrings the message must hold)
    "uint32-read-as-uint16": ("uint32", "t.bin", [], [
        "every other value is 0", "uint32 tokens read as uint16", "data.dtype=uint32"]),
    "uint32-big-vocab-read-as-uint16": ("uint32-big-vocab", "t.bin", ["model.vocab_size=128256"],
                                        ["uint32 tokens read as uint16", "data.dtype=uint32"]),
    "size-not-whole-tokens": ("odd-bytes", "t.bin", [], [
        "10001 bytes", "not a whole number of uint16 tokens", "data.dtype"]),
    "empty-file": ("empty", "t.bin", [], ["is empty", "non-empty token file"]),
    "fewer-than-one-window": ("short", "t.bin", [], [
        "hold 20 tokens", "training.seq_len+1=129", "shorter seq_len"]),
    "ids-beyond-vocab": ("big-ids", "t.bin", [], [
        "token id 1251", "model.vocab_size=256", "raise model.vocab_size"]),
    "npy-float": ("npy-float", "t.npy", [], ["1-D float32 array", "1-D integer arrays"]),
    "npy-2d": ("npy-2d", "t.npy", [], ["2-D int64 array", "flat integer array"]),
    "npy-ids-beyond-vocab": ("npy-big-ids", "t.npy", [], ["token id 999", "vocab_size=256"]),
    "npy-unreadable": ("npy-not-npy", "t.npy", [], ["not a readable .npy file", "numpy.save"]),
}


@pytest.mark.parametrize("name", TOKEN_FILE_CASES)
def test_token_file_that_would_train_on_garbage_is_refused(name, tmp_path):
    what, file_name, extra, expect = TOKEN_FILE_CASES[name]
    bad = _write_tokens(tmp_path, file_name, what)
    good = _write_tokens(tmp_path, "good.bin", "uint16")
    err = _error_for(["data=files", f"data.train_files={bad}", f"data.val_files={good}", *extra])
    message = str(err)
    assert [p.key for p in err.problems] == ["data.train_files"], message
    assert str(bad) in message and all(e in message for e in expect), message
    assert all(p.fix for p in err.problems) and "Traceback" not in message


def test_good_token_files_pass(tmp_path):
    good = _write_tokens(tmp_path, "good.bin", "uint16")
    wide = _write_tokens(tmp_path, "wide.bin", "uint32")
    resolve(compose_config(["data=files", f"data.train_files={good}",
                            f"data.val_files={good}"]), host=CPU)
    resolve(compose_config(["data=files", f"data.train_files={wide}", f"data.val_files={wide}",
                            "data.dtype=uint32"]), host=CPU)


def test_cli_refuses_a_uint32_file_read_as_uint16_and_writes_nothing(tmp_path, capsys):
    from launcher.cli import main

    bad = _write_tokens(tmp_path, "t.bin", "uint32")
    runs = tmp_path / "runs"
    status = main(["run", "model=tiny", "data=files", f"data.train_files={bad}",
                   f"data.val_files={bad}", f"runs_dir={runs}"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err and "data.dtype=uint32" in err
    assert not runs.exists()
