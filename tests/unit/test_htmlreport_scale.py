"""The report of a large wave (issue 45) stays small without hiding a task that did not pass: a 10,000-task wave's
files, made as tests/bench/report.py makes them, render under 10 MiB with a lane and a page for every task that did
not pass, the passing ones left out and counted; when every task failed, the lanes and pages are capped, worst
first, and what has none is counted and pointed at; a wave up to `FULL_REPORT_TASKS` keeps a lane and a page per
task. Sizes are asserted, time never."""
from __future__ import annotations

import re
from pathlib import Path

from cluster import htmlreport, results
from cluster.htmlreport import FULL_REPORT_TASKS, LANES_MAX, PAGE_BYTES_MAX, write_html
from tests.bench.report import _wave

BOUND = 10 * 2**20  # issue 45: index.html and every page of a 10,000-task wave


def _render(d: Path, result: dict) -> tuple[str, set[str], int]:
    """(the index, the task ids that have a page, the report's total size: the index and every file under pages/)."""
    index = write_html(d, result)
    files = [p for p in (d / results.PAGES).rglob("*") if p.is_file()]
    return index.read_text(), {p.stem for p in files}, index.stat().st_size + sum(p.stat().st_size for p in files)


def _lanes(text: str) -> list[str]:
    return re.findall(r"data-lane='([^']+)'", text)


def _rows(text: str) -> dict[str, str]:
    """task id -> its row in the tasks table."""
    rows = re.findall(r"<tr data-verdict=.*?</tr>", text)
    return {re.search(r"<td>(?:<a href='[^']+'>)?([^<\s]+)", r).group(1): r for r in rows}


def test_a_10000_task_report_stays_under_10_mib_with_every_failed_task_drawn_and_paged(tmp_path):
    d = tmp_path / "w-big"
    result = _wave(d, 10_000)
    not_passed = {g["task_id"] for g in result["tasks"] if g["verdict"] != "pass"}
    assert 0 < len(not_passed) < LANES_MAX
    text, paged, size = _render(d, result)
    assert size < BOUND, f"{size / 2**20:.2f} MiB"
    assert sorted(_lanes(text)) == sorted(not_passed)
    bars = set(re.findall(r"<rect class=attempt data-task='([^']+)'", text))
    assert bars == not_passed  # a passing task's marks go with its lane
    assert paged == not_passed
    rows = _rows(text)
    assert len(rows) == 10_000  # every task keeps its row, with its verdict
    for tid, row in rows.items():
        if tid in not_passed:
            assert f"href='pages/{tid}.html'" in row, row
        else:
            assert "href=" not in row and f"no page: {tid}.grade.json" in row, row
    note = re.search(r"<p id=left-out>(.*?)</p>", text).group(1)
    passed = 10_000 - len(not_passed)
    assert f"10,000 tasks: {passed:,} pass, {len(not_passed):,} fail, 0 unknown, 0 not_applied" in note, note
    assert f"({len(not_passed):,} lanes)" in note and f"({len(not_passed):,} pages)" in note, note
    assert f"the {passed:,} tasks that passed have neither" in note, note
    assert "have no lane" not in note and "have no page" not in note, note  # nothing that failed was left out


def test_when_every_task_of_10000_failed_lanes_and_pages_are_capped_and_the_rest_counted(tmp_path):
    d = tmp_path / "w-all-fail"
    result = _wave(d, 10_000, fail_every=1, log_bytes=4096)
    text, paged, size = _render(d, result)
    assert size < BOUND, f"{size / 2**20:.2f} MiB"
    lanes = _lanes(text)
    assert len(lanes) == LANES_MAX
    assert 0 < len(paged) < 10_000
    pages_size = sum(p.stat().st_size for p in (d / results.PAGES).iterdir())
    assert pages_size <= PAGE_BYTES_MAX
    order = sorted(g["task_id"] for g in result["tasks"])  # all fail: the worst first is by id
    assert sorted(lanes) == order[:LANES_MAX] and sorted(paged) == order[:len(paged)]
    note = re.search(r"<p id=left-out>(.*?)</p>", text).group(1)
    assert "10,000 tasks: 0 pass, 10,000 fail" in note, note
    assert f"{10_000 - LANES_MAX:,} have no lane" in note and f"worst first: {10_000 - LANES_MAX:,} fail)" in note
    assert f"{10_000 - len(paged):,} have no page" in note and "<code>evidence/&lt;task&gt;/</code>" in note, note
    rows = _rows(text)
    assert len(rows) == 10_000
    for tid, row in rows.items():
        assert (f"href='pages/{tid}.html'" in row) == (tid in paged), row
        assert (f"no page: evidence/{tid}/" in row) == (tid not in paged), row


def test_past_the_cap_fail_is_kept_before_unknown_before_not_applied_and_an_ungraded_lane_counts(tmp_path,
                                                                                                  monkeypatch):
    monkeypatch.setattr(htmlreport, "FULL_REPORT_TASKS", 10)
    monkeypatch.setattr(htmlreport, "LANES_MAX", 4)
    d = tmp_path / "w-mixed"
    result = _wave(d, 20, fail_every=1000)  # t0000 fails (0 % 1000), the rest pass; verdicts set below
    verdicts = {"t0003": "not_applied", "t0005": "unknown", "t0007": "fail", "t0009": "not_applied"}
    for g in result["tasks"]:
        g["verdict"] = verdicts.get(g["task_id"], "fail" if g["task_id"] == "t0000" else "pass")
    result["tasks"] = [g for g in result["tasks"] if g["task_id"] != "t0011"]  # in the timeline, not graded
    text, paged, _ = _render(d, result)
    assert sorted(_lanes(text)) == ["t0000", "t0005", "t0007", "t0011"]  # fail, fail, unknown, ungraded (unknown)
    assert paged == {"t0000", "t0003", "t0005", "t0007", "t0009"}  # every graded task that did not pass
    note = re.search(r"<p id=left-out>(.*?)</p>", text).group(1)
    assert "19 tasks: 14 pass, 2 fail, 1 unknown, 2 not_applied; 1 more in the timeline have no grade" in note, note
    assert "2 have no lane (at most 4 lanes, the worst first: 2 not_applied)" in note, note


def test_a_wave_of_full_report_tasks_keeps_a_lane_and_a_page_per_task(tmp_path):
    d = tmp_path / "w-full"
    result = _wave(d, FULL_REPORT_TASKS)
    text, paged, _ = _render(d, result)
    tids = {g["task_id"] for g in result["tasks"]}
    assert sorted(_lanes(text)) == sorted(tids) and paged == tids
    assert "id=left-out" not in text and "no page" not in text
    assert all(f"href='pages/{tid}.html'" in row for tid, row in _rows(text).items())


def test_one_task_more_than_full_report_tasks_leaves_the_passing_ones_out(tmp_path):
    d = tmp_path / "w-one-more"
    result = _wave(d, FULL_REPORT_TASKS + 1)
    text, paged, _ = _render(d, result)
    not_passed = {g["task_id"] for g in result["tasks"] if g["verdict"] != "pass"}
    assert set(_lanes(text)) == not_passed and paged == not_passed and "id=left-out" in text
