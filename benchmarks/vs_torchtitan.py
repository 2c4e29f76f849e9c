"""Tokens/s of torchtitan, meshrun and a plain hand-written loop, run alternately on this CPU.

Same model shape (torchtitan's llama3 debugmodel: dim 256, 6 layers, 16 heads, 16 kv heads,
ffn 768, vocab 2048, rope theta 5e5, untied head), fp32, no recompute, causal attention, the same
corpus and tokenizer, the same global batch and sequence length; 1 process, and 2 processes with
FSDP / ZeRO-3 (torchtitan: data-parallel-shard-degree 2; meshrun: parallel=zero3). The plain loop
is single-process only, so its 1-process number is the reference for both rows (each row uses all
cores either way). Every system runs as its own fresh processes; the order rotates each round.

torchtitan runs through the peer (see its README): its folder is $MESHRUN_PEER, else
shared/peer beside this repository (--peer-src); run its setup.sh first (torch==2.13.0 +
torchtitan==0.3.0 in a venv under $PEER_DIR, else setup.sh's default; --peer-dir). Without that
venv, torchtitan is skipped with a message and the other two still run.

    python benchmarks/vs_torchtitan.py                    # debugmodel shape, 3 rounds, 20 steps
    python benchmarks/vs_torchtitan.py --quick            # seq 256, batch 4, 6 steps, 1 round
    python benchmarks/vs_torchtitan.py --nprocs 2 --meshrun-base ../main   # before/after

meshrun runs with training.loss_chunks=8 (torchtitan's debugmodel config chunks its loss in 8);
--meshrun-extra sets other overrides for this checkout's meshrun only ('' for none).

A row "1/K" in --nprocs (e.g. --nprocs 1,2,1/2) runs each system as one process pinned to
cores/K cores doing one rank's share of the K-process row (global batch / K): that rank's compute
alone, without its collectives or the other rank beside it. Against the K-process row of the same
sitting it splits a gap into per-rank compute (the model and its kernels) and what K ranks add
(collectives, waiting, sharing the machine). The plain column is the 1-process plain loop for a
process-count row and the plain loop's own 1/K run for a 1/K row.

--meshrun-base SRC adds "meshrun-base": the same meshrun run from another checkout (e.g. the
main branch), in the same rotation, so a change is measured against its parent in one sitting
(a table of meshrun / meshrun-base per round follows the main table). The base gets no
--meshrun-extra overrides; give it its own with --meshrun-base-extra.

tokens/s = global tokens per step / mean step time over steps --first-timed..--steps (the
torchtitan log's tps, the plain loop's step_time, meshrun's metrics.jsonl step_time_s), the
median over rounds. On a shared machine the numbers are noisy: compare ratios within one run.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.peer_paths import PEER_DIR_WHERE, PEER_WHERE, peer_dir, peer_source  # noqa: E402

SYSTEMS = ("torchtitan", "meshrun", "plain")
BASE_SYSTEM = "meshrun-base"
DEBUGMODEL = dict(dim=256, n_layers=6, n_heads=16, n_kv_heads=16, ffn_dim=768, vocab_size=2048,
                  rope_theta=500000.0)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TT_STEP = re.compile(r"step:\s+(\d+)\s+loss:\s+([\d.]+).*tps:\s+([\d,]+)")
PLAIN_STEP = re.compile(r"^step\s+(\d+)\s+loss\s+\S+.*step_time\s+([\d.]+)s")


@dataclass
class Bench:
    seq_len: int
    batch: int  # global
    steps: int
    first_timed: int
    peer_src: Path
    peer_dir: Path
    work: Path
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    base_src: Path | None = None
    """Another meshrun checkout, run as BASE_SYSTEM (--meshrun-base)."""
    meshrun_extra: tuple[str, ...] = ()
    """Overrides added to this checkout's meshrun runs only (--meshrun-extra), not the base's."""
    base_extra: tuple[str, ...] = ()
    """Overrides for the base's runs (--meshrun-base-extra): an older base may lack a key."""

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq_len

    @property
    def corpus(self) -> Path:
        """torchtitan's c4_test file in the peer; without the peer, one built in `work`."""
        peer = self.peer_dir / "run/tests/assets/c4_test/data.json"
        return peer if peer.exists() or self.peer_dir.exists() else self.work / "c4_like.json"

    @property
    def tokenizer(self) -> Path:
        return self.peer_src / "assets/tokenizer/tokenizer.json"


