"""GPU proof: meshrun on one GPU, measured beside its own plan, in one time-boxed command.

What it does, each step under its own subprocess timeout and all of it inside --budget-s (a step
that fails or hangs is killed, reported in the table, and the next one runs):

1. five meshrun runs of model=llama3_1b, precision=bf16, parallel=single, procs_per_node=1,
   synthetic data, seq_len 2048 x micro-batch 8 (16,384 tokens a step), 25 steps, the first 5
   left out of the means: eager and training.compile=true, each with recompute none and full;
   then eager without recompute and training.loss_chunks=8 (the head and loss in row blocks);
   then an MoE run (`moe`): qwen3_moe_30b_a3b cut to 4 layers of 32 experts (top-8, expert
   ffn 768; ~1.3 B parameters) in bf16, eager, whose experts take torch's grouped GEMM (the
   row's note says whether they did: the test GroupedExperts makes, for the run's device,
   compute dtype and widths).
   Measured, from metrics.jsonl train rows: tokens_per_s and mfu (means over the timed steps),
   mem_peak_gib (torch.cuda.max_memory_allocated, the largest over the run). Beside each, the
   plan's prediction from `meshrun plan --json` with the same overrides: tokens/s from
   step_time.step_s, its assumed MFU, and memory_bytes.peak.
2. `pytest tests/gpu -q` (after the runs, so a hung test cannot eat the measurements).
3. torchtitan: only if `import torchtitan` works in this Python. The device image has no
   torchtitan, nothing can be installed there, and the peer (../shared/peer) pins torch 2.13 with
   a CPU-only patch set, so on the device this row says "skipped" with the reason.

Output: one markdown table on stdout, and $OUT/gpu_proof.md + $OUT/gpu_proof.json (the raw
numbers, commands, return codes, timings) when $OUT (or --out) is set; also $OUT/gpu_proof_logs.txt
with the tail of every step's log.

THE DEVICE CALL (a session whose task is lent an nvidia-h200 makes exactly this one call):

    run(command="bash benchmarks/gpu_proof.sh", timeout_s=480, carry=[".whl"])

after `bash benchmarks/gpu_wheels.sh` here (puts hydra-core, omegaconf, antlr4-python3-runtime,
submitit wheels, ~0.5 MiB, in the ignored .whl/; the device image lacks them). gpu_proof.sh
installs them to /tmp/site and runs this file with --budget-s 420, so the command ends in about
7.5 minutes at worst; with the machine's start (1-2 minutes) that is about 9.5 of the 15 device
minutes, leaving room for one shorter rerun of what failed, e.g.
    run(command="bash benchmarks/gpu_proof.sh --only compile --budget-s 240", timeout_s=300,
        carry=[".whl"])
or `--only moe --budget-s 150` (timeout_s=200) for the MoE run alone.
Call give_back right after unless rerunning at once.

Dry mode on a CPU (the same flow, tiny model, fp32, 3 steps, first 1 left out; ~1-2 minutes;
the MoE run is tiny_moe in bf16, whose experts take torch's CPU grouped GEMM where it has one):
    PYTHONPATH=$PWD python benchmarks/gpu_proof.py --dry [--only moe]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
GIB = 1024 ** 3
CASES = (("eager", False, "none", ()), ("eager", False, "full", ()),
         ("compile", True, "none", ()), ("compile", True, "full", ()),
         ("eager", False, "none", ("training.loss_chunks=8",)))
"""(label, training.compile, recompute, extra overrides): the last one runs the head and loss in
8 row blocks, to set the plan's smaller peak (no whole [tokens, vocab] logits) against the
measured one."""
MOE_CASE = ("moe", False, "none")
MOE_SHAPE = {False: ("qwen3_moe_30b_a3b", ("model.n_layers=4", "model.moe.num_experts=32")),
             True: ("tiny_moe", ("training.cpu_peak_flops=1e11",))}
"""--dry -> (model, overrides) of the MoE run, always in bf16 (grouped GEMM's dtype). Dry: a
given CPU peak for MFU, since measuring the bf16 matmul peak takes minutes on a CPU without
bf16 matmul units (training/metrics.py measure_cpu_peak; cached per host afterwards)."""
RUN_CAP_S = {False: 90, True: 150}  # per run, before the budget clips it
PYTEST_CAP_S = 150
PLAN_CAP_S = 60


@dataclass
class Shape:
    model: str
    precision: str
    device: str
    seq_len: int
    micro_batch: int
    steps: int
    warmup: int

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.micro_batch


@dataclass
class Result:
    name: str
    status: str = "not run"
    wall_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    mem_peak_gib: float | None = None
    mem_reserved_peak_gib: float | None = None
    plan_tokens_per_s: float | None = None
    plan_mfu: float | None = None
    plan_peak_gib: float | None = None
    plan_reserved_gib: float | None = None
    plan_fits: bool | None = None
    run_dir: str = ""
    command: list[str] = field(default_factory=list)
    note: str = ""


class Budget:
    def __init__(self, total_s: float) -> None:
        self.end = time.monotonic() + total_s

    def clip(self, cap_s: float) -> float:
        return max(0.0, min(cap_s, self.end - time.monotonic()))


def overrides(shape: Shape, *, compile_: bool, recompute: str, runs_dir: Path,
              name: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [f"model={shape.model}", f"precision={shape.precision}", "parallel=single",
            "cluster.procs_per_node=1", f"training.device={shape.device}",
            f"recompute={recompute}", f"training.compile={str(compile_).lower()}",
            "data=synthetic", f"training.seq_len={shape.seq_len}",
            f"training.micro_batch_size={shape.micro_batch}",
            f"training.global_batch_size={shape.micro_batch}", f"training.steps={shape.steps}",
            "training.log_every=1", "training.eval_every=0", "checkpoint.every_steps=0",
            "checkpoint.export_safetensors=false", "logging=disabled", "logging.progress=false",
            f"runs_dir={runs_dir}", f"name={name}", *extra]


def run_timed(cmd: list[str], *, timeout_s: float, log: Path) -> tuple[int | None, float]:
    """Run `cmd` in its own process group, output to `log`; on timeout SIGINT then SIGKILL the
    group (the launcher's ranks die with it: they hold a parent-death signal). rc None = timeout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p), PYTHONUNBUFFERED="1")
    start = time.monotonic()
    if timeout_s < 5:
        log.write_text("skipped: no time left in the budget\n")
        return None, 0.0
    with open(log, "w") as out:
        out.write(" ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s), time.monotonic() - start
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGINT, 10), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=grace)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            return None, time.monotonic() - start


def tail(path: Path, lines: int = 25) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def add_plan(res: Result, ovr: list[str], *, budget: Budget, work: Path, shape: Shape) -> None:
    log = work / f"plan-{res.name}.log"
    rc, _ = run_timed([sys.executable, "-m", "launcher.cli", "plan", "--json", *ovr],
                      timeout_s=budget.clip(PLAN_CAP_S), log=log)
    text = log.read_text(errors="replace")
    try:
        plan = json.loads(text[text.index("\n{") + 1:]) if rc == 0 else None
    except ValueError:
        plan = None
    if plan is None:
        res.note += f"plan failed (rc {rc}); "
        return
    res.plan_peak_gib = plan["memory_bytes"]["peak"] / GIB
    if plan.get("reserved"):
        res.plan_reserved_gib = plan["reserved"]["bytes"] / GIB
    res.plan_fits = plan["verdict"]["fits"]
    if plan.get("step_time"):
        res.plan_tokens_per_s = shape.tokens_per_step / plan["step_time"]["step_s"]
        res.plan_mfu = plan["step_time"]["mfu"]  # the plan json names it mfu (was assumed_mfu)


def measure(res: Result, runs_dir: Path, shape: Shape) -> None:
    from conf.run_dir.paths import RunDir

    dirs = sorted(runs_dir.glob(f"{res.name}-*"), key=lambda p: p.stat().st_mtime)
    if not dirs:
        res.note += "no run dir; "
        return
    run_dir = RunDir(dirs[-1])
    res.run_dir = str(dirs[-1])
    rows = [r for r in run_dir.read_rows() if r.get("kind") == "train"]
    timed = [r for r in rows if r["step"] > shape.warmup]
    if not timed:
        res.note += f"{len(rows)} train rows, none after warm-up; "
        return
    res.tokens_per_s = statistics.fmean(r["tokens_per_s"] for r in timed)
    mfus = [r["mfu"] for r in timed if r.get("mfu") is not None]
    res.mfu = statistics.fmean(mfus) if mfus else None
    mems = [r["mem_peak_gib"] for r in rows if r.get("mem_peak_gib") is not None]
    res.mem_peak_gib = max(mems) if mems else None
    reserved = [r["mem_reserved_peak_gib"] for r in rows if r.get("mem_reserved_peak_gib")]
    res.mem_reserved_peak_gib = max(reserved) if reserved else None
    if len(timed) < shape.steps - shape.warmup:
        res.note += f"only {len(timed)} timed steps; "


def run_case(label: str, compile_: bool, recompute: str, extra: tuple[str, ...], *,
             shape: Shape, work: Path, budget: Budget) -> Result:
    suffix = "".join(f"-{o.split('.')[-1].replace('=', '')}" for o in extra)
    res = Result(name=f"{label}-rc_{recompute}{suffix}")
    runs_dir = work / "runs"
    ovr = overrides(shape, compile_=compile_, recompute=recompute, runs_dir=runs_dir,
                    name=res.name, extra=extra)
    add_plan(res, ovr, budget=budget, work=work, shape=shape)
    res.command = [sys.executable, "-m", "launcher.cli", "run", *ovr]
    log = work / f"run-{res.name}.log"
    rc, res.wall_s = run_timed(res.command, timeout_s=budget.clip(RUN_CAP_S[compile_]), log=log)
    res.status = "ok" if rc == 0 else ("timeout/skipped" if rc is None else f"failed rc {rc}")
    measure(res, runs_dir, shape)
    if rc != 0:
        res.note += f"log: {log.name}; "
    return res


def run_moe(*, shape: Shape, dry: bool, work: Path, budget: Budget) -> Result:
    """The MoE run (its own model, bf16), with a note on whether its experts take the
    grouped GEMM."""
    model, extra = MOE_SHAPE[dry]
    label, compile_, recompute = MOE_CASE
    res = run_case(label, compile_, recompute, extra, work=work, budget=budget,
                   shape=replace(shape, model=model, precision="bf16"))
    if res.run_dir:
        res.note = f"model={model} bf16; " + grouped_gemm_note(res.run_dir) + res.note
    return res


def grouped_gemm_note(run_dir: str) -> str:
    """'grouped GEMM on|off (...)': the choice GroupedExperts makes for the run's device,
    compute dtype and expert widths (training/models/moe/model/grouped_experts.py)."""
    import torch

    from conf.run_dir.paths import RunDir
    from training.models.moe.model.grouped_experts import use_grouped_mm
    from training.precision import TORCH_DTYPES

    spec = RunDir(run_dir).read_spec()
    dtype = TORCH_DTYPES[spec.precision.compute_dtype]
    device = torch.device(str(spec.training.device))
    weight = torch.empty(1, spec.model.expert_ffn_dim, spec.model.dim, device="meta")
    used = use_grouped_mm(torch.empty(0, device=device), weight, dtype=dtype)
    return f"grouped GEMM {'on' if used else 'off'} ({dtype}, {device.type}); "


def run_pytest(*, work: Path, budget: Budget) -> Result:
    res = Result(name="pytest tests/gpu")
    res.command = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-p", "no:cacheprovider"]
    log = work / "pytest-gpu.log"
    rc, res.wall_s = run_timed(res.command, timeout_s=budget.clip(PYTEST_CAP_S), log=log)
    last = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:]
    res.status = "ok" if rc == 0 else ("timeout/skipped" if rc is None else f"failed rc {rc}")
    res.note = (last[0] if last else "") + ("" if rc == 0 else f"; log: {log.name}")
    return res


