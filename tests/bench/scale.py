"""Scale benchmarks (issue 10), side by side in one run; writes the `Scale` section of BENCHMARKS.md.

- Sandbox start per backend: process vs docker, interleaved, until `start()` returns and until the runner's
  command runs, and the kill + removal.
- The sweep actor's pass over 500 live sandboxes (cgroups with a process each, marked) and a ledger of
  10,000 lease rows (the real ledger actor on a private Ray).
- Waves of short tasks on a simulated 4-node cluster (`--nodes 4`) at rising concurrency: wall time, tasks
  per second, CPU per task (everything: harness and runners), memory per running sandbox (sampled from the
  sandboxes' memory cgroups), and what breaks first.

`python -m tests.bench.scale [--big]` (--big adds the 1,000-task wave at concurrency 200).
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- scale -->"
HAND = "<!-- scale: by hand (kept when make bench rewrites the table above) -->"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def bench_backends(rows: list, n: int = 20) -> None:
    from fleet.docker_backend import DockerBackend
    from fleet.sandbox import ProcessBackend, SandboxSpec

    async def main():
        backends = {"process": ProcessBackend(), "docker": DockerBackend()}
        d = Path(tempfile.mkdtemp(prefix="sfbench-be-"))
        socks = {18000 + k: "127.0.0.1:9" for k in range(3)}
        got = {b: {"start": [], "ready": [], "kill": []} for b in backends}
        got["engine"] = []
        image = backends["docker"].image(SandboxSpec("", "", "", 0, [], {}, "", backend="docker"))  # built first
        engine = backends["docker"].docker
        for i in range(n):
            # the engine's own floor: a bare container of the same image (network none, nothing else) start()ed
            bare = await asyncio.to_thread(engine.containers.create, image, command=["/bin/sh", "-c", "sleep 30"],
                                           network_mode="none", labels={"sandfleet.bench": "1"})
            t = time.perf_counter()
            await asyncio.to_thread(bare.start)
            got["engine"].append((time.perf_counter() - t) * 1000)
            await asyncio.to_thread(bare.remove, force=True)
            for name, be in backends.items():
                spec = SandboxSpec("w-bench", f"{name}{i}", "t", 1,
                                   ["/bin/sh", "-c", 'echo up > "$SANDFLEET_CHECKPOINT"; exec sleep 30'],
                                   {"PATH": "/usr/bin:/bin"}, str(d / f"{name}{i}"), relays=socks, backend=name)
                os.makedirs(spec.state_dir)
                t = time.perf_counter()
                sb = await be.start(spec)
                got[name]["start"].append((time.perf_counter() - t) * 1000)
                while not (os.path.exists(spec.checkpoint_path) and os.path.getsize(spec.checkpoint_path)) \
                        and time.perf_counter() - t < 20:
                    await asyncio.sleep(0.0005)
                got[name]["ready"].append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                await be.kill(sb, 0.0, "bench")
                await be.wait(sb)
                await be.remove(sb)
                got[name]["kill"].append((time.perf_counter() - t) * 1000)
        shutil.rmtree(d, ignore_errors=True)
        return got

    got = asyncio.run(main())
    p, k = got["process"], got["docker"]
    for what, label, goal in (("start", "start() returns", ""), ("ready", "until the command runs",
                                                                 " (goals: process <= 30 ms, docker <= 200 ms)"),
                              ("kill", "SIGKILL until removed", "")):
        rows.append((f"sandbox {label}, n={n} each, interleaved: p50 / p95 (ms){goal}",
                     f"process {statistics.median(p[what]):.1f} / {pct(p[what], 95):.1f}",
                     f"docker {statistics.median(k[what]):.1f} / {pct(k[what], 95):.1f}",
                     f"docker x{statistics.median(k[what]) / statistics.median(p[what]):.1f} of process (p50)"))
    e = got["engine"]
    rows.append((f"the engine's floor: a bare container's start() (same image, network none, no limits, no mounts), "
                 f"n={n}: p50 / p95 (ms)", f"{statistics.median(e):.1f} / {pct(e, 95):.1f}",
                 f"docker sandbox until the command runs: {statistics.median(k['ready']):.1f}",
                 f"sandbox x{statistics.median(k['ready']) / statistics.median(e):.2f} of the bare start (p50)"))


def bench_sweep(rows: list, live: int = 500, ledger_rows: int = 10000) -> None:
    """The sweep actor's pass: `live` marked sandboxes (a cgroup and a process each, half under an active lease,
    half leaked) and `ledger_rows` lease rows of the wave in the real ledger actor."""
    from cluster.raycluster import RaySession
    from fleet import cgroups
    from fleet.ledger import start_ledger_actor
    from fleet.sweeper import WaveSweep

    wave = "w-20261201T000000-s9-beec"
    session = RaySession("local")
    ray = session.start()
    tmp = Path(tempfile.mkdtemp(prefix="sfbench-sweep-"))
    procs, cgs = [], []
    try:
        ledger = start_ledger_actor(str(tmp / "ledger.db"))
        t = time.perf_counter()
        for i in range(ledger_rows - live // 2):  # ended leases of earlier attempts
            lease = ray.get(ledger.acquire.remote(f"{wave}/t{i:05d}", "node-1", f"t{i:05d}-a1", 60.0))
            ray.get(ledger.release.remote(lease.task_id, lease.fence, None, "exit 0"))
        for i in range(live // 2):  # the live ones under an active lease
            ray.get(ledger.acquire.remote(f"{wave}/l{i:05d}", "node-1", f"l{i:05d}-a1", 600.0))
        fill_s = time.perf_counter() - t
        for i in range(live):
            sid = f"l{i:05d}-a1"  # the first half has a lease, the second half is leaked
            cg = cgroups.SandboxCgroup(wave, sid)
            cg.create(64 * 1024 * 1024, 16)
            cgs.append(cg)
            p = subprocess.Popen(["sh", "-c", "read -r go; exec sleep 600"], stdin=subprocess.PIPE,
                                 env={"PATH": "/usr/bin:/bin", "SANDFLEET_SANDBOX": f"{wave}/{sid}"})
            for f in cg.procs_files():
                Path(f).write_text(str(p.pid))
            p.stdin.write(b"go\n")
            p.stdin.close()
            procs.append(p)

        async def passes():
            ws = WaveSweep(wave, ledger, settle_s=3600)
            return [(await ws.scan(reap=False)) for _ in range(5)]

        reps = asyncio.run(passes())
        ms = [r["scan_ms"] for r in reps]
        assert len(reps[-1]["leaked"]) == live - live // 2, len(reps[-1]["leaked"])
        rows.append((f"sweep actor pass: {live} live sandboxes ({live // 2} leaked), {ledger_rows:,} ledger rows, "
                     "n=5: p50 / max (ms) (goal < 1000 ms)", f"{statistics.median(ms):.0f} / {max(ms):.0f}", "",
                     f"lists every process's environment, the cgroups and mounts, and the wave's lease rows through "
                     f"the ledger actor; found {len(reps[-1]['leaked'])} leaked (ledger filled in {fill_s:.1f} s)"))
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for cg in cgs:
            cg.kill_all()
            cg.remove()
        for d in cgroups.wave_dirs(wave):
            try:
                d.rmdir()
            except OSError:
                pass
        session.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _busy_s() -> float:
    """CPU seconds the whole machine has been busy (user+nice+system+irq+softirq+steal, /proc/stat)."""
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / os.sysconf("SC_CLK_TCK")


def _sample_memory(stop: threading.Event, out: list) -> None:
    """Every 0.5 s: (sandboxes running, the sum of their memory.usage_in_bytes)."""
    from fleet import cgroups

    base = cgroups.ROOT / "memory" / cgroups.own_path("memory").lstrip("/") / cgroups.MARK
    while not stop.wait(0.5):
        used, n = 0, 0
        for f in base.glob("*/*/memory.usage_in_bytes"):
            try:
                procs = (f.parent / "cgroup.procs").read_text().split()
                if procs:
                    used += int(f.read_text())
                    n += 1
            except (OSError, ValueError):
                continue
        if n:
            out.append((n, used))


def bench_waves(rows: list, levels: list[tuple[int, int]]) -> None:
    d = Path(tempfile.mkdtemp(prefix="sfbench-scale-"))
    cfg = d / "wave.yaml"
    cfg.write_text("seed: 5\nfaults: none\nworkload: {steps: 2, think_ms: 0}\ndeadline_s: 900\n"
                   "sandbox: {memory_mb: 256, cpu_cores: 0.5}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    try:
        for tasks, conc in levels:
            mem: list = []
            stop = threading.Event()
            th = threading.Thread(target=_sample_memory, args=(stop, mem), daemon=True)
            before = _busy_s()
            t = time.perf_counter()
            th.start()
            r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--nodes", "4",
                                "--tasks", str(tasks), "--concurrency", str(conc), "--results", str(d / "r"),
                                "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600,
                               start_new_session=True)
            wall = time.perf_counter() - t
            stop.set()
            th.join()
            cpu = _busy_s() - before  # the machine runs nothing else: all of it is the wave's
            wave = (d / "r" / "latest").resolve()
            tl = [orjson.loads(x) for x in (wave / "timeline.jsonl").read_bytes().splitlines()]
            starts = [e for e in tl if e["event"] == "attempt_start" and not e["task"].startswith("ref-")]
            grades = [orjson.loads(p.read_bytes()) for p in wave.glob("t*.grade.json")]
            passed = sum(1 for g in grades if g["verdict"] == "pass")
            refs = sum(1 for e in tl if e["event"] == "attempt_start" and e["task"].startswith("ref-"))
            span = (max(e["wall"] for e in starts) - min(e["wall"] for e in starts)) if len(starts) > 1 else 0
            end = next((e for e in tl if e["event"] == "wave_end"), {})
            broke = end.get("harness_error") or ("" if passed == tasks else
                                                 f"{tasks - passed} task(s) not pass: " +
                                                 ", ".join(sorted({g['signature'] or g['verdict'] for g in grades
                                                                   if g['verdict'] != 'pass'}))[:200])
            peak = max(mem, key=lambda x: x[1]) if mem else (1, 0)  # the moment of the most sandbox memory
            rows.append((f"wave: {tasks} tasks x 2 steps, concurrency {conc}, 4 simulated nodes (3 sandbox "
                         f"nodes), faults none", f"{wall:.0f} s wall, {passed}/{tasks} pass",
                         f"{len(starts) / span:.1f} sandboxes launched/s" if span else "",
                         f"machine CPU {cpu / max(1, tasks + refs):.2f} s per run ({tasks} tasks + {refs} reference "
                         f"runs; harness and runners); sandbox memory peak {peak[1] / 2**20:.0f} MiB over {peak[0]} "
                         f"running = {peak[1] / max(1, peak[0]) / 2**20:.1f} MiB each (cgroup usage: shared "
                         f"interpreter pages are charged once); "
                         f"exit {r.returncode}" + (f"; first to break: {broke}" if broke else "")))
            print(rows[-1], flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    sys.path.insert(0, str(ROOT))
    rows: list = []
    bench_backends(rows)
    bench_sweep(rows)
    levels = [(200, 50), (200, 100), (200, 200)] + ([(1000, 200)] if "--big" in sys.argv else [])
    bench_waves(rows, levels)
    table = ["| measurement | value | beside | ratio / note |", "|---|---|---|---|"]
    table += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    section = (f"{MARK}\n## Scale (issue 10)\n\nProduced by `python -m tests.bench.scale` (part of `make bench`) on "
               f"this machine kind (2 cores). Last run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
               + "\n".join(table) + "\n")
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    after = text.split(MARK, 1)[1] if MARK in text else ""
    kept = HAND + after.split(HAND, 1)[1] if HAND in after else ""  # runs by hand and their reading stay
    text = text.split(MARK)[0].rstrip() + "\n\n" + section + ("\n" + kept if kept else "")
    path.write_text(text)
    print(section)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    main()
