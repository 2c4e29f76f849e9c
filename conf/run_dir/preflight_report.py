"""Torch-free formatting of preflight.json (the launcher prints it; rank 0 logs the table)."""
from __future__ import annotations

KIB, MIB = 1 << 10, 1 << 20


def format_size(size_bytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale} {unit}"
    return f"{size_bytes} B"


def format_table(rows: list[dict]) -> str:
    """Aligned text columns: size, time (ms), algbw and busbw (GB/s)."""
    header = ("size", "time_ms", "algbw_GB/s", "busbw_GB/s")
    body = [(format_size(r["size_bytes"]), f"{r['time_ms']:.3f}", f"{r['algbw_gbps']:.3f}",
             f"{r['busbw_gbps']:.3f}") for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths))
                     for line in [header, *body])


def format_report(report: dict) -> str:
    """The whole preflight.json as a few lines: who joined, the all-reduce check, the table."""
    hosts = ", ".join(f"{host}: ranks {ranks}" for host, ranks in report["ranks_by_host"].items())
    check = "passed" if report["all_reduce_check"]["passed"] else "FAILED"
    note = f"\n({report['bandwidth_note']})" if report.get("bandwidth_note") else ""
    return (f"preflight: {report['world_size']} ranks ({hosts}) over {report['backend']}; "
            f"all-reduce check {check}\n{format_table(report['bandwidth'])}{note}")
