"""Results people look at (issue 21), measured; writes the `Reports` section of BENCHMARKS.md.

- `index.html` and the task pages of a 1,000- and a 10,000-task wave (issue 45): the wave's files are made here in
  the shapes a real wave writes (a task started, killed by PK1 and resumed: 2 attempts; 14 checks each; one receipt
  each; one task in 17 fails), then `cluster.htmlreport.write_html` renders them: wall time, the sizes of the index
  and of every page; the 10,000-task index loaded in headless Chromium as the browser test launches it.
- `sandfleet serve`'s index of 200 waves (each with its plan.json and verdict.json, 8 tasks): the wall time of
  one answer to `GET /` through the real server, p50 of 20.
- `sandfleet serve` under 1,000 idle clients and 12 that never read a 200 MB file (issue 42): connect time, the
  wall time of one `GET /` beside them, the server's RSS.

`python -m tests.bench.report` (part of `make bench`).
"""
from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import orjson

from tests.bench import write_section

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- report -->"
CHECKS = ["completed", "artifact_matches_reference", "no_double_apply", "no_torn_apply", "no_model_recall",
          "liveness", "retry_loop", "diagnosable", "no_leaked_upload", "no_foreign_writes", "fenced_writes_rejected",
          "no_outliving_process", "attempt_budget", "no_lost_progress"]


