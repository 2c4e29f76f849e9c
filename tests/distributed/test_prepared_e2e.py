"""End to end, one launch: train a BPE, `meshrun data prepare` a corpus, then
`meshrun run model=hf model.path=DIR data=files data.prepared=...` (one torchrun rank) starts
from a transformers Llama (llama3 RoPE, tied embeddings), trains 3 steps on the shards (the
first loss is transformers' loss on the same batch) and exports; transformers'
AutoModelForCausalLM and AutoTokenizer load the export."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.support.meshrun_cli import meshrun

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]


def test_hf_model_trains_on_prepared_shards_and_exports(tmp_path):
    rnd = random.Random(1)
    words = "alpha beta gamma delta tokens shards loss falls".split()
    for i in range(30):
        (tmp_path / f"d{i}.txt").write_text(" ".join(rnd.choices(words, k=200)))
    files = sorted(str(p) for p in tmp_path.glob("d*.txt"))
    done = meshrun("data", "train-tokenizer", "--vocab-size", "300", "--out",
                   str(tmp_path / "tok"), *files)
    assert done.returncode == 0, done.stderr
    done = meshrun("data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--out",
                   str(tmp_path / "prep"), "--val-fraction", "0.2", "--workers", "1", *files)
    assert done.returncode == 0, done.stderr
    from tests.support.hf_models import make_llama  # imports torch and transformers

    reference = make_llama(tmp_path / "hf", tied=True)  # vocab 300, 2 layers, dim 64
    done = meshrun("run", "model=hf", f"model.path={tmp_path / 'hf'}", "data=files",
                   f"data.prepared={tmp_path / 'prep'}", f"data.tokenizer={tmp_path / 'tok'}",
                   "training.steps=3", "training.seq_len=32", "training.micro_batch_size=4",
                   "training.eval_every=0", "training.eval_batches=1", "checkpoint.every_steps=0",
                   "logging=disabled", "cluster.procs_per_node=1", f"runs_dir={tmp_path / 'runs'}")
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    _check_weights_line(done.stdout + done.stderr, run_dir, reference, tmp_path / "hf")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}
    assert sorted(losses) == [1, 2, 3]
    spec = json.loads((run_dir / "spec.json").read_text())
    assert spec["data"]["dtype"] == "uint16" and spec["data"]["prepared"].endswith("prep")
    assert losses[1] == pytest.approx(_reference_first_loss(reference, run_dir), rel=1e-5)
    _check_export(run_dir / "export", reference, tmp_path / "tok")


def _check_weights_line(console: str, run_dir: Path, reference, folder: Path) -> None:
    """The run says once, in the console and rank 0's log, where its weights came from and how
    many tensors and parameters (the tied head is the embedding: not counted twice)."""
    params = list(reference.parameters())  # a tied head appears once
    line = (f"loaded Hugging Face weights from {folder}: {len(params)} tensors, "
            f"{sum(p.numel() for p in params):,} parameters, ")
    assert [x for x in console.splitlines() if "loaded Hugging Face" in x] == [
        x for x in console.splitlines() if x.startswith(line)] and line in console, console
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert log.count("loaded Hugging Face weights") == 1 and line in log


def _reference_first_loss(reference, run_dir: Path) -> float:
    """transformers' mean token loss on the batch the run's step 1 trained on."""
    import torch
    import torch.nn.functional as F

    from conf.run_dir.paths import RunDir
    from training.data.build import build_train_batches

    spec = RunDir(run_dir).read_spec()
    ((inputs, targets),) = build_train_batches(spec.data, spec.training, dp_rank=0,
                                               dp_size=1).next_step()
    with torch.no_grad():
        logits = reference(inputs).logits
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()


def _check_export(export: Path, reference, tokenizer: Path) -> None:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.rope_parameters["rope_type"] == "llama3"
    trained, start = model.state_dict(), reference.state_dict()
    assert set(trained) == set(start)
    assert not torch.equal(trained["model.layers.0.mlp.up_proj.weight"],
                           start["model.layers.0.mlp.up_proj.weight"])  # 3 steps moved it
    loaded = transformers.AutoTokenizer.from_pretrained(export)
    ours = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer / "tokenizer.json"))
    assert loaded("gamma tokens falls")["input_ids"] == ours("gamma tokens falls")["input_ids"]
    assert (loaded.bos_token, loaded.eos_token) == ("<s>", "</s>")
