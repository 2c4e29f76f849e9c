"""`meshrun plan --search`: every layout resolve() accepts for a model on a cluster, ranked by
predicted tokens/s per device (parallel.cost.search), as a table, as JSON, or written as a
sweep file that `meshrun sweep -f FILE` runs to measure them (first point = predicted best).

The model, cluster, seq_len and precision come from the usual overrides (model=llama3_70b
cluster=slurm cluster.nodes=128 cluster.gpus_per_node=8 cluster.gpu_name=H100
training.seq_len=8192); the global batch is `--global-batch-tokens` (else
training.global_batch_size x seq_len). The layout keys of the overrides are what is searched.

`--json` prints one object (schema "meshrun.plan_search/1"; sizes in bytes, times seconds):
- schema, model, world_size, nodes, gpus_per_node, gpu, seq_len, global_batch_tokens,
  global_batch_size (sequences)
- counts: {enumerated (layouts the rules accept), fits, does_not_fit, rejected_by_rule
  ({rule key: combinations it dropped})}
- dropped: the line on the layouts that do not fit; smallest_misfit_bytes, usable_bytes
- time_basis: what ranks them (the time model, or the labelled fallback)
- top: [{rank (1 = best), overrides (a sweep point), layout {dp_replicate, dp_shard, tp, pp,
  cp, zero, sequence_parallel, loss_parallel, pp_schedule, pp_virtual_stages, pp_microbatches,
  micro_batch_size, grad_accum_steps, recompute}, knobs (overrides beyond the layout that
  launcher.plan.knob_refine turned on: training.compile=true, precision=fp8), memory_bytes
  (peak of the fullest rank),
  fits, margin_bytes, step_s, tokens_per_s_per_device, mfu, why}], as `meshrun plan` plans
  each point
- rank_of: null, or with --rank-of OVERRIDES {overrides, rank (null: it does not fit), of
  (fitting layouts), memory_bytes, fits, tokens_per_s_per_device, why}
"""
from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from conf.compose import compose_config
from conf.hf_model_config import explicit_model_keys
from conf.errors import ConfigError, Problem
from conf.resolve import resolve
from conf.schema import OpsMatmuls, RecomputeConfig, RecomputeMode, RunConfig
from conf.search_path import option_sources
from conf.degrees import DEGREES
from launcher.hardware import probe_host
from launcher.views.plan_view import gib
from launcher.output_file import check_output_file, write_file_atomically
from launcher.plan.knob_refine import refine
from launcher.plan.rank_of import rank_of, rank_overrides, target_spec
from parallel.cost.plan import make_plan
from parallel.cost.search import Ranked, SearchResult, search
from parallel.cost.step_time import estimate_time
from parallel.cost.search_space import Candidate

SCHEMA = "meshrun.plan_search/1"
SWEEP_FILE_HEADER = "# Written by `meshrun plan --search`"
"""The first line of a written sweep file: --write-sweep replaces only a file starting so."""
SEARCHED_KEYS = ("parallel.", "recompute", "training.micro_batch_size",
                 "training.grad_accum_steps", "training.global_batch_size")
"""Override keys the search chooses (left out of the sweep's base)."""


def plan_search(overrides: list[str], *, console: Console, top: int = 10,
                global_batch_tokens: int | None = None, write_sweep: Path | None = None,
                as_json: bool = False, rank_of_text: str | None = None) -> int:
    """Search, then print the top layouts (and write them as a sweep file); `rank_of_text`:
    overrides of one layout whose rank and reasons to print too (launcher.plan.rank_of)."""
    if top < 1:
        raise _bad("--top", top, "must be at least 1", "e.g. --top 10")
    if write_sweep is not None:
        check_output_file("--write-sweep", write_sweep, keep_unless=SWEEP_FILE_HEADER)
    cfg = compose_config(overrides)
    global_batch_size = batch_sequences(cfg, global_batch_tokens)
    base = resolve(neutral_layout(cfg), host=probe_host(), check_paths=False,
                   explicit=explicit_model_keys(overrides))
    host = base.host
    target = None
    if rank_of_text is not None:
        extra = rank_overrides(rank_of_text)
        target = target_spec(overrides, extra, host=host, global_batch_size=global_batch_size)
    policies = recompute_policies()
    result = search(cfg, base, global_batch_size=global_batch_size, policies=policies,
                    top=top, also_above=_target_speed(target))
    result = refine(result, overrides, base, neutral=neutral_layout, policies=policies,
                    top=top)
    ranked = None if target is None else rank_of(target, extra, result)
    if write_sweep is not None:
        write_sweep_file(write_sweep, result, overrides, global_batch_size)
    if as_json:
        out = search_json(result, base, global_batch_size)
        out["rank_of"] = None if ranked is None else ranked.as_json()
        print(json.dumps(out, indent=2))
    else:
        print_search(result, console, global_batch_size=global_batch_size)
        if ranked is not None:
            console.print(ranked.line, markup=False, highlight=False)
        if write_sweep is not None:
            console.print(f"sweep file: {write_sweep}  (run: meshrun sweep -f {write_sweep})",
                          soft_wrap=True, markup=False, highlight=False)  # paths stay whole
    return 0


