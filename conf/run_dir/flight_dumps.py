"""What the ranks' flight records (training/flight_recorder.py) say about a hang, for the
watchdog's report: per process group, the last collective each rank entered, and the ranks
behind the others there (they never reached the collective their peers wait in). Torch-free.
"""
from __future__ import annotations

import json
from pathlib import Path

from conf.run_dir.heartbeats import flight_dump_file


def read_flight_dumps(run_dir: Path | str, world_size: int, *, since: float) -> dict[int, list]:
    """rank -> its flight record's entries, for the dumps written after `since` (wall clock)."""
    dumps = {}
    for rank in range(world_size):
        path = flight_dump_file(run_dir, rank)
        try:
            if path.stat().st_mtime >= since:
                dumps[rank] = json.loads(path.read_text()).get("entries", [])
        except (OSError, ValueError):
            continue
    return dumps


def last_by_group(entries: list[dict]) -> dict[str, dict]:
    """Process group -> the newest collective (not point-to-point) entry of one rank."""
    last: dict[str, dict] = {}
    for entry in entries:
        if entry.get("is_p2p"):
            continue
        group = _group_name(entry)
        if entry.get("collective_seq_id", 0) >= last.get(group, {}).get("collective_seq_id", -1):
            last[group] = entry
    return last


def flight_lines(dumps: dict[int, list], world_size: int) -> list[str]:
    """The report's lines: per group, each rank's last collective and who is behind."""
    if not dumps:
        return ["flight records: none written (no rank could answer)"]
    by_rank = {rank: last_by_group(entries) for rank, entries in dumps.items()}
    groups = sorted({g for last in by_rank.values() for g in last})
    lines = [f"flight records (torch's, every collective; logs/flight.rank<R>.json), "
             f"{len(dumps)} of {world_size} ranks answered:"]
    for group in groups:
        seen = {r: last[group] for r, last in sorted(by_rank.items()) if group in last}
        newest = max(e.get("collective_seq_id", 0) for e in seen.values())
        behind = [r for r, e in seen.items() if e.get("collective_seq_id", 0) < newest]
        lines.append(f"  group {group}: " + "; ".join(
            f"rank {r} #{e.get('collective_seq_id')} {e.get('profiling_name', '?')}"
            for r, e in seen.items()) + (f"  <- behind: rank(s) {', '.join(map(str, behind))}"
                                         if behind else ""))
    return lines


def _group_name(entry: dict) -> str:
    group = entry.get("process_group") or ["?", ""]
    return f"{group[0]}" + (f" ({group[1]})" if len(group) > 1 and group[1] else "")
