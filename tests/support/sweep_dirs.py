"""A finished sweep on disk without training: run dirs as the launcher and the training loop
leave them (spec, config, overrides, metrics, summary) and the sweep's points.json, for the
compare and report tests."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from conf.compose import compose_config, config_yaml
from conf.spec import HostSpec
from conf.run_dir.spec_io import write_spec
from tests.support.specs import cpu_spec

# name, overrides, val losses per eval (every 10 steps), steps logged, finished?
POINTS = (
    ("lr-1e-3", ["optim.lr=1e-3"], [5.5, 4.8, 4.4], 20, True),
    ("lr-3e-3", ["optim.lr=3e-3"], [5.5, 4.0, 3.3], 20, True),
    ("lr-1e-2-long", ["optim.lr=1e-2", "training.steps=40"], [5.5, 4.5], 15, False),
    ("lr-3e-2", ["optim.lr=3e-2"], None, 0, False),  # never ran: its run dir does not exist
)


def write_run(run_dir: Path, *, overrides: list[str], val_losses: list[float], steps: int,
              finished: bool, cpu_count: int = 2) -> None:
    """A run dir as the launcher and the training loop leave it."""
    (run_dir / "logs").mkdir(parents=True)
    # As a sweep writes them: auto warmup (resolves per training.steps), the point's name and
    # W&B tags derived from its values. None of these is a difference the user made.
    tags = "logging.wandb_tags=[" + ",".join(o.replace("=", "_") for o in overrides) + "]"
    asked = ["model=tiny", f"runs_dir={run_dir.parent}", *overrides, f"name={run_dir.name}",
             tags]
    spec = cpu_spec(*asked)
    (run_dir / "config.yaml").write_text(config_yaml(compose_config(["logging=disabled", *asked])))
    spec = dataclasses.replace(spec, host=HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0,
                                                   cpu_count=cpu_count))
    write_spec(spec, run_dir / "spec.json")
    (run_dir / "overrides.json").write_text(json.dumps(asked))
    (run_dir / "logs" / "rank0.log").write_text("step 1\n")
    rows = [{"kind": "eval", "step": 10 * i, "val_loss": v, "time": 100.0 + 10 * i}
            for i, v in enumerate(val_losses)]
    slope = 0.1 * (val_losses[0] - val_losses[-1]) / len(val_losses)  # falls as its val loss does
    rows += [{"kind": "train", "step": s, "loss": 5.6 - s * slope, "tokens_per_s": 1000.0 * s,
              "mfu": 0.01 * s, "mem_peak_gib": 0.5 + s / 100, "time": 100.0 + s}
             for s in range(1, steps + 1)]
    rows.sort(key=lambda r: (r["step"], r["kind"] != "eval"))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        summary = {"steps_done": steps, "final_loss": rows[-1]["loss"],
                   "final_val_loss": val_losses[-1], "best_val_loss": min(val_losses),
                   "tokens_per_s": 12345.0, "mfu": 0.25, "peak_mem_gib": 1.5, "wall_s": 20.0}
        (run_dir / "summary.json").write_text(json.dumps(summary))


def write_sweep(sweep_dir: Path) -> Path:
    """A sweep dir: points.json with a relative, an absolute and a missing run dir."""
    points = []
    for index, (name, overrides, val_losses, steps, finished) in enumerate(POINTS):
        run_dir = sweep_dir / "runs" / name
        if val_losses is not None:
            write_run(run_dir, overrides=overrides, val_losses=val_losses, steps=steps,
                      finished=finished, cpu_count=2 + index)
        shown = run_dir if index == 1 else run_dir.relative_to(sweep_dir)
        points.append({"name": name, "overrides": overrides, "run_dir": str(shown)})
    (sweep_dir / "points.json").write_text(json.dumps(points, indent=2))
    return sweep_dir