def _target_speed(spec) -> float | None:
    """The tokens/s per device of the layout to rank (the search predicts every layout that
    could beat it, so its rank is exact); None without one or without a time model."""
    if spec is None:
        return None
    plan = make_plan(spec)
    estimate = estimate_time(spec, plan)
    return None if estimate is None else estimate.tokens_per_s_per_device


def _bad(key: str, value: object, rule: str, fix: str) -> ConfigError:
    return ConfigError([Problem(key, value, rule, fix)], "Invalid plan search")


def batch_sequences(cfg: RunConfig, tokens: int | None) -> int:
    """The global batch in sequences: --global-batch-tokens / seq_len, else
    training.global_batch_size."""
    seq = cfg.training.seq_len
    if tokens is None:
        if cfg.training.global_batch_size > 0:
            return cfg.training.global_batch_size
        raise _bad("--global-batch-tokens", "(not given)", "the search needs the global batch",
                   "pass --global-batch-tokens N (e.g. 4194304), or training.global_batch_size")
    if seq <= 0 or tokens <= 0 or tokens % seq:
        raise _bad("--global-batch-tokens", tokens,
                   f"must be a positive multiple of training.seq_len={seq}",
                   f"use --global-batch-tokens={seq * max(1, tokens // max(seq, 1))}")
    return tokens // seq


def neutral_layout(cfg: RunConfig) -> RunConfig:
    """`cfg` with a layout every world size accepts (FSDP over all ranks, one sequence per
    micro-batch): the base whose other sections the candidates share."""
    parallel = replace(cfg.parallel, dp_replicate=1, dp_shard=-1, tp=1, pp=1, cp=1, zero=3,
                       pp_schedule="1f1b", pp_microbatches=-1, pp_virtual_stages=1,
                       pp_layer_split=[])
    training = replace(cfg.training, micro_batch_size=1, grad_accum_steps=-1,
                       global_batch_size=-1)
    return replace(cfg, parallel=parallel, training=training)


def recompute_policies() -> dict[str, RecomputeConfig]:
    """The recompute group's options, read as the plain YAML they are (no defaults lists)."""
    known = {f.name for f in fields(RecomputeConfig)}
    policies = {}
    for name, path in option_sources("recompute").items():
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict) or set(data) - known:
            continue  # not a plain recompute section: not searched
        if "mode" in data:
            data["mode"] = RecomputeMode(data["mode"])
        if "ops_matmuls" in data:
            data["ops_matmuls"] = OpsMatmuls(data["ops_matmuls"])
        policies[name] = RecomputeConfig(**data)
    return policies


def point_overrides(c: Candidate) -> list[str]:
    """The overrides that select candidate `c` (one sweep point)."""
    p = c.parallel
    lines = [f"parallel.{name}={getattr(p, name)}" for name in DEGREES]
    lines += [f"parallel.zero={p.zero}", f"parallel.ep={p.ep}",
              f"parallel.sequence_parallel={str(p.sequence_parallel).lower()}",
              f"parallel.loss_parallel={str(p.loss_parallel).lower()}",
              f"parallel.pp_schedule={p.pp_schedule}",
              f"parallel.pp_virtual_stages={p.pp_virtual_stages}",
              f"parallel.pp_microbatches={p.pp_microbatches}", "parallel.pp_layer_split=[]",
              f"recompute={c.recompute_name}",
              f"training.micro_batch_size={c.micro_batch_size}",
              f"training.grad_accum_steps={c.grad_accum_steps}"]
    if c.loss_chunks:
        lines.append(f"training.loss_chunks={c.loss_chunks}")
    return lines


def write_sweep_file(path: Path, result: SearchResult, overrides: list[str],
                     global_batch_size: int) -> None:
    """The top layouts as a sweep file (combine: list), best first."""
    if not result.top:
        raise _bad("--write-sweep", str(path), "no layout fits, so there is nothing to sweep",
                   "raise the node count, or lower training.seq_len")
    base = [o for o in overrides if not o.lstrip("+~").startswith(SEARCHED_KEYS)
            or o.startswith("parallel=")]
    sweep = {"name": path.stem, "base": [*base, f"training.global_batch_size={global_batch_size}"],
             "combine": "list", "points": [[*point_overrides(r.candidate), *r.extra]
                                             for r in result.top],
             "run_name": "{sweep}-{index}"}
    header = f"{SWEEP_FILE_HEADER}: the top layouts, best predicted tokens/s per device first.\n"
    write_file_atomically(path, header + yaml.safe_dump(sweep, sort_keys=False, width=1000))


def search_json(result: SearchResult, base, global_batch_size: int) -> dict:
    return {
        "schema": SCHEMA, "model": base.model.name, "world_size": base.world_size,
        "nodes": base.cluster.nodes, "gpus_per_node": base.host.gpu_count,
        "gpu": base.host.gpu_name, "seq_len": base.training.seq_len,
        "global_batch_tokens": global_batch_size * base.training.seq_len,
        "global_batch_size": global_batch_size,
        "counts": {"enumerated": result.enumerated, "fits": result.fits,
                   "does_not_fit": result.does_not_fit,
                   "rejected_by_rule": dict(result.rejected.most_common())},
        "dropped": result.dropped_line, "smallest_misfit_bytes": result.smallest_misfit_bytes,
        "usable_bytes": result.usable_bytes, "time_basis": result.basis,
        "top": [_entry_json(i + 1, r) for i, r in enumerate(result.top)],
    }


