"""Hostile Hugging Face folders under `model=hf`, one per class: each is refused by resolve()
before launch (torch-free, a ConfigError naming the file, the key or tensor, the rule and a fix),
never a traceback from a rank. A few go through the real command: exit 2, no traceback, no run
dir. The ranks run the same check before they read a byte (a file changed after launch)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conf.errors import ConfigError
from tests.support import safetensors_edits as st
from tests.support.hf_models import make_llama, make_qwen2
from tests.support.meshrun_cli import meshrun
from tests.support.specs import checked_hf_spec as hf_spec

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
Q0 = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A Llama (one file) and a Qwen2 (shards + index) saved once; tests edit copies."""
    root = tmp_path_factory.mktemp("saved")
    make_llama(root / "llama", tied=False)
    make_qwen2(root / "qwen2", max_shard_size="40KB")
    return root


def _copy(saved: Path, tmp_path: Path, which: str = "llama") -> Path:
    return Path(shutil.copytree(saved / which, tmp_path / which))


def _refusal(folder: Path, load_from: Path | str = "") -> str:
    with pytest.raises(ConfigError) as err:
        hf_spec(folder, load_from)
    text = str(err.value)
    assert "fix:" in text
    return text


def _config(folder: Path, change) -> None:
    path = folder / "config.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))  # NaN and Infinity come out as JSON's extensions


def _set(**values):
    return lambda folder: _config(folder, lambda data: data.update(values))


def _drop(key):
    return lambda folder: _config(folder, lambda data: data.pop(key))


CONFIG_CASES = {
    "not json": (lambda f: (f / "config.json").write_text("{oops"), "is not UTF-8 JSON"),
    "not utf-8": (lambda f: (f / "config.json").write_bytes(b'{"a": "\xff"}'), "UTF-8"),
    "a list": (lambda f: (f / "config.json").write_text("[1, 2]"), "holds a JSON list"),
    "a string size": (_set(hidden_size="64"), 'hidden_size="64": must be an integer'),
    "a float size": (_set(num_hidden_layers=2.5), "num_hidden_layers=2.5: must be an integer"),
    "a bool size": (_set(num_attention_heads=True), "num_attention_heads=true: must be an"),
    "a negative size": (_set(intermediate_size=-96), "intermediate_size=-96: must be"),
    "a huge size": (_set(vocab_size=2**80), f"vocab_size={2**80}: must be an integer"),
    "nan": (_set(rms_norm_eps=float("nan")), "rms_norm_eps=NaN: must be a finite positive"),
    "inf": (_set(rope_parameters={"rope_type": "default", "rope_theta": float("inf")}),
            "rope_parameters.rope_theta=Infinity: must be a finite"),
    "a missing key": (_drop("vocab_size"), "vocab_size is missing"),
    "a string bool": (_set(tie_word_embeddings="false"), 'tie_word_embeddings="false": must be'),
    "architectures not a list": (_set(architectures="LlamaForCausalLM"),
                                 'architectures="LlamaForCausalLM": must be a list'),
    "rope not an object": (_set(rope_parameters=[1]), "rope_parameters=[1]: must be an object"),
}


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_a_bad_config_json_names_the_file_and_key(saved, tmp_path, case):
    folder = _copy(saved, tmp_path)
    change, message = CONFIG_CASES[case]
    change(folder)
    text = _refusal(folder)
    assert message in text and str(folder / "config.json") in text


