"""`meshrun data ...` keeps the promise on hostile input: a folder of the user's own files is never
written into, a zero result is an error that says which filter dropped what, numbers out of
range name their flag, and a chat template is bounded in time and output (exit 2 each, nothing
written). The commands run in-process through `launcher.cli.main`, as a person types them."""
from __future__ import annotations

import json

import pytest

from launcher.cli import main as meshrun
from tests.support.text_corpora import TWO_TURNS, trained_tokenizer, write_corpus


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("refusals")
    tok = trained_tokenizer(root)
    chats = root / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": TWO_TURNS}) + "\n" for _ in range(6)))
    return {"root": root, "corpus": write_corpus(root), "tok": tok, "chats": chats}


def _refused(capsys, *argv) -> str:
    assert meshrun(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("meshrun data: ")
    return err


def _commands(made, out):
    return {"prepare": ["data", "prepare", "--tokenizer", str(made["tok"]), "--out", str(out),
                        "--workers", "1", "--text-field", "body", str(made["corpus"])],
            "prepare-sft": ["data", "prepare-sft", "--tokenizer", str(made["tok"]), "--out",
                            str(out), "--seq-len", "128", str(made["chats"])],
            "train-tokenizer": ["data", "train-tokenizer", "--vocab-size", "300", "--out",
                                str(out), str(made["corpus"])]}


@pytest.mark.parametrize("command", ["prepare", "prepare-sft", "train-tokenizer"])
def test_out_dir_of_the_users_files_is_refused_and_own_output_is_reused(made, tmp_path, capsys,
                                                                        command):
    users = tmp_path / "mine"
    users.mkdir()
    (users / "manifest.json").write_text("my notes")  # a name meshrun also writes
    (users / "keep.txt").write_text("precious")
    err = _refused(capsys, *_commands(made, users)[command])
    assert "did not make" in err and "keep.txt" in err
    assert sorted(p.name for p in users.iterdir()) == ["keep.txt", "manifest.json"]
    assert (users / "manifest.json").read_text() == "my notes"
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert "is a file" in _refused(capsys, *_commands(made, a_file)[command])
    assert "does not exist" in _refused(capsys, *_commands(made, tmp_path / "no" / "out")[command])
    assert a_file.read_text() == "x" and not (tmp_path / "no").exists()
    own = tmp_path / "own"
    assert meshrun(_commands(made, own)[command]) == 0
    assert meshrun(_commands(made, own)[command]) == 0  # its own earlier output: fine
    if command != "train-tokenizer":
        assert "nothing to do" in capsys.readouterr().out
    other = "prepare-sft" if command == "prepare" else "prepare"
    assert "meshrun data" in _refused(capsys, *_commands(made, own)[other])  # another command's
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".meshrun-")] == []


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ASSISTANT_MISSPELT = [{"role": "user", "content": "hi"}, {"role": "asistant", "content": "yo"}]


@pytest.mark.parametrize("case", ["empty text", "only empty JSONL fields", "binary", "latin-1"])
def test_prepare_of_no_usable_text_is_refused(made, tmp_path, capsys, case):
    corpus = tmp_path / "in"
    corpus.mkdir()
    if case == "empty text":
        (corpus / "a.txt").write_text("")
    elif case == "only empty JSONL fields":
        _jsonl(corpus / "a.jsonl", [{"text": ""}, {"text": ""}])
    elif case == "binary":
        (corpus / "a.txt").write_text("fine text")
        (corpus / "b.bin").write_bytes(bytes(range(256)) * 4)
    else:
        (corpus / "a.txt").write_bytes("café".encode("latin-1"))
    err = _refused(capsys, "data", "prepare", "--tokenizer", str(made["tok"]), "--out",
                   str(tmp_path / "out"), str(corpus))
    assert {"empty text": "no documents", "only empty JSONL fields": "no documents",
            "binary": "binary file", "latin-1": "not UTF-8"}[case] in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case,rows,expected", [
    ("no assistant", [{"messages": [{"role": "user", "content": "hi"}]}] * 3,
     "3 dropped with no assistant token"),
    ("misspelt role", [{"messages": ASSISTANT_MISSPELT}] * 3, "'asistant' (3)"),
    ("all too long", [{"messages": TWO_TURNS}] * 3, "3 dropped longer than a bin"),
    ("no lines", [], "no conversations"),
])
def test_prepare_sft_with_no_usable_conversation_says_which_filter(made, tmp_path, capsys, case,
                                                                   rows, expected):
    chats = _jsonl(tmp_path / "c.jsonl", rows)
    seq_len = "8" if case == "all too long" else "256"
    err = _refused(capsys, "data", "prepare-sft", "--tokenizer", str(made["tok"]), "--out",
                   str(tmp_path / "out"), "--seq-len", seq_len, str(chats))
    assert expected in err
    assert not (tmp_path / "out").exists()


