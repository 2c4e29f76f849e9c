"""Multiple-choice eval tasks (conf/eval_tasks.py, training/evals/): the scores equal a hand
computation with the tiny model's own forward; bad task files and `meshrun eval` words are
refused with the house error format (exit 2, nothing written); compare shows the metrics."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conf.errors import ConfigError, ProblemList
from conf.eval_tasks import MultipleChoiceDoc, read_task_file
from conf.run_dir.spec_io import write_spec
from launcher.cli import main
from conf.compose import compose_config
from conf.resolve import resolve
from tests.support.specs import CPU_HOST, cpu_spec, tiny_model_spec

DOCS = [
    {"context": "def main(", "choices": ["):", "self, x):", "]"], "gold": 1},
    {"context": "import os\nimport", "choices": ["sys", "os.path as p"], "gold": 0},
    {"context": "x = [1, 2, 3]\nfor i in", "choices": ["x:", "range(len(x)):", "y", "é"],
     "gold": 2},
    {"context": "class A:  ", "choices": ["pass", "def f(self): pass"], "gold": 1},
]


def checked_spec(*overrides: str):
    """A spec resolved as `meshrun run` resolves it: with the files read (check_paths)."""
    return resolve(compose_config(["logging=disabled", *overrides]), host=CPU_HOST,
                   check_paths=True)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def tiny_scorer(batch_size: int = 3):
    from training.evals.task_scores import Scorer
    from training.evals.text_encoder import byte_encoder
    from training.model_builder import build_model
    from training.parallel_model import ParallelModel

    spec = tiny_model_spec()
    model = build_model(spec, device=torch.device("cpu"), seed=7)
    return model, Scorer(model=ParallelModel.single(model), encode=byte_encoder,
                         device=torch.device("cpu"), autocast=contextlib.nullcontext(),
                         max_len=spec.max_seq_len, batch_size=batch_size)


def hand_scores(model, doc: dict) -> list[float]:
    """Each choice's sum of log-probabilities after the context, one forward per choice on
    exactly its bytes (lm-eval's rule: the context's trailing spaces go to the choice)."""
    context = doc["context"].rstrip()
    spaces = doc["context"][len(context):]
    sums = []
    for choice in doc["choices"]:
        ctx = list(context.encode())
        cont = list((spaces + " " + choice).encode())
        tokens = torch.tensor([ctx + cont])
        with torch.no_grad():
            logp = F.log_softmax(model(tokens[:, :-1]).float(), dim=-1)[0]
        sums.append(sum(float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont)))
    return sums


def test_scores_equal_a_hand_computation_with_the_models_forward():
    from training.evals.loglikelihood import encode_request, score_requests
    from training.evals.task_scores import score_task

    model, scorer = tiny_scorer()
    docs = [MultipleChoiceDoc(d["context"], tuple(d["choices"]), d["gold"]) for d in DOCS]
    requests = [encode_request(scorer.encode, d.context, c, max_len=scorer.max_len)
                for d in docs for c in d.continuations()]
    got = [s for s, _ in score_requests(scorer.model, requests, device=scorer.device,
                                        autocast=scorer.autocast, batch_size=3)]
    by_doc = [hand_scores(model, d) for d in DOCS]
    assert got == pytest.approx([s for h in by_doc for s in h], abs=1e-4)
    acc = [max(range(len(h)), key=h.__getitem__) == d["gold"] for d, h in zip(DOCS, by_doc)]
    norm = [max(range(len(h)), key=lambda i: h[i] / len(d["choices"][i])) == d["gold"]
            for d, h in zip(DOCS, by_doc)]
    assert 0 < sum(acc) + sum(norm) < 8  # the check can tell a right choice from a wrong one
    assert score_task(scorer, docs) == {"acc": sum(acc) / 4, "acc_norm": sum(norm) / 4, "n": 4}


def test_a_long_context_is_cut_on_the_left():
    from training.evals.loglikelihood import encode_request
    from training.evals.text_encoder import byte_encoder

    request = encode_request(byte_encoder, "a" * 20 + "bcd", " xy", max_len=6)
    assert request.inputs == list(b"abcd x") and request.targets == list(b" xy")  # 6 inputs


def test_bad_task_lines_are_named_with_their_line_numbers(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [
        DOCS[0], "{not json", {"context": "a", "choices": ["b", "c"], "gold": 2},
        {"context": "a", "choices": ["b"], "gold": 0}, {"choices": ["b", "c"], "gold": 0}])
    problems = ProblemList()
    assert len(read_task_file(path, key="k", problems=problems)) == 1
    rendered = [p.render() for p in problems.items]
    assert [r.split(": ")[0] for r in rendered] == [f"k={path}:{n}" for n in (2, 3, 4, 5)]
    assert "gold=2 is not an index into its 2 choices" in rendered[1]
    assert "lacks context" in rendered[3] and all("(fix: " in r for r in rendered)


def test_the_run_config_refuses_bad_tasks_before_anything_runs(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"context": "a", "choices": ["b", "c"],
                                                "gold": 9}])
    with pytest.raises(ConfigError) as err:
        checked_spec("model=tiny", "data=synthetic", "eval.every_steps=-1",
                     f"eval.tasks=[{{path:{bad}}},{{path:{tmp_path}/none.jsonl}}]")
    text = str(err.value)
    assert f"eval.tasks[0].path={bad}:1: gold=9" in text
    assert f"eval.tasks[1].path={tmp_path}/none.jsonl: no such file" in text
    assert "eval.every_steps=-1: must be >= 0" in text
    with pytest.raises(ConfigError, match=r"eval.tasks=...: need data.tokenizer with data=files"):
        cpu_spec("model=tiny", "data=files", f"data.train_files={bad}", f"eval.tasks=[{{path:{bad}}}]")
    with pytest.raises(ConfigError, match="Key 'colour' not in 'EvalTaskConfig'"):
        cpu_spec("model=tiny", f"eval.tasks=[{{path:{bad},colour:red}}]")
    with pytest.raises(ConfigError, match=r"eval.tasks=...: are not scored with parallel.pp>1"):
        cpu_spec("model=tiny", "parallel=pp", "parallel.pp=2", "cluster.procs_per_node=2",
                 f"eval.tasks=[{{path:{write_jsonl(tmp_path / 'ok.jsonl', DOCS)}}}]")


def test_the_eval_section_round_trips_through_spec_json(tmp_path):
    from conf.run_dir.spec_io import read_spec

    task = write_jsonl(tmp_path / "piqa.jsonl", DOCS)
    spec = checked_spec("model=tiny", "data=synthetic", "eval.every_steps=5",
                        f"eval.tasks=[{{path:{task},limit:2}},{{name:b,path:{task}}}]")
    assert [(t.name, t.limit) for t in spec.eval.tasks] == [("piqa", 2), ("b", 0)]
    write_spec(spec, tmp_path / "spec.json")
    assert read_spec(tmp_path / "spec.json") == spec


def test_meshrun_eval_refuses_bad_input_with_exit_2_and_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_spec(cpu_spec("model=tiny"), run_dir / "spec.json")
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    bad = write_jsonl(tmp_path / "bad.jsonl", [DOCS[0], "[1, 2]"])
    code = main(["eval", str(run_dir), f"tasks=hs={bad},{tmp_path}/gone.jsonl", "limit=x",
                 "colour=red"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "colour=red: is not a key of `meshrun eval`" in err
    assert "limit=x: must be a whole number" in err
    code = main(["eval", str(run_dir), f"tasks=hs={bad},{tmp_path}/gone.jsonl"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"tasks[hs]={bad}:2: is not a JSON object" in err
    assert f"tasks[gone]={tmp_path}/gone.jsonl: no such file" in err
    assert f"target={run_dir}: has no export in export/" in err
    assert (run_dir / "metrics.jsonl").read_text() == '{"kind": "train", "step": 1}\n'
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl", "spec.json"]


def test_compare_has_a_column_per_eval_metric(tmp_path):
    from sweeps.compare import collect_runs, table_columns, table_rows

    for name, acc in (("a", 0.25), ("b", 0.5)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        write_spec(cpu_spec("model=tiny"), run_dir / "spec.json")
        rows = [{"kind": "task_eval", "step": 2, "eval/mc/acc": 0.0, "eval/mc/n": 4},
                {"kind": "task_eval", "step": 4, "eval/mc/acc": acc, "eval/mc/acc_norm": 1.0,
                 "eval/mc/n": 4}]
        write_jsonl(run_dir / "metrics.jsonl", rows)
    records = collect_runs(paths=[tmp_path / "a", tmp_path / "b"])
    assert table_columns([], records)[-2:] == ["eval/mc/acc", "eval/mc/acc_norm"]
    assert [r["eval/mc/acc"] for r in table_rows(records, keys=[])] == [0.25, 0.5]
