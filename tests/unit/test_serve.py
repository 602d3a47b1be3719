"""`sandfleet serve` is safe to look at and safe to host (issue 42): only the generated pages go out as HTML (under
a CSP that runs only our scripts, by hash), every file a runner could have written goes out inert, every answer says
nosniff; the server has a real backlog, an idle timeout and a cap on connections, and streams files; a wave of any
plan or verdict shape names its row and never takes the index down."""
from __future__ import annotations

import base64
import hashlib
import re
import socket
import threading
import time
import tracemalloc
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster import htmlreport
from cluster.serve import BACKLOG, NO_SCRIPT_CSP, collect, index_html, make_server

EVIL = b"<script>document.body.appendChild(document.createElement('pwned'))</script><p>hi</p>"


def _wave(root: Path, name: str = "w-1") -> Path:
    d = root / name
    (d / "pages").mkdir(parents=True)
    (d / "plan.json").write_bytes(orjson.dumps({"wave_id": name, "created_at": 1.8e9, "tasks": []}))
    (d / "index.html").write_text(htmlreport._page("wave", "<p>x</p>", htmlreport.FILTER_JS))
    (d / "pages" / "t000.html").write_text(htmlreport._page("t000", "<p>t</p>"))
    files = d / "artifacts" / "t003" / "files"
    files.mkdir(parents=True)
    for n in ("evil.html", "evil.svg", "evil.xhtml", "x.js", "index.html"):
        (files / n).write_bytes(EVIL)
    (files / "blob.bin").write_bytes(b"\x00\x01<html><script>x</script>")
    (d / "sandboxes" / "s1").mkdir(parents=True)
    (d / "sandboxes" / "s1" / "runner.log").write_bytes(b"<html><script>alert(1)</script>")
    (d / "evidence" / "t003").mkdir(parents=True)
    (d / "evidence" / "t003" / "evil.html").write_bytes(EVIL)
    (d / "SUMMARY.md").write_text("# wave\n")
    return d


@pytest.fixture()
def served(tmp_path):
    _wave(tmp_path)
    srv = make_server(tmp_path, 0, max_connections=4, idle_s=0.5)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _get(url: str):
    try:
        r = urllib.request.urlopen(url, timeout=10)
    except urllib.error.HTTPError as exc:
        r = exc
    return r.status, r.headers, r.read()


@pytest.mark.parametrize("rel", ["artifacts/t003/files/evil.html", "artifacts/t003/files/evil.svg",
                                 "artifacts/t003/files/evil.xhtml", "artifacts/t003/files/x.js",
                                 "artifacts/t003/files/index.html", "sandboxes/s1/runner.log",
                                 "evidence/t003/evil.html", "SUMMARY.md"])
def test_serve_sends_a_runners_file_as_inert_text_never_as_html(served, rel):
    _, url = served
    status, h, body = _get(f"{url}/w/w-1/{rel}")
    assert status == 200 and h["Content-Type"] == "text/plain; charset=utf-8", (rel, h["Content-Type"])
    assert h["X-Content-Type-Options"] == "nosniff" and h["Content-Security-Policy"] == NO_SCRIPT_CSP, dict(h)


def test_serve_sends_a_binary_file_as_an_attachment(served):
    _, url = served
    status, h, _ = _get(f"{url}/w/w-1/artifacts/t003/files/blob.bin")
    assert h["Content-Type"] == "application/octet-stream" and h["Content-Disposition"].startswith("attachment")
    assert h["X-Content-Type-Options"] == "nosniff" and h["Content-Security-Policy"] == NO_SCRIPT_CSP


def test_generated_pages_run_only_their_own_scripts_by_hash(served):
    _, url = served
    for rel in ("index.html", "pages/t000.html", ""):
        status, h, body = _get(f"{url}/w/w-1/{rel}")
        assert status == 200 and h["Content-Type"] == "text/html; charset=utf-8", rel
        csp = h["Content-Security-Policy"]
        assert "script-src 'sha256-" in csp and "'unsafe-inline' " not in csp.split("script-src")[1], csp
        assert h["X-Content-Type-Options"] == "nosniff"
        for script in re.findall(rb"<script>(.*?)</script>", body, re.S):  # each inline script's hash is allowed
            digest = base64.b64encode(hashlib.sha256(script).digest()).decode()
            assert f"'sha256-{digest}'" in csp, (rel, csp)
        assert b"http-equiv=Content-Security-Policy" in body  # the page carries it too (opened as a file)
    status, h, _ = _get(f"{url}/")
    assert "script-src" not in h["Content-Security-Policy"] and h["X-Content-Type-Options"] == "nosniff"
    status, h, _ = _get(f"{url}/w/w-1/nothing")
    assert status == 404 and h["X-Content-Type-Options"] == "nosniff"