def test_train_tokenizer_on_nothing_to_learn_is_refused(made, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "tiny.txt").write_text("ab")
    out = str(tmp_path / "tok")
    assert "no text to learn" in _refused(capsys, "data", "train-tokenizer", "--vocab-size",
                                          "300", "--out", out, str(tmp_path / "empty.txt"))
    assert "learned no tokens" in _refused(capsys, "data", "train-tokenizer", "--vocab-size",
                                           "300", "--out", out, str(tmp_path / "tiny.txt"))
    assert not (tmp_path / "tok").exists()


@pytest.mark.parametrize("command,flag,value", [
    ("train-tokenizer", "--vocab-size", "-1"), ("train-tokenizer", "--vocab-size", "0"),
    ("train-tokenizer", "--vocab-size", str(2**30)),  # the tokenizers library aborts here
    ("train-tokenizer", "--vocab-size", str(2**64)), ("train-tokenizer", "--min-frequency", "-1"),
    ("prepare", "--workers", "-1"), ("prepare", "--workers", "100000"),
    ("prepare", "--shard-tokens", "0"), ("prepare", "--val-fraction", "nan"),
    ("prepare", "--val-fraction", "1"), ("prepare-sft", "--seq-len", "0"),
    ("prepare-sft", "--seq-len", str(2**40)), ("prepare-sft", "--shard-tokens", "-3"),
])
def test_numbers_out_of_range_name_their_flag(made, tmp_path, capsys, command, flag, value):
    argv = _commands(made, tmp_path / "out")[command]
    at = argv.index(flag) if flag in argv else len(argv) - 1
    argv = argv[:at] + [flag, value] + argv[at + (2 if flag in argv else 0):]
    assert f"{flag}={value}" in _refused(capsys, *argv)
    assert not (tmp_path / "out").exists()


def _template_dir(made, tmp_path, config) -> str:
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((made["tok"] / "tokenizer.json").read_bytes())
    text = config if isinstance(config, str) else json.dumps({"eos_token": "</s>", **config})
    (folder / "tokenizer_config.json").write_text(text)
    return str(folder)


LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.mark.parametrize("config,expected", [
    ("{not json", "not readable JSON"),
    ({"chat_template": 7}, "is not a template"),
    ({"chat_template": [{"name": "tool_use", "template": "{{ 1 }}"}]}, "none named"),
    ({"chat_template": LOOP}, "took over 1 s"),
    ({"chat_template": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"},
     "rendered over"),
    ({"chat_template": "{{ 'x' * 10**10 }}"}, "out of memory"),
    ({"chat_template": "{{ ''.__class__.__mro__[1].__subclasses__() }}"}, "failed"),
])
def test_chat_templates_are_checked_and_bounded(made, tmp_path, capsys, monkeypatch, config,
                                                expected):
    monkeypatch.setattr("launcher.data.template_render.RENDER_TIMEOUT_S", 1.0)
    err = _refused(capsys, "data", "prepare-sft", "--tokenizer",
                   _template_dir(made, tmp_path, config), "--out", str(tmp_path / "out"),
                   "--seq-len", "256", str(made["chats"]))
    assert expected in err
    assert not (tmp_path / "out").exists()


def test_named_templates_take_default_as_transformers_does(made, tmp_path, capsys):
    default = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>"
               "{% endfor %}")
    tok = _template_dir(made, tmp_path, {"chat_template": [
        {"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
        {"name": "default", "template": default}]})
    assert meshrun(["data", "prepare-sft", "--tokenizer", tok, "--out", str(tmp_path / "out"),
                    "--seq-len", "256", str(made["chats"])]) == 0
    assert "tokenizer_config.json" in capsys.readouterr().out