def torchtitan_row() -> Result:
    res = Result(name="torchtitan")
    try:
        import torchtitan  # noqa: F401
    except Exception as err:  # noqa: BLE001 -- any import failure means skip
        res.status = "skipped"
        res.note = (f"not importable here ({type(err).__name__}); the device image has none and "
                    "installs nothing; the peer (../shared/peer) pins torch 2.13 + a CPU patch set")
        return res
    res.status = "skipped"
    res.note = "importable, but no GPU torchtitan config is wired in this script yet"
    return res


def fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def table(results: list[Result], shape: Shape, header: str) -> str:
    lines = [header, "",
             "| step | status | wall s | tokens/s | plan tokens/s | MFU | plan MFU (assumed) | "
             "peak mem GiB | plan peak GiB | reserved GiB | plan reserved GiB | plan fits | "
             "notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r.name} | {r.status} | {fmt(r.wall_s, '.0f')} | {fmt(r.tokens_per_s, ',.0f')} "
            f"| {fmt(r.plan_tokens_per_s, ',.0f')} | {fmt(r.mfu, '.1%')} "
            f"| {fmt(r.plan_mfu, '.0%')} "
            f"| {fmt(r.mem_peak_gib, '.3g')} | {fmt(r.plan_peak_gib, '.3g')} "
            f"| {fmt(r.mem_reserved_peak_gib, '.3g')} | {fmt(r.plan_reserved_gib, '.3g')} "
            f"| {'—' if r.plan_fits is None else r.plan_fits} | {r.note.strip('; ')} |")
    lines += ["", f"tokens/s and MFU: means over steps {shape.warmup + 1}..{shape.steps} "
              f"(steps 1..{shape.warmup} are warm-up, compilation included); peak memory: the "
              "largest mem_peak_gib of the run (CUDA: torch.cuda.max_memory_allocated; CPU: "
              "the rank's max RSS, not comparable with the plan); reserved: the largest "
              "mem_reserved_peak_gib (torch.cuda.max_memory_reserved) against the plan's "
              "reserved estimate (allocated peak x cluster.reserved_ratio). Plan: `meshrun plan --json` "
              "with the same overrides (tokens/s = tokens_per_step / step_time.step_s at its "
              "assumed MFU)."]
    return "\n".join(lines)