def test_every_bad_config_key_is_named_at_once(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    _set(hidden_size="64", rms_norm_eps=float("nan"), max_position_embeddings=0)(folder)
    text = _refusal(folder)
    assert "(3 problems)" in text
    assert all(key in text for key in ("hidden_size=", "rms_norm_eps=", "max_position_embeddings="))


def _truncate(folder: Path) -> None:
    path = folder / WEIGHTS
    os.truncate(path, path.stat().st_size // 2)


def _offsets_overlap(header: dict) -> None:
    names = sorted((n for n in header if n != "__metadata__"),
                   key=lambda n: header[n]["data_offsets"][0])
    header[names[1]]["data_offsets"] = list(header[names[0]]["data_offsets"])


def _retype(header: dict, dtype: str) -> None:
    header[st.first_tensor(header)]["dtype"] = dtype


def _reshape(header: dict) -> None:
    entry = header[Q0]  # [64, 64] F32 -> [32, 128]: the bytes still agree, config.json does not
    entry["shape"] = [32, 128]


def _header(change):
    return lambda folder: st.edit_header(folder / WEIGHTS, change)


def _raw(transform):
    def edit(folder: Path) -> None:
        path = folder / WEIGHTS
        path.write_bytes(transform(path.read_bytes()))
    return edit


def _rename(old: str, new: str):
    def change(header: dict) -> None:
        header[new] = header.pop(old)
    return change


WEIGHT_CASES = {
    "truncated": (_truncate, "after the header (truncated?)"),
    "empty": (_raw(lambda b: b""), "too short for the 8-byte header length"),
    "header length past the end": (_raw(lambda b: (10**6).to_bytes(8, "little") + b[8:]),
                                   "declares a 1000000-byte header but the file has only"),
    "header length absurd": (_raw(lambda b: (2**62).to_bytes(8, "little") + b[8:]),
                             "over the format's cap"),
    "header not json": (_raw(lambda b: b[:8] + b"\x00" * 16 + b[24:]), "not UTF-8 JSON"),
    "offsets overlap": (_header(_offsets_overlap), "overlap the tensor before it"),
    "offsets and shape disagree": (_header(lambda h: h[Q0].update(shape=[64, 63])),
                                   "needs 16128 bytes but data_offsets"),
    "unknown dtype": (_header(lambda h: _retype(h, "F99")), "is not a safetensors dtype"),
    "integer weights": (_header(lambda h: h[Q0].update(dtype="I32")),
                        f"{Q0} is stored as I32"),
    "shape disagrees with config.json": (_header(_reshape),
                                         f"{Q0} has shape [32, 128], config.json implies [64, 64]"),
    "a tensor missing": (lambda f: _without(f, "model.norm.weight"),
                         "model.norm.weight is missing from model.safetensors (config.json"),
    "a foreign tensor": (_header(_rename("model.norm.weight", "model.rotary.inv_freq")),
                         "model.rotary.inv_freq is a tensor the model has no place for"),
    "a layer too many": (_header(_rename("model.norm.weight", "model.layers.7.input_layernorm"
                                         ".weight")), "has no place in a model of this"),
    "trailing bytes": (_raw(lambda b: b + b"\x00" * 8), "holds 8 bytes after its last tensor"),
    "a name twice": (_raw(lambda b: _duplicate_name(b)), "names 'model.norm.weight' twice"),
    "a bool shape": (_header(lambda h: h[Q0].update(shape=[True, 4096])), "is not a list of"),
}


def _without(folder: Path, name: str) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / WEIGHTS)
    del weights[name]
    save_file(weights, folder / WEIGHTS)


def _duplicate_name(raw: bytes) -> bytes:
    header, data = st.split_bytes(raw)
    text = json.dumps(header)
    entry = json.dumps(header["model.norm.weight"])
    text = text[:-1] + f', "model.norm.weight": {entry}}}'
    return len(text).to_bytes(8, "little") + text.encode() + data


@pytest.mark.parametrize("case", WEIGHT_CASES)
def test_a_bad_weights_file_is_named_before_launch(saved, tmp_path, case):
    folder = _copy(saved, tmp_path)
    edit, message = WEIGHT_CASES[case]
    edit(folder)
    text = _refusal(folder)
    assert message in text and f"model.path={folder}" in text and WEIGHTS in text


def _index(folder: Path, change) -> None:
    path = folder / INDEX
    data = json.loads(path.read_text())
    change(data["weight_map"])
    path.write_text(json.dumps(data))


def _other_shard(weight_map: dict) -> str:
    return next(file for file in sorted(set(weight_map.values())) if file != weight_map[Q0])


INDEX_CASES = {
    "not json": (lambda f: (f / INDEX).write_text("{"), f"{INDEX} is not readable JSON"),
    "no weight_map": (lambda f: (f / INDEX).write_text('{"metadata": {}}'), "has no weight_map"),
    "a missing shard": (lambda f: _index(f, lambda m: m.update({Q0: "model-00009.safetensors"})),
                        "model-00009.safetensors is named by"),
    "a path out of the folder": (lambda f: _index(f, lambda m: m.update({Q0: "../x.safetensors"})),
                                 "is a path out of the folder"),
    "an absolute path": (lambda f: _index(f, lambda m: m.update({Q0: "/etc/passwd"})),
                         "is a path out of the folder"),
    "a tensor in the wrong shard": (lambda f: _index(f, lambda m: m.update({Q0: _other_shard(m)})),
                                    "which does not hold it"),
    "a tensor left out": (lambda f: _index(f, lambda m: m.pop("model.norm.weight")),
                          "model.norm.weight is missing"),
    "a truncated shard": (lambda f: os.truncate(f / sorted(f.glob("model-*.safetensors"))[-1],
                                                100), "truncated"),
}


@pytest.mark.parametrize("case", INDEX_CASES)
def test_a_bad_index_is_named_before_launch(saved, tmp_path, case):
    folder = _copy(saved, tmp_path, "qwen2")
    edit, message = INDEX_CASES[case]
    edit(folder)
    assert message in _refusal(folder)


def test_the_intact_folders_pass(saved):
    assert hf_spec(saved / "llama").model.n_layers == 2
    assert hf_spec(saved / "qwen2").model.attention_bias


def test_load_from_a_bad_hf_folder_is_refused_under_its_own_key(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    _truncate(folder)
    text = _refusal(saved / "llama", folder)
    assert f"checkpoint.load_from={folder}" in text and "truncated" in text


@pytest.mark.e2e
def test_the_command_exits_2_without_a_traceback_or_a_run_dir(saved, tmp_path):
    """Three classes through the real command: the launcher refuses; no rank, no run dir."""
    bad = {"truncated": _truncate, "nan": _set(rms_norm_eps=float("nan")),
           "index": INDEX_CASES["a missing shard"][0]}
    for name, edit in bad.items():
        folder = Path(shutil.copytree(saved / ("qwen2" if name == "index" else "llama"),
                                      tmp_path / name))
        edit(folder)
        runs = tmp_path / f"runs-{name}"
        proc = meshrun("run", "model=hf", f"model.path={folder}", "data=synthetic",
                       "training.device=cpu", "training.steps=1", f"runs_dir={runs}",
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
        assert proc.returncode == 2, (name, proc.stderr)
        assert "Traceback" not in proc.stdout + proc.stderr, name
        assert f"model.path={folder}" in proc.stderr, name
        assert not runs.exists(), name
