"""Benchmarks (`make bench`); `write_section` puts one bench's table into BENCHMARKS.md between its markers."""
from __future__ import annotations

import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "BENCHMARKS.md"


def write_section(mark: str, title: str, lead: str, header: str, rows: list) -> str:
    """Replace the section between two `mark` lines of BENCHMARKS.md (or append it): `## title`, `lead` and the
    date, a table of `header` (`| a | b | c | d |`) and 4-column `rows`. Returns the section (also printed)."""
    cols = header.count("|") - 1
    table = [header, "|" + "---|" * cols] + [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    section = (f"{mark}\n## {title}\n\n{lead}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
               + ".\n\n" + "\n".join(table) + "\n" + mark + "\n")
    old = BENCHMARKS.read_text() if BENCHMARKS.exists() else ""
    if old.count(mark) >= 2:
        a, _, rest = old.partition(mark)
        _, _, b = rest.partition(mark)
        new = a + section.rstrip("\n") + b
    else:
        new = old.rstrip("\n") + "\n\n" + section
    BENCHMARKS.write_text(new)
    print(section)
    return section