def test_serve_closes_a_connection_that_sends_nothing(served):
    _, url = served
    s = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    s.settimeout(5)
    t = time.monotonic()
    assert s.recv(10) == b""  # closed by the server after its idle timeout (0.5 s here)
    assert time.monotonic() - t < 3
    s.close()


def test_serve_answers_past_many_idle_connections(tmp_path):
    """The issue's exhaustion: idle clients each held a thread with no timeout; at the cap an idle one is dropped
    (an idle timeout far longer than the test: only the cap can free a place)."""
    _wave(tmp_path)
    srv = make_server(tmp_path, 0, max_connections=4, idle_s=60)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    port = srv.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    try:
        t = time.monotonic()
        status, _, body = _get(f"http://127.0.0.1:{port}/")
        assert status == 200 and b"w-1" in body and time.monotonic() - t < 5
        assert srv.open_connections() <= srv.max_connections and srv.dropped_idle >= 16, srv.dropped_idle
    finally:
        for s in idle:
            s.close()
        srv.shutdown()
        srv.server_close()
    assert srv.request_queue_size == BACKLOG >= 1024


def test_serve_streams_a_file_never_reading_it_whole(tmp_path):
    d = _wave(tmp_path)
    big = d / "artifacts" / "t003" / "files" / "big.log"
    with open(big, "wb") as f:
        f.write(b"x" * (64 << 20))
    srv = make_server(tmp_path, 0)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    tracemalloc.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.server_address[1]}/w/w-1/artifacts/t003/files/big.log",
                                    timeout=30) as r:
            n = 0
            while chunk := r.read(1 << 20):
                n += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        srv.shutdown()
        srv.server_close()
    assert n == 64 << 20
    assert peak < 8 << 20, peak  # the client reads 1 MiB at a time; the server holds none of the file


def test_a_plan_created_in_the_year_3e12_names_its_row_and_the_index_renders(tmp_path):
    """Found by a hostile review: `created_at: 1e20` raised OverflowError in gmtime and emptied the whole index."""
    _wave(tmp_path, "w-good")
    d = tmp_path / "w-bad"
    d.mkdir()
    (d / "plan.json").write_bytes(b'{"wave_id": "w-bad", "created_at": 1e20, "tasks": []}')
    rows = collect(tmp_path)
    page = index_html(tmp_path, rows)
    bad = next(r for r in rows if r["dir"] == "w-bad")
    assert any("created_at" in p for p in bad["problems"]) and "w-bad" in page and "w-good" in page


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8)
FIELDS = ("wave_id", "created_at", "tasks", "runner", "manifest", "config")
faults = st.one_of(json_values, st.lists(st.fixed_dictionaries({}, optional={"fault_id": json_values}), max_size=3))
plan_tasks = st.lists(st.fixed_dictionaries({}, optional={"faults": faults}), max_size=3)
plans = st.one_of(json_values, st.fixed_dictionaries({}, optional={k: json_values for k in FIELDS}),
                  st.fixed_dictionaries({"tasks": plan_tasks,
                                         "created_at": st.one_of(st.floats(), st.integers(-2**63, 2**63 - 1))}))
tasks = st.fixed_dictionaries({}, optional={k: json_values for k in ("task_id", "verdict", "cell", "signature",
                                                                      "not_exercised")})
verdicts = st.one_of(st.none(), json_values, st.fixed_dictionaries(
    {}, optional={"verdict": json_values, "tasks": st.one_of(json_values, st.lists(tasks, max_size=3)),
                  "harness_errors": json_values}))
grades = st.one_of(json_values, st.fixed_dictionaries({}, optional={k: json_values for k in (
    "task_id", "verdict", "faults", "triggers", "checks", "runner", "workload")}))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=plans, verdict=verdicts, grade=grades)
def test_the_index_renders_every_wave_of_any_plan_and_verdict_shape(tmp_path_factory, plan, verdict, grade):
    root = tmp_path_factory.mktemp("fuzz")
    _wave(root, "w-good")
    d = root / "w-fuzz"
    d.mkdir()
    (d / "plan.json").write_bytes(orjson.dumps(plan))
    if verdict is not None:
        (d / "verdict.json").write_bytes(orjson.dumps(verdict))
    (d / "t000.grade.json").write_bytes(orjson.dumps(grade))
    rows = collect(root)
    assert {r["dir"] for r in rows} == {"w-good", "w-fuzz"}
    page = index_html(root, rows)
    assert "w-good" in page and "/w/w-fuzz/index.html" in page
