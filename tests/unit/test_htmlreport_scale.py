"""The report of a large wave (issue 45) stays small without hiding a task that did not pass: a 10,000-task wave's
files, made as tests/bench/report.py makes them, render under 10 MiB with a lane and a page for every task that did
not pass, the passing ones left out and counted; when every task failed, the lanes and pages are capped, worst
first, and what has none is counted and pointed at; a wave up to `FULL_REPORT_TASKS` keeps a lane and a page per
task; `sandfleet serve` renders a page left out from the wave's files when asked. Sizes are asserted, time never."""
from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request
from pathlib import Path

import orjson

from cluster import htmlreport, results
from cluster.htmlreport import FULL_REPORT_TASKS, LANES_MAX, PAGE_BYTES_MAX, page_on_demand, write_html
from cluster.serve import make_server
from tests.bench.report import CHECKS, _wave

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
    for tid, row in rows.items():  # every id links its page (`sandfleet serve` renders one left out)
        assert f"href='pages/{tid}.html'" in row, row
        assert ("no page file" in row) == (tid not in not_passed), row
        assert (f"no page file: {tid}.grade.json" in row) == (tid not in not_passed), row
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
        assert f"href='pages/{tid}.html'" in row, row
        assert (f"no page file: evidence/{tid}/" in row) == (tid not in paged), row


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


def _served_wave(root: Path, monkeypatch) -> tuple[Path, dict]:
    """A wave past a (lowered) `FULL_REPORT_TASKS`, stored with its plan.json and `<task>.grade.json` files as a
    real wave is, one passing task's check quoting what a runner wrote."""
    monkeypatch.setattr(htmlreport, "FULL_REPORT_TASKS", 10)
    d = root / "w-20261206T000000-s1-big"
    result = _wave(d, 30, fail_every=7)
    result["plan"] = {"wave_id": d.name, "created_at": 1.8e9, "tasks": []}
    result["tasks"][1]["checks"]["completed"]["detail"] = "<script>alert(1)</script> the runner said"
    (d / results.PLAN).write_bytes(orjson.dumps(result["plan"]))
    for g in result["tasks"]:
        (d / f"{g['task_id']}{results.GRADE_SUFFIX}").write_bytes(orjson.dumps(g))
    write_html(d, result)
    return d, result


def test_a_left_out_page_rendered_on_demand_is_the_page_write_html_writes(tmp_path, monkeypatch):
    d, result = _served_wave(tmp_path, monkeypatch)
    assert sorted(p.stem for p in (d / results.PAGES).iterdir()) == ["t0000", "t0007", "t0014", "t0021", "t0028"]
    for tid in ("t0000", "t0007"):  # written: the same bytes
        assert page_on_demand(d, tid) == (d / results.PAGES / f"{tid}.html").read_text()
    page = page_on_demand(d, "t0001")
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)" in page
    assert re.findall(r"<table id=checks>(.*?)</table>", page)[0].count("<tr>") - 1 == len(CHECKS)
    assert page.count("<tr><td>1</td><td>node-0</td>") == 1  # its attempts, from the timeline
    for bad in ("../t0001", "", ".t0001", "t0001/x", "nope", "t0001.grade"):
        assert page_on_demand(d, bad) is None, bad
    (d / "x.grade.json").symlink_to(d / f"t0001{results.GRADE_SUFFIX}")  # a link is never read
    assert page_on_demand(d, "x") is None
    (d / results.PLAN).write_bytes(orjson.dumps({"tasks": "not a list", "references": 7}))
    assert "&lt;script&gt;alert(1)" in page_on_demand(d, "t0001")  # a plan of any shape: still the page


def test_serve_renders_a_left_out_page_when_asked_and_nothing_outside_the_wave(tmp_path, monkeypatch):
    d, _ = _served_wave(tmp_path, monkeypatch)
    srv = make_server(tmp_path, 0, max_connections=4, idle_s=2)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    base = f"http://127.0.0.1:{srv.server_address[1]}/w/{d.name}"

    def get(rel: str):
        try:
            r = urllib.request.urlopen(f"{base}/{rel}", timeout=10)
        except urllib.error.HTTPError as exc:
            r = exc
        return r.status, r.headers, r.read().decode()

    try:
        status, headers, body = get("pages/t0001.html")
        assert status == 200 and headers["Content-Type"].startswith("text/html"), (status, body[:300])
        assert headers["Content-Security-Policy"] == htmlreport.page_csp()
        assert body == page_on_demand(d, "t0001") and "&lt;script&gt;alert(1)" in body
        assert get("pages/t0000.html")[2] == (d / results.PAGES / "t0000.html").read_text()  # the stored file
        for rel in ("pages/nope.html", "pages/..%2Ft0001.html", "pages/%2E%2E/pages/t0001.grade.html",
                    "pages/t0001.htm", "t0001.html", "evidence/t0001.html"):
            assert get(rel)[0] == 404, rel
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_large_waves_page_an_earlier_render_wrote_goes_when_its_task_now_passes(tmp_path):
    """Rendered again after a verdict changed (or after an older grader paged every task), a large wave keeps no
    page it did not write this time: `serve` would send it as current. A link in its place is left alone."""
    d = tmp_path / "w-stale"
    first = _wave(d, FULL_REPORT_TASKS + 200)
    write_html(d, first)
    assert (d / "pages" / "t0017.html").is_file()  # t0017 failed
    outside = tmp_path / "outside.html"
    outside.write_text("not ours")
    (d / "pages" / "t0018.html").symlink_to(outside)  # a passing task's name, a link in its place
    again = orjson.loads(orjson.dumps(first))
    g = next(g for g in again["tasks"] if g["task_id"] == "t0017")
    g["verdict"] = "pass"
    for c in g["checks"].values():
        c["verdict"] = "pass"
    write_html(d, again)
    assert not (d / "pages" / "t0017.html").exists()
    assert (d / "pages" / "t0000.html").is_file()  # still failing: still paged
    assert (d / "pages" / "t0018.html").is_symlink() and outside.read_text() == "not ours"


def test_pages_on_demand_read_the_wave_once_until_its_files_change(tmp_path, monkeypatch):
    """serve renders many left-out pages of one large wave: its timeline, receipts and plan are read once and read
    again only when one of them changed (helper-41: 0.33 CPU-s for every page of a 10,000-task wave)."""
    d, _ = _served_wave(tmp_path, monkeypatch)
    reads = []
    real = results.read_jsonl
    monkeypatch.setattr(results, "read_jsonl", lambda p, *a, **k: reads.append(p) or real(p, *a, **k))
    htmlreport._VIEWS.clear()
    first = page_on_demand(d, "t0001")
    assert first is not None and page_on_demand(d, "t0002") is not None and len(reads) == 1
    with open(d / results.TIMELINE, "ab") as f:
        f.write(orjson.dumps({"t": 99.0, "event": "attempt_end", "task": "t0001", "attempt": 9, "exit_code": 0})
                + b"\n")
    again = page_on_demand(d, "t0001")
    assert len(reads) == 2 and again != first  # the new attempt is on the page
