"""A wave's report as a person sees it: Debian's headless Chromium (no selenium) loads `index.html` of a real wave,
its DOM after the scripts ran is checked against the wave's timeline file (a lane per task, a bar per attempt, a
mark per fault), the task page is opened through its link, and both are screenshotted at a fixed size. Chromium
runs in a network namespace of its own with nothing in it but loopback (`unshare --net`), so it cannot reach
anything, and in a pid namespace that ends with it (`--kill-child`), so none of its processes outlives the test."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.integration
SIZE = (1280, 1600)


def _chromium() -> str:
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("chromium is missing: `make test` installs it (apt: chromium)")
    return exe


def _run(url: str, work: Path, *what: str) -> subprocess.CompletedProcess:
    argv = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", _chromium(), "--headless",
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-extensions", "--hide-scrollbars",
            f"--user-data-dir={work / 'profile'}", f"--window-size={SIZE[0]},{SIZE[1]}", *what, url]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _png_size(p: Path) -> tuple[int, int]:
    head = p.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", head
    return struct.unpack(">II", head[16:24])


def test_the_wave_report_loads_in_a_browser_and_shows_every_lane_attempt_and_fault(run_wave, tmp_path):
    result, d = run_wave(runner="naive", faults=["PK1"], tasks=2, concurrency=2, seed=8,
                         workload={"steps": 5, "think_ms": 20}, deadline_s=60,
                         fault_timing={"PK1": {"after_model_calls": [2, 3]}})
    events = [orjson.loads(x) for x in (d / "timeline.jsonl").read_bytes().splitlines()]
    dom = _run(f"file://{d / 'index.html'}", tmp_path, "--dump-dom")
    assert dom.returncode == 0 and "<svg" in dom.stdout, dom.stderr[-2000:]
    page = dom.stdout
    lanes = set(re.findall(r'data-lane="([^"]+)"', page))
    assert lanes == {e["task"] for e in events if e.get("task")}, lanes
    assert page.count('class="attempt"') == sum(1 for e in events if e["event"] == "attempt_end")
    assert page.count('class="fault"') == sum(1 for e in events if e["event"] == "fault_inject")
    assert result["wave_id"] in page and "Fault" in page
    link = re.search(r'href="(pages/t000\.html)"', page)
    assert link, "no link to the task's page"
    task = _run(f"file://{d / link.group(1)}", tmp_path, "--dump-dom")
    assert task.returncode == 0 and "t000" in task.stdout and 'id="attempts"' in task.stdout, task.stderr[-2000:]
    ends = [e for e in events if e["event"] == "attempt_end" and e.get("task") == "t000"]
    assert task.stdout.count("<tr>") >= len(ends)  # a row per attempt (and the checks' and receipts' rows)
    for name, url in (("index", d / "index.html"), ("t000", d / link.group(1))):
        shot = tmp_path / f"{name}.png"
        r = _run(f"file://{url}", tmp_path, f"--screenshot={shot}")
        assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
        assert _png_size(shot) == SIZE and shot.stat().st_size > 20_000, (_png_size(shot), shot.stat().st_size)
        shutil.copy(shot, d / f"screenshot-{name}.png")  # kept beside the report (the note describes one)


EVIL = ("<!doctype html><html><body><p>hello</p><script>var d=document.createElement('div');d.id='pwned';"
        "document.body.appendChild(d);</script></body></html>")


def test_a_runners_evil_html_served_through_serve_runs_no_script(run_wave, tmp_path):
    """Issue 42: `serve` sent a runner's artifact `evil.html` as text/html from the origin of every wave's page. The
    runner writes it into its repo (captured as its artifact); `sandfleet serve` and Chromium run together in a
    network namespace of their own; the DOM after load has no element the script adds. Control: the same file
    opened directly runs the script (the test would see an unsafe serve)."""
    runner = {"name": "evil", "command": ["/bin/sh", "-c", 'mkdir -p repo && printf "%s" "$EVIL" > repo/evil.html'],
              "env": {"EVIL": EVIL}}
    _, d = run_wave(runner=runner, faults=[], tasks=1, concurrency=1, seed=3, deadline_s=60,
                    workload={"steps": 2, "think_ms": 0})
    evil = d / "artifacts" / "t000" / "files" / "evil.html"
    assert evil.read_text() == EVIL, "the runner's file was not captured as its artifact"
    control = _run(f"file://{evil}", tmp_path, "--dump-dom")
    assert 'id="pwned"' in control.stdout, control.stderr[-2000:]  # the script does run when nothing stops it

    url = f"http://127.0.0.1:8642/w/{d.name}/artifacts/t000/files/evil.html"
    root = Path(__file__).resolve().parents[2]
    script = (f"ip link set lo up && cd {root} && {sys.executable} -m cluster.cli serve {d.parent} --port 8642 "
              f">{tmp_path / 'serve.out'} 2>&1 & for i in $(seq 1 300); do grep -q serving {tmp_path / 'serve.out'} "
              "&& break; sleep 0.1; done; exec \"$@\"")
    argv = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script, "sh",
            _chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
            f"--user-data-dir={tmp_path / 'profile2'}", "--dump-dom", url]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    served = (tmp_path / "serve.out").read_text()
    assert p.returncode == 0 and "serving" in served, (p.stderr[-2000:], served)
    assert "pwned" in p.stdout and "hello" in p.stdout, p.stdout[:2000]  # the file arrived (as text)
    assert 'id="pwned"' not in p.stdout, p.stdout[:2000]
