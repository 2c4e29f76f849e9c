"""What to change when a run does not fit its devices: each suggestion is the overrides a
person would type, composed and resolved like any run and re-planned, so it shows the memory
it would need and its own verdict. Suggestions that do not resolve are left out."""
from __future__ import annotations

from dataclasses import dataclass

from conf.compose import compose_many
from conf.errors import ConfigError
from conf.hf_model_config import explicit_model_keys
from conf.resolve import resolve
from conf.spec import RunSpec
from parallel.cost.plan import Plan, make_plan

MAX_SUGGESTIONS = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class Suggestion:
    what: str
    overrides: list[str]
    plan: Plan


def candidates(spec: RunSpec) -> list[tuple[str, list[list[str]]]]:
    """(what, override variants to try in order): higher zero, full recompute, twice the tp,
    half the micro-batch."""
    p, t = spec.parallel, spec.training
    found = []
    if p.zero < 3:
        found += [(f"ZeRO-{z}", [[f"parallel.zero={z}"],
                                 [f"parallel.zero={z}", "parallel.dp_shard=-1",
                                  "parallel.dp_replicate=1"]]) for z in range(p.zero + 1, 4)]
    if spec.recompute.mode.value != "full":
        found.append(("full recompute", [["recompute=full"]]))
    tp = [f"parallel.tp={2 * p.tp}"]
    fsdp = ["parallel.dp_shard=-1", "parallel.dp_replicate=1"]
    found.append((f"tp {2 * p.tp}", [tp, [*tp, *fsdp], [*tp, "parallel.zero=3", *fsdp]]))
    if t.micro_batch_size > 1:
        half = t.micro_batch_size // 2
        found.append((f"micro-batch {half}", [[f"training.micro_batch_size={half}"],
                                              [f"training.micro_batch_size={half}",
                                               "training.grad_accum_steps=-1"]]))
    return found


def suggestions(spec: RunSpec, overrides: list[str], *,
                device_bytes: float | None = None) -> list[Suggestion]:
    """Re-planned suggestions for a run that does not fit: those that fit first, then by the
    memory they need; at most MAX_SUGGESTIONS, at most one per ZeRO stage (the lowest that
    fits, else the highest)."""
    tried = candidates(spec)
    flat = [(what, extra) for what, variants in tried for extra in variants]
    configs = dict(zip(map(id, (e for _, e in flat)),
                       compose_many([[*overrides, *extra] for _, extra in flat])))
    found = []
    for what, variants in tried:
        for extra in variants:
            cfg = configs[id(extra)]
            try:
                if isinstance(cfg, ConfigError):
                    raise cfg
                other = resolve(cfg, host=spec.host, check_paths=False,
                                explicit=explicit_model_keys([*overrides, *extra]))
            except ConfigError:
                continue
            found.append(Suggestion(what=what, overrides=extra,
                                    plan=make_plan(other, device_bytes=device_bytes)))
            break
    zero = [s for s in found if s.what.startswith("ZeRO-")]
    fitting = [s for s in zero if s.plan.verdict.fits]
    keep = fitting[:1] or zero[-1:]
    found = [s for s in found if s in keep or not s.what.startswith("ZeRO-")]
    found.sort(key=lambda s: (not s.plan.verdict.fits, s.plan.memory.total))
    return found[:MAX_SUGGESTIONS]
