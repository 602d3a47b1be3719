"""Results people look at (issue 21), measured; writes the `Reports` section of BENCHMARKS.md.

- `index.html` and the task pages of a 1,000-task wave: the wave's files are made here in the shapes a real wave
  writes (a task started, killed by PK1 and resumed: 2 attempts; 14 checks each; one receipt each), then
  `cluster.htmlreport.write_html` renders them: wall time and the index's size.
- `sandfleet serve`'s index of 200 waves (each with its plan.json and verdict.json, 8 tasks): the wall time of
  one answer to `GET /` through the real server, p50 of 20.

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


def _wave(d: Path, n: int) -> dict:
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
        verdict = "fail" if i % 17 == 0 else "pass"
        grades.append({"task_id": tid, "verdict": verdict, "faults": ["PK1"], "seed": i, "runner": "durable",
                       "attempts": 2, "checks": {c: {"verdict": "pass" if c != "no_double_apply" or verdict == "pass"
                                                     else "fail", "detail": f"{c}: what was looked at, and why"}
                                                 for c in CHECKS}})
    (d / "timeline.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    (d / "faults.json").write_bytes(orjson.dumps(receipts))
    return {"wave_id": d.name, "verdict": "fail", "tasks": grades, "references": [],
            "wave_checks": {"no_leaked_sandbox": "pass", "positive_control": "pass"}}


def bench_html(rows: list, n: int = 1000) -> None:
    from cluster.htmlreport import write_html

    root = Path(tempfile.mkdtemp(prefix="sfbench-report-"))
    try:
        d = root / "w-bench"
        result = _wave(d, n)
        t = time.perf_counter()
        index = write_html(d, result)
        wall = time.perf_counter() - t
        size = index.stat().st_size
        pages = sum(p.stat().st_size for p in (d / "pages").iterdir())
        rows.append((f"index.html + {n} task pages of a {n}-task wave (2 attempts, 1 receipt, {len(CHECKS)} checks each)",
                     f"{wall:.2f} s", f"index {size / 2**20:.2f} MiB, pages {pages / 2**20:.1f} MiB",
                     "goal: under 2 s and under 5 MiB"))
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


def main() -> None:
    sys.path.insert(0, str(ROOT))
    rows: list = []
    bench_html(rows)
    bench_serve(rows)
    write_section(MARK, "Reports (issue 21)", "Produced by `python -m tests.bench.report` (part of `make bench`)",
                  "| measurement | wall | size | note |", rows)


if __name__ == "__main__":
    main()
