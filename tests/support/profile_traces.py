"""Read torch.profiler traces back (training/step_probes.py writes them)."""
from __future__ import annotations

import json
from pathlib import Path


def traced_steps(run_dir: Path) -> list[set[int]]:
    """Per trace file, sorted by name: the ProfilerStep numbers holding an aten::mm op."""
    found = []
    for path in sorted((run_dir / "profile").glob("rank*.pt.trace.json")):
        events = json.loads(path.read_text())["traceEvents"]
        steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
        ops = [e for e in events if e.get("name", "").startswith("aten::mm")]
        found.append({int(s["name"].split("#")[1]) for s in steps
                      if any(s["ts"] <= o["ts"] <= s["ts"] + s["dur"] for o in ops)})
    return found