def _wave(d: Path, n: int, fail_every: int = 17, log_bytes: int = 0) -> dict:
    """The files of an `n`-task wave as a real one writes them, one task in `fail_every` failing (with `log_bytes`
    of runner log tails in its evidence), and the wave's result as the grader returns it."""
    d.mkdir(parents=True)
    events, receipts, grades = [{"t": 0.0, "event": "wave_start"}], [], []
    for i in range(n):
        tid = f"t{i:04d}"
        t0 = i * 0.05
        events += [{"t": t0, "event": "task_start", "task": tid},
                   {"t": t0 + 0.01, "event": "attempt_start", "task": tid, "attempt": 1, "node": "node-0"},
                   {"t": t0 + 0.5, "event": "fault_inject", "task": tid, "instance": f"{tid}-PK1", "applied": True},
                   {"t": t0 + 0.5, "event": "attempt_end", "task": tid, "attempt": 1, "exit_code": -9,
                    "cause": "killed: PK1"},
                   {"t": t0 + 0.6, "event": "attempt_start", "task": tid, "attempt": 2, "node": "node-0"},
                   {"t": t0 + 1.6, "event": "attempt_end", "task": tid, "attempt": 2, "exit_code": 0, "cause": "exit 0"},
                   {"t": t0 + 1.6, "event": "task_end", "task": tid}]
        receipts.append({"instance": f"{tid}-PK1", "task_id": tid, "status": "applied",
                         "detail": "SIGKILL after the runner's 3rd model answer"})
        verdict = "fail" if i % fail_every == 0 else "pass"
        if verdict != "pass" and log_bytes:
            (d / "evidence" / tid).mkdir(parents=True)
            line = f"==> {tid}-a2 step 7: model answered, applying the patch to repo/src/app.py\n"
            (d / "evidence" / tid / "runner-logs.txt").write_text(line * (log_bytes // len(line)))
        grades.append({"task_id": tid, "verdict": verdict, "faults": ["PK1"], "seed": i, "runner": "durable",
                       "attempts": 2, "checks": {c: {"verdict": "pass" if c != "no_double_apply" or verdict == "pass"
                                                     else "fail", "detail": f"{c}: what was looked at, and why"}
                                                 for c in CHECKS}})
    (d / "timeline.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    (d / "faults.json").write_bytes(orjson.dumps(receipts))
    return {"wave_id": d.name, "verdict": "fail", "tasks": grades, "references": [],
            "wave_checks": {"no_leaked_sandbox": "pass", "positive_control": "pass"}}


def _browser_load(index: Path, work: Path) -> tuple[bool, float, str]:
    """`index` loaded by headless Chromium exactly as tests/integration/test_report_browser.py launches it (its own
    network and pid namespaces, `--dump-dom`): whether the DOM came back with the timeline and the tasks table, the
    wall time, and why not when it did not."""
    import subprocess

    argv = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "chromium", "--headless",
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-extensions", "--hide-scrollbars",
            f"--user-data-dir={work / 'profile'}", "--window-size=1280,1600", "--dump-dom", f"file://{index}"]
    t = time.perf_counter()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False, time.perf_counter() - t, "no DOM within 300 s"
    wall = time.perf_counter() - t
    ok = p.returncode == 0 and "<svg" in p.stdout and 'id="tasks"' in p.stdout
    return ok, wall, "" if ok else f"exit {p.returncode}: {p.stderr.strip()[-200:]}"


BEFORE_10K = ("before (96f04df, this bench, a lane and a page per task): 90.26 s, index 6.53 MiB + 10,000 pages "
              "31.68 MiB = 38.21 MiB; Chromium 3.19 s")


def bench_html(rows: list, n: int = 1000, browser: bool = False, fail_every: int = 17, log_bytes: int = 0,
               note: str = "") -> None:
    """The report of an `n`-task wave (`_wave`): wall time of `write_html`, the size of index.html and of every
    page; with `browser`, the index loaded in headless Chromium (a row saying why not when chromium is not
    installed)."""
    from cluster.htmlreport import write_html

    root = Path(tempfile.mkdtemp(prefix="sfbench-report-"))
    try:
        d = root / "w-bench"
        result = _wave(d, n, fail_every, log_bytes)
        bad = sum(1 for g in result["tasks"] if g["verdict"] != "pass")
        t = time.perf_counter()
        index = write_html(d, result)
        wall = time.perf_counter() - t
        size = index.stat().st_size
        pages = [p for p in (d / "pages").rglob("*") if p.is_file()]
        pages_size = sum(p.stat().st_size for p in pages)
        total = (size + pages_size) / 2**20
        logs = f", {log_bytes // 1024} KiB of log tails each" if log_bytes else ""
        rows.append((f"index.html + task pages of a {n:,}-task wave ({bad:,} not passed{logs}; 2 attempts, 1 receipt, "
                     f"{len(CHECKS)} checks each)", f"{wall:.2f} s",
                     f"index {size / 2**20:.2f} MiB + {len(pages):,} pages {pages_size / 2**20:.2f} MiB = "
                     f"{total:.2f} MiB", note or "goal: under 10 MiB at 10,000 tasks (issue 45)"))
        if not browser:
            return
        if shutil.which("chromium") is None or shutil.which("unshare") is None:
            rows.append((f"the {n:,}-task index.html in headless Chromium (`--dump-dom`)", "-", "-",
                         "skipped: chromium (or unshare) is not installed"))
            return
        ok, took, why = _browser_load(index, root)
        rows.append((f"the {n:,}-task index.html in headless Chromium (`--dump-dom`, as the browser test runs it)",
                     f"{took:.2f} s", f"index {size / 2**20:.2f} MiB",
                     "loaded: the timeline and the tasks table in the DOM" if ok else f"NOT loaded: {why}"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_serve(rows: list, waves: int = 200) -> None:
    from cluster.serve import make_server

    root = Path(tempfile.mkdtemp(prefix="sfbench-serve-"))
    try:
        for i in range(waves):
            d = root / f"w-2026120{i % 9}T{i:06d}-s{i}-bench"
            d.mkdir()
            tasks = [{"task_id": f"t{j:03d}", "verdict": "fail" if (i + j) % 11 == 0 else "pass", "signature": None,
                      "cell": f"durable × patch-repo × {'PK1' if j % 2 else 'ST1'}", "not_exercised": False}
                     for j in range(8)]
            (d / "plan.json").write_bytes(orjson.dumps({"wave_id": d.name, "created_at": 1.8e9 + i,
                                                        "runner": {"name": "durable"}, "config": {"faults": ["PK1"]},
                                                        "tasks": [], "manifest": {"runner": {"code_digest": "x"}}}))
            (d / "verdict.json").write_bytes(orjson.dumps({"wave_id": d.name, "verdict": "pass", "tasks": tasks,
                                                           "harness_errors": []}))
        srv = make_server(root, 0)
        th = threading.Thread(target=srv.serve_forever, daemon=True)
        th.start()
        url = f"http://127.0.0.1:{srv.server_address[1]}/"
        lat = []
        try:
            for _ in range(20):
                t = time.perf_counter()
                body = urllib.request.urlopen(url, timeout=30).read()
                lat.append(time.perf_counter() - t)
        finally:
            srv.shutdown()
            srv.server_close()
        rows.append((f"`sandfleet serve`: GET / over {waves} waves (8 tasks each), p50 of 20",
                     f"{statistics.median(lat) * 1000:.0f} ms", f"{len(body) / 1024:.0f} KiB", "goal: under 200 ms"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


SERVE_CHILD = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from cluster.serve import make_server
srv = make_server(Path(sys.argv[1]), 0)
print(srv.server_address[1], flush=True)
srv.serve_forever(poll_interval=0.2)
"""


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def bench_serve_bounds(rows: list, idle: int = 1000, slow: int = 12, big_mb: int = 200) -> None:
    """Issue 42's exhaustion of `serve`, measured against the real server in a process of its own: `idle` clients
    that connect and send nothing, then one GET / (its wall time, and how long the idle ones took to connect);
    `slow` clients that ask for a `big_mb` MB file and never read (the server's RSS)."""
    import socket
    import subprocess

    root = Path(tempfile.mkdtemp(prefix="sfbench-serve-"))
    proc = None
    socks: list = []
    try:
        d = root / "w-20261206T000000-s1-bench"
        (d / "artifacts" / "t000" / "files").mkdir(parents=True)
        (d / "plan.json").write_bytes(orjson.dumps({"wave_id": d.name, "created_at": 1.8e9, "tasks": []}))
        with open(d / "artifacts" / "t000" / "files" / "big.log", "wb") as f:
            f.truncate(big_mb * 10**6)
        proc = subprocess.Popen([sys.executable, "-c", SERVE_CHILD, str(root), str(ROOT)], stdout=subprocess.PIPE,
                                text=True)
        port = int(proc.stdout.readline())
        rss0 = _rss_mib(proc.pid)
        t = time.perf_counter()
        for _ in range(idle):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        connect = time.perf_counter() - t
        t = time.perf_counter()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60).read()
        answer = time.perf_counter() - t
        assert d.name.encode() in body
        rss_idle = _rss_mib(proc.pid)
        for s in socks:
            s.close()
        socks = []
        time.sleep(0.5)
        for _ in range(slow):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(f"GET /w/{d.name}/artifacts/t000/files/big.log HTTP/1.0\r\n\r\n".encode())
            socks.append(s)
        time.sleep(2)
        rss_slow = _rss_mib(proc.pid)
        t = time.perf_counter()
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60).read()
        answer_slow = time.perf_counter() - t
        rows.append((f"`sandfleet serve` under {idle:,} idle clients (connect, send nothing): all connected, then "
                     "one GET /", f"{connect:.2f} s to connect all; GET / {answer * 1000:.0f} ms",
                     f"RSS {rss0:.0f} -> {rss_idle:.0f} MiB", "before (c8d1f5a^, the same bench): 159.7 s to connect, RSS 51 MiB (backlog 5, "
                     "a thread per idle client, no timeout); now backlog 1,024, 128 connections, idle ones dropped"))
        rows.append((f"`sandfleet serve`: {slow} clients ask for a {big_mb} MB file and never read",
                     f"GET / beside them {answer_slow * 1000:.0f} ms", f"RSS {rss_slow:.0f} MiB",
                     "before (c8d1f5a^, the same bench): RSS 2,325 MiB (each file read whole); now sendfile, a 10 s send timeout"))
    finally:
        for s in socks:
            s.close()
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    sys.path.insert(0, str(ROOT))
    rows: list = []
    bench_html(rows, 1000, note="a lane and a page per task, byte for byte as before; before (96f04df, this bench): "
               "2.22 s (each page scanned the whole timeline)")
    bench_html(rows, 10_000, browser=True, note=f"goal: under 10 MiB (issue 45); {BEFORE_10K}")
    bench_html(rows, 10_000, fail_every=1, log_bytes=4096,  # the worst case: every task failed, with its log tails
               note="every task failed: at most 1,000 lanes and 6 MiB of pages, the worst first, the rest counted")
    bench_serve(rows)
    bench_serve_bounds(rows)
    write_section(MARK, "Reports (issue 21)", "Produced by `python -m tests.bench.report` (part of `make bench`)",
                  "| measurement | wall | size | note |", rows)


if __name__ == "__main__":
    main()
