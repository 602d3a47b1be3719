"""A hostile review's find: a results folder whose name holds ESC, BEL or a bidi override (and a plan naming such a
wave id) reached the wave's index.html, its task pages and `sandfleet serve`'s index raw: html.escape leaves
control bytes alone. Every generated page shows them escaped (`\\x1b`)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import orjson
import pytest

from cluster import report, results, serve
from cluster.grade import grade_wave

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "wave-before-results-py"
NAME = "w\x1b]0;PWNED\x07\x1b[2J\x9b31m\u202e"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def wave(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_timeline_png", lambda d: None)  # drawn by a child of its own; not what is tested
    d = tmp_path / "root" / NAME
    shutil.copytree(FIXTURE, d)
    for stale in (results.SUMMARY, results.VERDICT, results.INDEX_HTML):
        (d / stale).unlink(missing_ok=True)
    plan = orjson.loads((d / results.PLAN).read_bytes())
    (d / results.PLAN).write_bytes(orjson.dumps(dict(plan, wave_id=NAME)))
    # the wave ran as NAME (its timeline's wave_start agrees: a plan alone renamed is a damaged plan, exit 2)
    lines = [orjson.loads(line) for line in (d / results.TIMELINE).read_bytes().splitlines() if line.strip()]
    (d / results.TIMELINE).write_bytes(b"".join(orjson.dumps(dict(e, wave=NAME) if e.get("event") == "wave_start"
                                                             else e) + b"\n" for e in lines))
    report.write_summary(d, grade_wave(d))
    return d


def test_a_wave_folder_named_with_escapes_reaches_no_page_raw(wave):
    pages = [wave / results.INDEX_HTML, *sorted((wave / results.PAGES).glob("*.html")), wave / results.SUMMARY]
    assert len(pages) > 2
    for p in pages:
        text = p.read_text()
        assert not RAW.search(text), (p.name, RAW.search(text))
    assert "\\x1b]0;PWNED" in (wave / results.INDEX_HTML).read_text()


def test_the_serve_index_shows_an_escaped_wave_name(wave):
    root = wave.parent
    page = serve.index_html(root, serve.collect(root))
    assert not RAW.search(page), RAW.search(page)
    assert "\\x1b]0;PWNED" in page and "/w/w%1B%5D0%3BPWNED" in page