def _entry_json(rank: int, r: Ranked) -> dict:
    p, c, v = r.candidate.parallel, r.candidate, r.plan.verdict
    layout = {name: getattr(p, name) for name in (*DEGREES, "zero", "sequence_parallel",
                                                  "loss_parallel",
                                                  "pp_schedule", "pp_virtual_stages",
                                                  "pp_microbatches")}
    layout.update(micro_batch_size=c.micro_batch_size, grad_accum_steps=c.grad_accum_steps,
                  recompute=c.recompute_name)
    return {"rank": rank, "overrides": [*point_overrides(c), *r.extra], "layout": layout,
            "knobs": list(r.extra),
            "memory_bytes": r.plan.memory.total, "fits": v.fits, "margin_bytes": v.margin_bytes,
            "step_s": r.prediction.step_s,
            "tokens_per_s_per_device": r.prediction.tokens_per_s_per_device,
            "mfu": r.prediction.mfu, "why": r.why}


SCHEDULE_ABBREVIATIONS = {"interleaved_1f1b": "i1f1b", "looped_bfs": "bfs",
                          "interleaved_zero_bubble": "izb"}
"""Pipeline schedules as the table names them (the legend under it spells them out)."""
KNOB_WORDS = {"training.compile=true": "+compile", "precision=fp8": "+fp8"}
"""The knobs launcher.plan.knob_refine turned on, as the table names them."""
LEGEND = ("layout: dp R x S = dp_replicate x dp_shard; z = zero; pipeline schedule (i1f1b = "
          "interleaved_1f1b, bfs = looped_bfs, izb = interleaved_zero_bubble) v = virtual "
          "stages, m = pipeline micro-batches; mb = micro-batch x accumulation; lc = loss "
          "chunks (training.loss_chunks); then the "
          "recompute option; +compile, +fp8: knobs turned on. Full overrides: --json or "
          "--write-sweep.")


def layout_text(c: Candidate) -> str:
    """A layout in short words (LEGEND), none longer than a recompute option's name, so an
    80-column table wraps it between words instead of cutting it."""
    p = c.parallel
    dp = (f"dp{p.dp_replicate}x{p.dp_shard}" if p.dp_replicate > 1
          else f"dp{p.dp_shard}" if p.dp_shard > 1 else "")
    parts = [dp, *(f"{n}{getattr(p, n)}" for n in ("tp", "pp", "cp") if getattr(p, n) > 1)]
    parts = [part for part in parts if part] or ["single"]
    parts.append(f"z{p.zero}")
    if p.pp > 1:
        parts.append(f"{SCHEDULE_ABBREVIATIONS.get(p.pp_schedule, p.pp_schedule)} "
                     f"v{p.pp_virtual_stages} m{p.pp_microbatches}")
    parts.append(f"mb{c.micro_batch_size}x{c.grad_accum_steps}")
    if c.loss_chunks:
        parts.append(f"lc{c.loss_chunks}")
    parts.append(c.recompute_name)
    return " ".join(parts)


def print_search(result: SearchResult, console: Console, *, global_batch_size: int) -> None:
    """The top layouts as a table that fits 80 columns (the layout wraps between its words),
    each one's `why` on its own line below it, then the counts."""
    table = Table(title=f"Top {len(result.top)} layouts by predicted tokens/s per device "
                        f"(global batch {global_batch_size} sequences)", title_justify="left")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("layout", ratio=1, min_width=19, overflow="fold")
    for column in ("memory/rank", "step", "tok/s/dev", "MFU"):
        table.add_column(column, justify="right", no_wrap=True)
    for i, r in enumerate(result.top):
        pred = r.prediction
        knobs = "".join(f" {KNOB_WORDS.get(k, k)}" for k in r.extra)
        table.add_row(str(i + 1), layout_text(r.candidate) + knobs, gib(r.plan.memory.total),
                      "-" if pred.step_s is None else f"{pred.step_s:.2f} s",
                      "-" if pred.tokens_per_s_per_device is None
                      else f"{pred.tokens_per_s_per_device:,.0f}",
                      "-" if pred.mfu is None else f"{pred.mfu:.0%}")
    console.print(table)
    plain = dict(markup=False, highlight=False)
    console.print(LEGEND, **plain)
    for i, r in enumerate(result.top):
        console.print(f"#{i + 1}: {r.why}", **plain)
    rules = ", ".join(f"{key} {n}" for key, n in result.rejected.most_common())
    console.print(f"{result.enumerated} layouts resolve() accepts; {result.fits} fit; "
                  f"{result.dropped_line}.\nrejected by rule: {rules or 'none'}\n"
                  f"ranked by: {result.basis}", **plain)
