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

from tests.bench.cpu import Cgroup, proc_stat

ROOT = Path(__file__).resolve().parents[2]


def _weed_of(driver: int) -> float:
    """CPU-seconds of the store the driver started (its child `weed`)."""
    return sum(st["cpu"] for st in map(proc_stat, (int(d) for d in os.listdir("/proc") if d.isdigit()))
               if st is not None and st["ppid"] == driver and st["cmd"].split(" ")[0].endswith("/weed"))


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
            series.append((time.time(), _weed_of(p.pid), (proc_stat(p.pid) or {"cpu": 0.0})["cpu"]))
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


def _lifecycles(mode: str, n: int) -> None:
    """In the measuring cgroup: `n` process sandboxes (own netns with the three service listeners, bwrap, tini,
    cgroups, tmpfs) each running /bin/true to its end and removed, or (`plain`) /bin/true spawned `n` times."""
    import asyncio

    from fleet.sandbox import ProcessBackend, SandboxSpec

    async def run() -> None:
        be = ProcessBackend()
        d = Path(tempfile.mkdtemp(prefix="sfbench-sbcpu-"))
        socks = {18000 + k: "127.0.0.1:9" for k in range(3)}
        try:
            for i in range(n):
                if mode == "plain":
                    proc = await asyncio.create_subprocess_exec("/bin/true")
                    await proc.wait()
                    continue
                spec = SandboxSpec("w-bench-cpu", f"sb{i}", "t", 1, ["/bin/true"], {"PATH": "/usr/bin:/bin"},
                                   str(d / f"sb{i}"), relays=socks)
                os.makedirs(spec.state_dir)
                sb = await be.start(spec)
                await be.wait(sb)
                await be.remove(sb)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    asyncio.run(run())


def bench_sandbox_cpu(rows: list, n: int = 40) -> None:
    """The CPU of a process sandbox's whole life beside spawning the same command bare, each in a cpuacct cgroup
    (the interpreter's start is in both and cancels out)."""
    got = {}
    for mode in ("plain", "sandbox", "plain", "sandbox"):
        cg = Cgroup("sbcpu")
        try:
            p, _ = cg.run([sys.executable, "-m", "tests.bench.phases", "--lifecycles", mode, str(n)], cwd=ROOT,
                          timeout=300)
            if p.returncode != 0:
                raise SystemExit(f"sandbox lifecycles ({mode}): exit {p.returncode}: {p.stderr[-2000:]}")
            got.setdefault(mode, []).append(cg.usage_s())
        finally:
            cg.remove()
    plain, sandbox = min(got["plain"]), min(got["sandbox"])
    rows.append((f"a process sandbox's life (own netns with 3 service listeners, bwrap, tini, cgroups, tmpfs; "
                 f"/bin/true to its end, removed), n={n}, CPU (the better of two runs)",
                 f"{sandbox / n * 1000:.1f} ms each", f"/bin/true spawned bare: {plain / n * 1000:.1f} ms each (both with 1/{n} of the interpreter start)",
                 f"the sandbox's own CPU: {(sandbox - plain) / n * 1000:.1f} ms per attempt"))


def main() -> None:
    sys.path.insert(0, str(ROOT))
    if sys.argv[1:2] == ["--lifecycles"]:
        _lifecycles(sys.argv[2], int(sys.argv[3]))
        return
    rows: list = []
    bench_sandbox_cpu(rows)
    bench_phases(rows)
    for r in rows:
        print(" | ".join(r))


if __name__ == "__main__":
    main()
