"""The wave report as a web page (cluster/htmlreport.py), rendered from a stored wave: every lane and mark of the
timeline matches the timeline file, every task has its page and link, nothing a runner wrote is left unescaped,
and nothing is fetched from the network."""
from __future__ import annotations

import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

from cluster import results
from cluster.grade import grade_wave
from cluster.htmlreport import write_html

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "wave-before-results-py"


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _tags(text: str) -> list[tuple[str, dict]]:
    p = Tags()
    p.feed(text)
    return p.tags


def test_the_web_report_of_a_stored_wave_shows_every_attempt_fault_and_task(tmp_path):
    d = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, d, symlinks=True)
    result = grade_wave(d)
    index = write_html(d, result)
    text = index.read_text()
    tags = _tags(text)
    events = results.read_jsonl(d / results.TIMELINE)
    tasks = {e["task"] for e in events if e.get("task")}
    lanes = [a["data-lane"] for t, a in tags if t == "text" and "data-lane" in a]
    assert sorted(lanes) == sorted(tasks)
    bars = [a["data-task"] for t, a in tags if t == "rect" and a.get("class") == "attempt"]
    assert sorted(bars) == sorted(e["task"] for e in events if e["event"] == "attempt_end")
    marks = [a["data-task"] for t, a in tags if t == "polygon" and a.get("class") == "fault"]
    assert sorted(marks) == sorted(e["task"] for e in events if e["event"] == "fault_inject")
    assert marks, "the fixture has faults: the timeline shows none"
    graded = [g["task_id"] for g in result["tasks"] + result["references"]]
    rows = [a for t, a in tags if t == "tr" and "data-verdict" in a]
    assert len(rows) == len(graded)
    links = {a["href"] for t, a in tags if t == "a" and a.get("href", "").startswith(results.PAGES + "/")}
    assert links == {f"{results.PAGES}/{tid}.html" for tid in graded}
    for tid in graded:
        page = (d / results.PAGES / f"{tid}.html").read_text()
        g = next(x for x in result["tasks"] + result["references"] if x["task_id"] == tid)
        check_rows = re.findall(r"<table id=checks>(.*?)</table>", page)[0].count("<tr>") - 1
        assert check_rows == len(g["checks"]) and f"sandfleet wave replay {d}/{tid}" in page
    assert not re.search(r"(src|href)=['\"]?https?:", text), "the report fetches something from the network"


def test_what_a_runner_wrote_is_escaped_on_its_task_page(tmp_path):
    d = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, d, symlinks=True)
    result = grade_wave(d)
    tid = result["tasks"][0]["task_id"]
    log = next(results.ResultsDir(d).runner_logs(tid).__iter__())
    log.write_text("<script>alert('x')</script>\n")
    shutil.rmtree(d / results.EVIDENCE / tid, ignore_errors=True)  # the raw (redacted) log is shown then
    write_html(d, result)
    page = (d / results.PAGES / f"{tid}.html").read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page
