"""`model=hf model.path=DIR` with explicit model.* overrides: a shape knob that disagrees with
DIR/config.json is a clear error (exit 2 through the real command, before any rank starts); an
equal one is fine; max_seq_len and init_std, which the weights do not depend on, take the
override. The folder is a plain config.json as transformers writes it (no torch needed)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conf.compose import compose_config
from conf.errors import ConfigError
from conf.hf_model_config import explicit_model_keys
from conf.resolve import resolve
from tests.support.meshrun_cli import meshrun
from tests.support.specs import CPU_HOST

REPO = Path(__file__).resolve().parents[2]
LLAMA = {"architectures": ["LlamaForCausalLM"], "vocab_size": 300, "hidden_size": 64,
         "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
         "rope_theta": 500000.0, "tie_word_embeddings": True, "initializer_range": 0.02,
         "hidden_act": "silu"}


@pytest.fixture
def hf_dir(tmp_path) -> Path:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    (folder / "model.safetensors").write_bytes(b"")  # resolve() reads only config.json
    return folder


def _spec(folder: Path, *overrides: str):
    lines = ["logging=disabled", "model=hf", f"model.path={folder}", "data=synthetic",
             "training.seq_len=64", *overrides]
    return resolve(compose_config(lines), host=CPU_HOST, check_paths=False,
                   explicit=explicit_model_keys(lines))


@pytest.mark.e2e
def test_conflicting_shape_override_exits_2_through_the_cli(hf_dir, tmp_path):
    runs_dir = tmp_path / "runs"
    args = ["run", "model=hf", f"model.path={hf_dir}", "model.n_layers=4", "model.dim=64",
            "data=synthetic", "training.device=cpu", "training.steps=1", f"runs_dir={runs_dir}"]
    proc = meshrun(*args, env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "1000"},
                   timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "Invalid run config (1 problem)" in proc.stderr  # model.dim=64 agrees: not listed
    assert "model.n_layers=4: conflicts with n_layers=2 (num_hidden_layers in " in proc.stderr
    assert f"{hf_dir / 'config.json'}" in proc.stderr
    assert "fix: drop model.n_layers= or set it to 2" in proc.stderr
    assert not runs_dir.exists()  # refused before a run dir (or a rank) exists


def test_every_conflict_is_named_at_once(hf_dir):
    with pytest.raises(ConfigError) as err:
        _spec(hf_dir, "model.tie_embeddings=false", "model.n_kv_heads=-1",
              "++model.rope_theta=10000", "model.norm_eps=1e-6")
    text = str(err.value)
    assert "(3 problems)" in text  # norm_eps agrees
    assert "model.tie_embeddings=false: conflicts with tie_embeddings=true " \
           "(tie_word_embeddings in" in text
    assert "model.n_kv_heads=4: conflicts with n_kv_heads=2" in text  # -1 means n_heads (4)
    assert "model.rope_theta=10000.0: conflicts with rope_theta=500000.0" in text


def test_equal_overrides_pass_and_unsettable_knobs_take_the_override(hf_dir):
    spec = _spec(hf_dir, "model.n_layers=2", "model.vocab_size=300", "model.tie_embeddings=true")
    assert (spec.model.n_layers, spec.model.max_seq_len, spec.model.init_std) == (2, 128, 0.02)
    spec = _spec(hf_dir, "model.max_seq_len=256", "model.init_std=0.01")
    assert (spec.model.max_seq_len, spec.model.init_std, spec.model.dim) == (256, 0.01, 64)
    # without the command line's keys (a caller that does not pass them) config.json decides
    cfg = compose_config(["logging=disabled", "model=hf", f"model.path={hf_dir}",
                          "data=synthetic", "model.max_seq_len=256"])
    assert resolve(cfg, host=CPU_HOST, check_paths=False).model.max_seq_len == 128


def test_explicit_keys_read_every_override_form():
    lines = ["model=hf", "model.n_layers=4", "+model.dim=8", "++model.ffn_dim=16",
             "~model.norm_eps", "training.steps=3", "model.path='/a b'"]
    assert explicit_model_keys(lines) == {"model.n_layers", "model.dim", "model.ffn_dim",
                                          "model.path"}