def mean_step_s(times: dict[int, float], b: Bench) -> float | None:
    timed = [t for s, t in times.items() if b.first_timed <= s <= b.steps]
    return statistics.fmean(timed) if timed else None


def tail(path: Path, lines: int = 6) -> str:
    text = ANSI.sub("", path.read_text(errors="replace")) if path.exists() else ""
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


# --- the three systems: each returns aggregate tokens/s, or None with the reason printed ------

def run_torchtitan(b: Bench, nproc: int, log: Path) -> float | None:
    if not (b.peer_dir / "venv/bin/torchrun").exists():
        print(f"  torchtitan: SKIPPED: no peer venv in {b.peer_dir}. Run "
              f"{b.peer_src / 'setup.sh'} first (it pip-installs torch==2.13.0 and "
              "torchtitan==0.3.0 there); meshrun and the plain loop still run.")
        return None
    args = ["--training.seq-len", str(b.seq_len), "--training.local-batch-size",
            str(b.batch // nproc), "--training.steps", str(b.steps)]
    if nproc > 1:
        args += ["--parallelism.data-parallel-shard-degree", str(nproc),
                 "--parallelism.spmd-backend", "partial_dtensor"]
    env = dict(os.environ, PEER_DIR=str(b.peer_dir), TT_CPU_ATTN="causal")
    subprocess.run(["bash", str(b.peer_src / "run_tt.sh"), str(nproc), str(log), *args],
                   env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    per_step = tt_step_times(log.read_text(errors="replace"), b.tokens_per_step // nproc)
    return _tokens_per_s(b, per_step, "torchtitan", log)


def tt_step_times(text: str, local_tokens: int) -> dict[int, float]:
    """Step -> seconds from a torchtitan log: its tps is per rank, so the slower rank's time."""
    per_step: dict[int, float] = {}
    for line in text.splitlines():
        m = TT_STEP.search(ANSI.sub("", line))
        if m:
            t = local_tokens / max(float(m.group(3).replace(",", "")), 1e-9)
            per_step[int(m.group(1))] = max(per_step.get(int(m.group(1)), 0.0), t)
    return per_step


def plain_step_times(text: str) -> dict[int, float]:
    """Step -> seconds from plain_loop.py's `step N ... step_time X.XXXs` lines."""
    return {int(m.group(1)): float(m.group(2)) for line in text.splitlines()
            if (m := PLAIN_STEP.match(line))}


def run_plain(b: Bench, nproc: int, log: Path) -> float | None:
    cmd = [sys.executable, str(b.peer_src / "plain_loop.py"), "--seq-len", str(b.seq_len),
           "--batch", str(b.batch), "--steps", str(b.steps), "--first-timed", str(b.first_timed),
           "--threads", str(b.cores), "--attn", "causal", "--data", str(b.corpus),
           "--tokenizer", str(b.tokenizer)]
    with open(log, "w") as out:
        subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False,
                       env=dict(os.environ, OMP_NUM_THREADS=str(b.cores)))
    per_step = plain_step_times(log.read_text(errors="replace"))
    return _tokens_per_s(b, per_step, "plain", log)


def meshrun_overrides(b: Bench, nproc: int, tokens: Path, runs_dir: Path, name: str) -> list[str]:
    model = [f"model.{k}={v}" for k, v in DEBUGMODEL.items()]
    return ["model=debug", "model.name=tt_debugmodel", *model, f"model.max_seq_len={b.seq_len}",
            "precision=fp32", "recompute=none",
            "parallel=single" if nproc == 1 else "parallel=zero3",
            f"cluster.procs_per_node={nproc}", "data=files", f"data.train_files={tokens}",
            f"data.val_files={tokens}", f"training.seq_len={b.seq_len}",
            f"training.micro_batch_size={b.batch // nproc}",
            f"training.global_batch_size={b.batch}",
            f"training.steps={b.steps}", "schedule.warmup_steps=2",  # as torchtitan
            "training.eval_every=0", "training.eval_batches=1",
            "checkpoint.every_steps=0", "checkpoint.export_safetensors=false",
            "logging=disabled", "logging.progress=false", f"runs_dir={runs_dir}", f"name={name}"]


def run_meshrun(b: Bench, nproc: int, log: Path, tokens: Path, src: Path = REPO,
                extra: tuple[str, ...] = ()) -> float | None:
    from conf.run_dir.paths import RunDir

    runs_dir = b.work / "meshrun-runs"
    name = log.stem
    cmd = [sys.executable, "-m", "launcher.cli", "run",
           *meshrun_overrides(b, nproc, tokens, runs_dir, name), *extra]
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS=str(max(1, b.cores // nproc)))
    with open(log, "w") as out:
        out.write(f"(from {src}) " + " ".join(cmd) + "\n")
        out.flush()
        subprocess.run(cmd, cwd=src, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    dirs = sorted(runs_dir.glob(f"{name}-*"), key=lambda p: p.stat().st_mtime)
    run_dir = RunDir(dirs[-1]) if dirs else None
    rows = run_dir.read_rows() if run_dir else []
    per_step = {r["step"]: r["step_time_s"] for r in rows if r.get("kind") == "train"}
    if not per_step and run_dir:
        print(tail(run_dir.torchrun_log))
    return _tokens_per_s(b, per_step, "meshrun", log)


def _tokens_per_s(b: Bench, per_step: dict[int, float], system: str, log: Path) -> float | None:
    mean = mean_step_s(per_step, b)
    if mean is None:
        print(f"  {system}: FAILED or no steps {b.first_timed}..{b.steps} in {log}:\n{tail(log)}")
        return None
    return b.tokens_per_step / mean


# --- data: the peer's corpus, tokenized once for meshrun (data=files, a .npy of token ids) -----

def prepare_data(b: Bench) -> Path:
    if not b.corpus.exists():
        print(f"corpus {b.corpus} missing: building it with {b.peer_src / 'make_c4_like.py'}")
        subprocess.run([sys.executable, str(b.peer_src / "make_c4_like.py"), str(b.corpus)],
                       check=True)
    out = b.work / f"c4_like_tokens_{b.steps * b.tokens_per_step}.npy"
    if out.exists():
        return out
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(b.tokenizer))
    eos = tok.token_to_id("<|end_of_text|>") or tok.token_to_id("</s>") or 0
    need = 4 * (b.steps + 2) * b.batch * (b.seq_len + 1)  # meshrun samples windows; leave room
    ids: list[int] = []
    with open(b.corpus) as fh:
        for line in fh:
            ids += tok.encode(json.loads(line)["text"]).ids + [eos]
            if len(ids) >= need:
                break
    np.save(out, np.asarray(ids, dtype=np.uint16))
    return out


# --- rounds and the table ------------------------------------------------------------------------

def children_minor_faults() -> int:
    """Minor page faults of every finished child process so far (with their own children).
    On CPU, a tensor above glibc's 32 MiB mmap ceiling (full-vocabulary logits, their
    log-softmax and gradients) is fresh, faulted-in memory every step; a chunked loss is not:
    the count shows that cost, which tokens/s alone hides."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt


def parse_row(text: str) -> int | str:
    """'2' -> 2; '1/2' -> '1/2' (checked: K > 1)."""
    if text.startswith("1/"):
        if not text[2:].isdigit() or int(text[2:]) < 2:
            raise ValueError(f"row {text!r}: 1/K needs a whole K >= 2")
        return text
    return int(text)


def share_of(row: int | str) -> int:
    """K for a "1/K" row, 1 for a process count."""
    return int(row[2:]) if isinstance(row, str) else 1


def batch_parts(row: int | str) -> int:
    """Into how many parts a row splits the global batch: its processes, or K for 1/K."""
    return share_of(row) if isinstance(row, str) else row


def row_bench(b: Bench, row: int | str) -> tuple[Bench, int]:
    """The Bench and process count a row runs with: a 1/K row is one process with 1/K of the
    global batch and of the cores."""
    k = share_of(row)
    if k == 1:
        return b, row
    return dataclasses.replace(b, batch=b.batch // batch_parts(row),
                               cores=max(1, b.cores // k)), 1


@contextlib.contextmanager
def pinned_to(cores: int):
    """Children started inside run on the first `cores` CPUs of this process's set (they
    inherit the affinity: run_tt.sh's `nproc` and torch's thread count follow it)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(before)[:cores])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def run_one(b: Bench, system: str, nproc: int, log: Path, tokens: Path) -> float | None:
    if system == "torchtitan":
        return run_torchtitan(b, nproc, log)
    if system == "meshrun":
        return run_meshrun(b, nproc, log, tokens, extra=b.meshrun_extra)
    if system == BASE_SYSTEM:
        return run_meshrun(b, nproc, log, tokens, src=b.base_src, extra=b.base_extra)
    return run_plain(b, nproc, log)


def run_all(b: Bench, rounds: int, rows: list, systems: tuple[str, ...]) -> dict:
    tokens = prepare_data(b)
    results = {(s, row): [] for s in systems for row in rows}
    for r in range(rounds):
        for row in rows:
            rb, nproc = row_bench(b, row)
            order = systems[r % len(systems):] + systems[:r % len(systems)]
            for system in order:
                if system == "plain" and nproc != 1:
                    continue  # single-process only; its 1-process number is the reference
                log = b.work / f"{system}-r{r}-n{str(row).replace('/', 'of')}.log"
                start, faults = time.perf_counter(), children_minor_faults()
                with pinned_to(rb.cores):
                    tps = run_one(rb, system, nproc, log, tokens)
                shown = f"{tps:,.0f} tok/s" if tps else "-"
                faults = children_minor_faults() - faults
                print(f"round {r + 1}/{rounds} nproc={row} {system:10s} {shown:>14s}  "
                      f"({time.perf_counter() - start:.0f}s wall, {faults / 1e6:.2f}M minor page "
                      f"faults, log {log})", flush=True)
                results[(system, row)].append(tps)  # None too: rounds stay aligned
    return results


def table(results: dict, nprocs: list) -> str:
    def med(system: str, nproc: int) -> float | None:
        values = [v for v in results.get((system, nproc)) or [] if v]
        return statistics.median(values) if values else None

    def fmt(x, spec=",.0f"):
        return "-" if x is None else format(x, spec)

    lines = [f"{'procs':>5} {'torchtitan':>11} {'meshrun':>9} {'plain':>10} "
             f"{'meshrun/torchtitan':>19} {'meshrun/plain':>14}   rounds (tt/mr/plain)"]
    for nproc in nprocs:
        tt, mr = med("torchtitan", nproc), med("meshrun", nproc)
        plain_row = nproc if share_of(nproc) > 1 else 1  # a 1/K row has its own plain run
        plain = med("plain", plain_row)
        counts = "/".join(str(len([v for v in results.get((s, n), []) if v])) for s, n in
                          (("torchtitan", nproc), ("meshrun", nproc), ("plain", plain_row)))
        lines.append(f"{nproc:>5} {fmt(tt):>11} {fmt(mr):>9} {fmt(plain):>10} "
                     f"{fmt(mr / tt if mr and tt else None, '.3f'):>19} "
                     f"{fmt(mr / plain if mr and plain else None, '.3f'):>14}   {counts}")
    return "\n".join(lines)


def share_table(results: dict, nprocs: list) -> str:
    """For each 1/K row whose K-process row also ran: per system, the K-process tokens/s over
    K times the one-rank-alone tokens/s, per round, then the median: below 1 by what K ranks
    add to a rank's own compute (collectives, waiting, sharing the machine)."""
    lines = []
    for row in nprocs:
        k = share_of(row)
        if k == 1 or k not in nprocs:
            continue
        for system in ("torchtitan", "meshrun", BASE_SYSTEM):
            pairs = zip(results.get((system, k), []), results.get((system, row), []))
            ratios = [together / (k * alone) for together, alone in pairs if together and alone]
            if ratios:
                cells = " ".join(f"{x:.3f}" for x in ratios)
                lines.append(f"{system:>12}: {k} processes / ({k} x {row} alone) = "
                             f"{statistics.median(ratios):.3f} (rounds: {cells})")
    return "\n".join(lines)


def base_table(results: dict, nprocs: list) -> str:
    """meshrun against BASE_SYSTEM (and each against torchtitan) round by round, then the
    median of the per-round ratios: pairs from one round saw about the same load."""
    lines = [f"{'procs':>5} {'round':>5} {'meshrun':>9} {'base':>9} {'torchtitan':>11} "
             f"{'meshrun/base':>13} {'meshrun/tt':>11} {'base/tt':>8}"]
    for nproc in nprocs:
        rows = zip(*(results.get((s, nproc), []) for s in ("meshrun", BASE_SYSTEM, "torchtitan")))
        ratios: list[list[float]] = [[], [], []]
        for r, (mr, base, tt) in enumerate(rows):
            pairs = ((mr, base), (mr, tt), (base, tt))
            cells = [f"{x / y:.3f}" if x and y else "-" for x, y in pairs]
            for kept, (x, y) in zip(ratios, pairs):
                if x and y:
                    kept.append(x / y)
            lines.append(f"{nproc:>5} {r + 1:>5} {mr or 0:>9,.0f} {base or 0:>9,.0f} "
                         f"{tt or 0:>11,.0f} {cells[0]:>13} {cells[1]:>11} {cells[2]:>8}")
        meds = [f"{statistics.median(v):.3f}" if v else "-" for v in ratios]
        lines.append(f"{nproc:>5} {'med':>5} {'':>9} {'':>9} {'':>11} {meds[0]:>13} "
                     f"{meds[1]:>11} {meds[2]:>8}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nprocs", default="1,2",
                   help="comma-separated process counts, and 1/K rows (one rank's share of K, "
                        "alone on cores/K cores)")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8, help="global batch (sequences per step)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--first-timed", type=int, default=5)
    p.add_argument("--quick", action="store_true",
                   help="seq 256, batch 4, 6 steps timed from 3, 1 round: proves it runs")
    p.add_argument("--peer-src", type=Path, default=peer_source(),
                   help=f"the peer's folder (default: {PEER_WHERE})")
    p.add_argument("--peer-dir", type=Path, default=None,
                   help=f"where the peer's setup.sh put its venv (default: {PEER_DIR_WHERE})")
    p.add_argument("--work", type=Path, default=Path("/tmp/meshrun-vs-torchtitan"))
    p.add_argument("--meshrun-base", type=Path, default=None,
                   help="another meshrun checkout to run beside this one (before/after)")
    p.add_argument("--meshrun-base-extra", default="",
                   help="comma-separated overrides for the --meshrun-base runs (default none: "
                        "an older base may not know this checkout's keys)")
    p.add_argument("--meshrun-extra", default="training.loss_chunks=8",
                   help="comma-separated overrides for this checkout's meshrun only (default: "
                        "the loss in 8 chunks, as torchtitan's debugmodel config; '' for none)")
    a = p.parse_args()
    a.peer_dir = a.peer_dir or peer_dir(a.peer_src)
    if a.quick:
        a.seq_len, a.batch, a.steps, a.first_timed, a.rounds = 256, 4, 6, 3, 1
    try:
        nprocs = [parse_row(n) for n in a.nprocs.split(",")]
    except ValueError as e:
        sys.exit(f"bad arguments: --nprocs {a.nprocs}: {e}")
    systems = tuple(s for s in a.systems.split(",") if s)
    bad = [n for n in nprocs if a.batch % batch_parts(n)] + [s for s in systems if s not in SYSTEMS]
    if a.meshrun_base is not None:
        if not (a.meshrun_base / "training").is_dir():
            bad.append(f"--meshrun-base {a.meshrun_base}: not a meshrun checkout")
        systems += (BASE_SYSTEM,)
    if bad or a.first_timed > a.steps:
        sys.exit(f"bad arguments: {bad or 'first-timed > steps'} (batch must divide by nprocs; "
                 f"systems from {SYSTEMS})")
    a.work.mkdir(parents=True, exist_ok=True)
    b = Bench(seq_len=a.seq_len, batch=a.batch, steps=a.steps, first_timed=a.first_timed,
              peer_src=a.peer_src, peer_dir=a.peer_dir, work=a.work, base_src=a.meshrun_base,
              meshrun_extra=tuple(o for o in a.meshrun_extra.split(",") if o),
              base_extra=tuple(o for o in a.meshrun_base_extra.split(",") if o))
    shape = " ".join(f"{k}={v}" for k, v in DEBUGMODEL.items())
    print(f"shape: llama3 debugmodel ({shape}) seq={b.seq_len} global_batch={b.batch} fp32 "
          f"causal no-recompute; {b.tokens_per_step} tokens/step; steps {b.first_timed}..{b.steps} "
          f"timed; {a.rounds} round(s); {b.cores} cores split over the processes; work {b.work}")
    results = run_all(b, a.rounds, nprocs, systems)
    print("\nmedian aggregate tokens/s (noisy on a shared machine; ratios are within this run)")
    print(table(results, nprocs))
    shares = share_table(results, nprocs)
    if shares:
        print("\nwhat the other ranks cost a rank (median of per-round ratios)")
        print(shares)
    if a.meshrun_base is not None:
        print(f"\nmeshrun against meshrun-base ({a.meshrun_base}), per round")
        print(base_table(results, nprocs))


if __name__ == "__main__":
    main()
