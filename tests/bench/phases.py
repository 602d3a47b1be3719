"""Where the store's and the driver's CPU goes within one wave (issue 19): a wave of 32 durable tasks at concurrency
16 (its own Ray and store, faults none), with the CPU of `weed` and of the driver sampled every 0.2 s and split at
the wave's own timeline marks: set-up (to `parts_ready`), the attempts (to the last `attempt_end`) and the end (the
store audit's read-back of every object, grading, the report, the teardown). The store's CPU in the attempts is set
beside the store's CPU per request of the same runs' traffic (the proxy log counts it).

`python -m tests.bench.phases` (part of `make bench`) prints its rows (BENCHMARKS.md quotes them under Harness cost).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.cpu import TICK

ROOT = Path(__file__).resolve().parents[2]


def _cpu(pid: int) -> tuple[float, int, bytes]:
    """(CPU-seconds, parent pid, command line) of one process; (0, 0, b"") once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return 0.0, 0, b""
    f = raw[raw.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / TICK, int(f[1]), cmd


def _weed_of(driver: int) -> float:
    """CPU-seconds of the store the driver started (its child `weed`)."""
    total = 0.0
    for d in os.listdir("/proc"):
        if d.isdigit():
            cpu, ppid, cmd = _cpu(int(d))
            if ppid == driver and cmd.split(b"\0")[0].endswith(b"/weed"):
                total += cpu
    return total


def bench_phases(rows: list, tasks: int = 32, concurrency: int = 16) -> None:
    root = Path(tempfile.mkdtemp(prefix="sfbench-phases-"))
    cfg = root / "w.yaml"
    cfg.write_text(f"tasks: {tasks}\nconcurrency: {concurrency}\nseed: 5\nrunner: durable\nfaults: none\n"
                   "workload: {steps: 10, think_ms: 50}\ndeadline_s: 300\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    series: list[tuple[float, float, float]] = []  # (wall, weed CPU, driver CPU); weed 0 once it is gone
    try:
        p = subprocess.Popen([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--results",
                              str(root / "r"), "--no-progress"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        while p.poll() is None:
            series.append((time.time(), _weed_of(p.pid), _cpu(p.pid)[0]))
            time.sleep(0.2)
        err = p.stderr.read()
        if p.returncode != 0:
            raise SystemExit(f"the wave: exit {p.returncode}: {err[-2000:]}")
        d = (root / "r" / "latest").resolve()
        events = [json.loads(x) for x in (d / "timeline.jsonl").read_text().splitlines()]
        requests = sum(1 for _ in (d / "proxy-requests.jsonl").open())
        audited = json.loads((d / "store-audit.json").read_text()).get("objects_checked", 0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    t0 = next(e["wall"] - e["t"] for e in events if e["event"] == "wave_start")
    ready = next(e["t"] for e in events if e["event"] == "parts_ready") + t0
    last_end = max(e["t"] for e in events if e["event"] == "attempt_end") + t0
    attempts = sum(1 for e in events if e["event"] == "attempt_end")

    def at(t: float, i: int) -> float:  # the latest sample at or before t (the store's last one once it is gone)
        xs = [s[i] for s in series if s[0] <= t and s[i] > 0]
        return xs[-1] if xs else 0.0

    weed_end = max(s[1] for s in series)
    weed = (at(ready, 1), at(last_end, 1) - at(ready, 1), weed_end - at(last_end, 1))
    drv_end = max(s[2] for s in series)
    drv = (at(ready, 2), at(last_end, 2) - at(ready, 2), drv_end - at(last_end, 2))
    rows.append((f"a wave of {tasks} durable tasks, concurrency {concurrency}: the store's (weed) CPU in set-up / "
                 f"the attempts / the end", f"{weed[0]:.2f} / {weed[1]:.2f} / {weed[2]:.2f} s",
                 f"{weed[1] / max(requests, 1) * 1000:.2f} ms per proxied request ({requests}); end: "
                 f"{weed[2] / max(audited, 1) * 1000:.2f} ms per object the audit read back ({audited})",
                 f"per attempt ({attempts}): {weed[1] / attempts * 1000:.0f} ms in the attempts, "
                 f"{weed[2] / attempts * 1000:.0f} ms at the end (the audit's read-back)"))
    rows.append(("the same wave: the driver's CPU in set-up / the attempts / the end",
                 f"{drv[0]:.2f} / {drv[1]:.2f} / {drv[2]:.2f} s",
                 f"per attempt: {drv[1] / attempts * 1000:.0f} ms in the attempts, "
                 f"{drv[2] / attempts * 1000:.0f} ms at the end", "end: the audit's client and hashing, grading, "
                 "the report, the teardown"))


def main() -> None:
    sys.path.insert(0, str(ROOT))
    rows: list = []
    bench_phases(rows)
    for r in rows:
        print(" | ".join(r))


if __name__ == "__main__":
    main()
