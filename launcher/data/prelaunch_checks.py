"""Data checks the launcher runs just before a launch (run, resume, each sweep point), after
resolve(): the shard checksums of every prepared dir the run reads (all of them when the dirs
are small, a sample otherwise: conf/data_contract/shard_checks.py), and the stdlib corpus big
enough for the windows. Torch-free."""
from __future__ import annotations

from pathlib import Path

from conf.data_contract.prepared_corpus import read_manifest, shard_checksums
from conf.data_contract.shard_checks import damaged_shards
from conf.errors import ConfigError, Problem
from conf.spec import DataSpec


def verify_prepared_checksums(data: DataSpec) -> None:
    """ConfigError naming each damaged shard found in data.prepared / data.sources."""
    keyed = [("data.prepared", data.prepared)] if data.prepared else []
    keyed += [("data.sources", source) for source in data.sources]
    problems = []
    for key, folder in keyed:
        try:
            checksums = shard_checksums(folder, read_manifest(folder))
        except ValueError as err:
            problems.append(Problem(key, folder, str(err), "run `meshrun data prepare` again"))
            continue
        bad, _ = damaged_shards(checksums)
        problems += [Problem(key, folder, message) for message in bad]
    if problems:
        raise ConfigError(problems, "Damaged prepared data")


def stdlib_corpus_problem(err: ValueError, *, val_every_nth_file: int) -> ConfigError:
    """The stdlib corpus could not be built as asked (too few files for the split)."""
    return ConfigError([Problem("data.val_every_nth_file", val_every_nth_file, str(err),
                                "use a smaller data.val_every_nth_file (the default is 50)")])


def check_stdlib_windows(corpus, *, seq_len: int) -> None:
    """ConfigError when a split of the stdlib corpus holds less than one training window."""
    short = [(name, tokens) for name, tokens in (("train", corpus.train_tokens),
                                                 ("val", corpus.val_tokens))
             if tokens < seq_len + 1]
    if short:
        raise ConfigError([Problem("data.val_every_nth_file", Path(corpus.directory).name,
                                   f"the stdlib corpus's {name} split holds {tokens} tokens: "
                                   f"fewer than one window of training.seq_len+1={seq_len + 1}",
                                   "use a smaller data.val_every_nth_file or training.seq_len")
                           for name, tokens in short])