def header(shape: Shape, dry: bool) -> str:
    try:
        import torch
        dev = (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA")
        ver = f"torch {torch.__version__}, {dev}"
    except Exception as err:  # noqa: BLE001
        ver = f"torch not importable: {err}"
    mode = "DRY (CPU)" if dry else "GPU"
    return (f"## meshrun GPU proof — {mode}: {shape.model}, {shape.precision}, "
            f"{shape.device}, seq {shape.seq_len} x micro-batch {shape.micro_batch} "
            f"({shape.tokens_per_step:,} tokens/step), {shape.steps} steps; {ver}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry", action="store_true", help="CPU: tiny model, fp32, 3 steps")
    p.add_argument("--budget-s", type=float, default=420.0, help="the whole script's time box")
    p.add_argument("--only", choices=("eager", "compile", "moe", "pytest", "runs"), default=None,
                   help="run only these steps (a rerun of what failed)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--micro-batch", type=int, default=None)
    p.add_argument("--work", type=Path, default=Path("/tmp/meshrun-gpu-proof"))
    p.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT")
                   else None, help="where gpu_proof.md/.json go (default: $OUT)")
    return p.parse_args(argv)


def shape_from(args: argparse.Namespace) -> Shape:
    base = (Shape("tiny", "fp32", "cpu", 64, 4, 3, 1) if args.dry
            else Shape("llama3_1b", "bf16", "cuda", 2048, 8, 25, 5))
    for key in ("steps", "warmup", "seq_len", "micro_batch"):
        if getattr(args, key) is not None:
            setattr(base, key, getattr(args, key))
    return base


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    budget, shape = Budget(args.budget_s), shape_from(args)
    work = args.work / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    for label, compile_, recompute, extra in CASES:
        if args.only in (None, "runs", label):
            print(f"[gpu_proof] {label} recompute={recompute} {' '.join(extra)}...", flush=True)
            results.append(run_case(label, compile_, recompute, extra, shape=shape, work=work,
                                    budget=budget))
    if args.only in (None, "runs", "moe"):
        print("[gpu_proof] moe (grouped GEMM) ...", flush=True)
        results.append(run_moe(shape=shape, dry=args.dry, work=work, budget=budget))
    if args.only in (None, "pytest"):
        print("[gpu_proof] pytest tests/gpu ...", flush=True)
        results.append(run_pytest(work=work, budget=budget))
    if args.only is None:
        results.append(torchtitan_row())
    text = table(results, shape, header(shape, args.dry))
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_proof.md").write_text(text + "\n")
        (args.out / "gpu_proof.json").write_text(json.dumps(
            {"shape": asdict(shape), "budget_s": args.budget_s, "work": str(work),
             "results": [asdict(r) for r in results]}, indent=2) + "\n")
        logs = sorted(work.glob("*.log"))
        (args.out / "gpu_proof_logs.txt").write_text("\n\n".join(
            f"===== {p.name}\n{tail(p)}" for p in logs))
    return 0 if all(r.status in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
