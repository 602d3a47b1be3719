"""The timeline's events are one enum: every name the driver writes and every name the grader, the report and
resume read is an `Event`, and the timeline refuses any other (a typo would write an event nothing reads)."""
from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from cluster.wave.timeline import EVENTS, Event, Timeline

ROOT = Path(__file__).resolve().parents[2]


def _py(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_every_event_written_or_read_is_an_event():
    """Every writer names its event by the enum (`timeline(Event.WAVE_END, ...)`: issue 44), never by a string."""
    by_name, written, read = set(), set(), set()
    for py in _py("cluster") + _py("fleet"):
        text = py.read_text()
        by_name |= {f"{py.relative_to(ROOT)}: {n}" for n in re.findall(r"(?:timeline|\btl)\(\s*\"([a-z_]+)\"", text)}
        written |= set(re.findall(r"(?:timeline|\btl)\(\s*Event\.([A-Z_]+)\b", text))
        read |= set(re.findall(r"\[\"event\"\]\s*==\s*\"([a-z_]+)\"", text))
        read |= {n for group in re.findall(r"\[\"event\"\]\s*in\s*\(([^)]*)\)", text)
                 for n in re.findall(r"\"([a-z_]+)\"", group)}
    assert not by_name, f"a timeline event written by its name, not as an Event: {sorted(by_name)}"
    assert len(written) > 20 and read, (written, read)
    assert written <= set(Event.__members__), sorted(written - set(Event.__members__))
    assert read <= EVENTS, sorted(read - EVENTS)


def test_an_unknown_event_is_refused_and_a_known_one_written_by_name(tmp_path):
    tl = Timeline(tmp_path / "t.jsonl")
    tl(Event.WAVE_START, wave="w")
    tl("task_end", task="t000")
    with pytest.raises(ValueError, match="wave_strat"):
        tl("wave_strat")
    tl.close()
    lines = [orjson.loads(x) for x in (tmp_path / "t.jsonl").read_bytes().splitlines()]
    assert [x["event"] for x in lines] == ["wave_start", "task_end"]


def test_a_stored_wave_round_trips_through_its_typed_records_byte_for_byte():
    """faults.json through `Receipt`, each planned fault of plan.json through `FaultSpec`, and every timeline line
    through `Event`: written back with the driver's own options, the stored bytes come out unchanged."""
    from faults.base import FaultSpec, Receipt

    fixture = ROOT / "tests" / "fixtures" / "wave-before-results-py"
    stored = (fixture / "faults.json").read_bytes()
    receipts = [Receipt(**r) for r in orjson.loads(stored)]
    assert receipts
    assert orjson.dumps([r.to_dict() for r in receipts], option=orjson.OPT_INDENT_2, default=str) == stored
    plan_bytes = (fixture / "plan.json").read_bytes()
    plan = orjson.loads(plan_bytes)
    for t in plan["tasks"]:
        t["faults"] = [FaultSpec(**f).to_dict() for f in t["faults"]]
    assert orjson.dumps(plan, option=orjson.OPT_INDENT_2, default=str) == plan_bytes
    lines = (fixture / "timeline.jsonl").read_bytes().splitlines()
    for line in lines:
        rec = orjson.loads(line)
        rec["event"] = Event(rec["event"]).value
        assert orjson.dumps(rec, default=str) == line


@pytest.mark.parametrize("width", [60, 80, 100, 160])
def test_the_progress_line_fits_the_terminal_with_every_count(width):
    from rich.console import Console

    from cluster.wave.progress import progress_bar, progress_info

    console = Console(width=width, record=True, force_terminal=True, color_system=None)
    progress, narrow = progress_bar(console)
    wave = "w-20261202T160632-s11-9b4f"
    bar = progress.add_task(f"wave …{wave[-4:]}" if narrow else f"wave {wave}", total=12,
                            info=progress_info(narrow, 4, 17, 6, 6))
    progress.update(bar, completed=7)
    console.print(progress.get_renderable())
    line = console.export_text().splitlines()[0]
    assert len(line) <= width and "…" not in line.replace("wave …", ""), line
    for count in ("7/12", "4", "17", "6"):
        assert count in line, (count, line)
