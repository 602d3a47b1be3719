"""The harness's own cost (issue 19), side by side in one run; writes the `Harness cost` section of BENCHMARKS.md.

Every measured thing runs as a child in a cpuacct cgroup of its own (`sfbench-cost-*`, removed after), so its CPU is
the whole tree's: Ray's processes, the store, the actors, the sandboxes. Rows:

- Ray's start, two ways in one run: `ray.init(address="local", include_dashboard=False)` (what a wave did until
  issue 19) beside sandfleet's one-node `RaySession` (no autoscaler monitor, no log monitor): wall to the first task,
  CPU-seconds of the tree over the start, 5 s idle and the stop, processes started.
- A wave of N durable tasks (`sandfleet wave run`, its own Ray and store, faults none) at two sizes: its wall, its
  phases from its timeline (set-up: process start to `parts_ready`; tasks; end: last attempt to `wave_end`; after:
  grading, report, exit), its CPU split by part (each harness process's own CPU, sampled every 0.25 s; the
  sandboxes are the rest of the tree's CPU: a process in a sandbox's cpu cgroup is never counted as harness), and
  the marginal CPU per extra attempt (the slope between the two sizes), all in and without the sandboxes.

- The fixed cost of a short wave from nothing beside the same wave on a fleet already up (`sandfleet up`).
- The product's wall beside the bare `xargs -P 16` loop of the same runner runs (tests/bench/bare.py).

`python -m tests.bench.cost` (part of `make bench`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench import write_section
from tests.bench.bare import bench_bare
from tests.bench.cpu import CPUACCT, Cgroup, part_cpu

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- cost -->"

RAY_PLAIN = """
import json, os, secrets, sys, tempfile, time
os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
                  RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
t0 = time.perf_counter()
import ray
tmp = tempfile.mkdtemp(prefix="sfbc-", dir="/tmp")
ray.init(address="local", _temp_dir=tmp, include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=2,
         log_to_driver=False, configure_logging=False)
"""
RAY_OURS = """
import json, os, sys, time
sys.path.insert(0, %r)
t0 = time.perf_counter()
from cluster.raysession import RaySession
s = RaySession(num_cpus=2)
ray = s.start()
"""
RAY_AFTER = """
ray.get(ray.remote(lambda: 1).remote())
t1 = time.perf_counter()
procs = len(open("/sys/fs/cgroup/cpuacct/" + sys.argv[1] + "/cgroup.procs").read().split())
time.sleep(5)
t2 = time.perf_counter()
%s
print(json.dumps({"start_s": t1 - t0, "stop_s": time.perf_counter() - t2, "procs": procs}))
"""


def bench_ray(rows: list) -> None:
    out = {}
    for label, code in (("ray.init(address='local', include_dashboard=False)",
                         RAY_PLAIN + RAY_AFTER % "ray.shutdown()\nimport shutil; shutil.rmtree(tmp, True)"),
                        ("sandfleet RaySession (no autoscaler monitor, no log monitor)",
                         RAY_OURS % str(ROOT) + RAY_AFTER % "s.stop()")):
        cg = Cgroup("ray")
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
            p, _ = cg.run([sys.executable, "-c", code, cg.name], env=env, timeout=300)
            if p.returncode != 0:
                raise SystemExit(f"{label}: {p.stderr[-2000:]}")
            out[label] = dict(json.loads(p.stdout.strip().splitlines()[-1]), cpu_s=cg.usage_s())
        finally:
            cg.remove()
    (a, ra), (b, rb) = out.items()
    rows.append(("Ray start: wall to the first task", f"{ra['start_s']:.2f} s", f"{rb['start_s']:.2f} s",
                 f"x{rb['start_s'] / ra['start_s']:.2f}"))
    rows.append(("Ray: CPU of the whole tree over start + 5 s idle + stop", f"{ra['cpu_s']:.2f} s",
                 f"{rb['cpu_s']:.2f} s", f"x{rb['cpu_s'] / ra['cpu_s']:.2f}"))
    rows.append(("Ray: processes once started (driver included)", str(ra["procs"]), str(rb["procs"]), ""))
    rows.append(("Ray stop", f"{ra['stop_s']:.2f} s", f"{rb['stop_s']:.2f} s", ""))


def _wave(tasks: int, root: Path) -> dict:
    cfg = root / f"w{tasks}.yaml"
    cfg.write_text(f"name: cost{tasks}\ntasks: {tasks}\nconcurrency: 8\nseed: 5\nrunner: durable\nfaults: none\n"
                   "workload: {steps: 10, think_ms: 50}\ndeadline_s: 300\n")
    cg = Cgroup(f"w{tasks}")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        t = time.perf_counter()
        p, seen = cg.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--results",
                          str(root / "r"), "--no-progress"], sample=True, cwd=ROOT, env=env, timeout=900)
        wall = time.perf_counter() - t
        if p.returncode != 0:
            raise SystemExit(f"wave of {tasks}: exit {p.returncode}: {p.stderr[-2000:]}")
        total = cg.usage_s()
    finally:
        cg.remove()
    d = sorted((root / "r").glob("w-*"))[-1]
    events = [json.loads(x) for x in (d / "timeline.jsonl").read_text().splitlines()]
    at = {e["event"]: e["t"] for e in events}
    ends = [e["t"] for e in events if e["event"] == "attempt_end"]
    start_wall = next(e["wall"] for e in events if e["event"] == "wave_start") - next(
        e["t"] for e in events if e["event"] == "wave_start")
    parts = part_cpu(seen, bool(os.environ.get("SFBENCH_DEBUG")))
    # the sandboxes: the tree's CPU less every harness process seen (a runner's last moments escape a sampler)
    sandboxes = total - sum(parts.values())
    attempts = len(ends)
    shutil_rm(d)
    return {"tasks": tasks, "attempts": attempts, "wall": wall, "cpu": total, "sandboxes": sandboxes,
            "parts": parts, "setup": at["parts_ready"], "run": max(ends) - at["parts_ready"],
            "end": at["wave_end"] - max(ends), "start_wall": start_wall}


def shutil_rm(d: Path) -> None:
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def bench_waves(rows: list) -> dict:
    """Appends the rows; returns the marginal harness CPU per extra attempt by part (ms)."""
    root = Path(tempfile.mkdtemp(prefix="sfbench-cost-"))
    try:
        small, big = _wave(8, root), _wave(24, root)
    finally:
        shutil_rm(root)
    for w in (small, big):
        rows.append((f"wave of {w['tasks']} durable tasks (10 steps x 50 ms, concurrency 8, faults none): wall; "
                     f"set-up / tasks / end (timeline)",
                     f"{w['wall']:.1f} s", f"{w['setup']:.1f} / {w['run']:.1f} / {w['end']:.1f} s",
                     f"{w['attempts']} attempts (references included)"))
        harness = w["cpu"] - w["sandboxes"]
        rows.append((f"wave of {w['tasks']}: CPU all in / sandboxes / harness", f"{w['cpu']:.1f} s",
                     f"{w['sandboxes']:.1f} s / {harness:.1f} s",
                     f"harness {harness / w['attempts'] * 1000:.0f} ms per attempt; x{harness / max(w['sandboxes'], 1e-9):.2f} "
                     "of the sandboxes"))
        split = sorted(w["parts"].items(), key=lambda kv: -kv[1])
        rows.append((f"wave of {w['tasks']}: harness CPU by part", "", "", "; ".join(
            f"{k} {v:.1f} s" for k, v in split if v >= 0.05)))
    da = big["attempts"] - small["attempts"]
    all_in = (big["cpu"] - small["cpu"]) / da
    sb = (big["sandboxes"] - small["sandboxes"]) / da
    rows.append((f"marginal CPU per extra attempt ({small['tasks']} -> {big['tasks']} tasks)",
                 f"{all_in * 1000:.0f} ms all in", f"{sb * 1000:.0f} ms sandboxes",
                 f"harness {(all_in - sb) * 1000:.0f} ms per attempt (goal: 60 ms)"))
    parts = sorted(set(small["parts"]) | set(big["parts"]))
    per = {k: (big["parts"].get(k, 0) - small["parts"].get(k, 0)) / da * 1000 for k in parts}
    rows.append(("marginal harness CPU per extra attempt, by part", "", "", "; ".join(
        f"{k} {v:.0f} ms" for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if abs(v) >= 1)))
    per["all"] = (all_in - sb) * 1000
    fixed = small["cpu"] - small["attempts"] * all_in
    rows.append(("fixed cost of a wave from nothing (its own Ray and store)", f"{small['setup']:.1f} s set-up",
                 f"{small['end']:.1f} s end", f"about {fixed:.1f} CPU-s not per attempt (goal: 8 s wall from nothing)"))
    return per


def own_share(rows: list, per: dict, bare: dict) -> None:
    """The marginal harness CPU less what answering the runner's own requests costs (the store's and the services'
    CPU per run of the bare loop, which has no harness): the part the harness adds of its own."""
    traffic = (bare["store"] + bare["services"]) * 1000
    rows.append(("marginal harness CPU per extra attempt less the runner's own traffic (the bare loop's store + "
                 "services CPU per run)", f"{per['all']:.0f} ms", f"-{traffic:.0f} ms = {per['all'] - traffic:.0f} ms",
                 f"goal: 60 ms; the store beyond the bare loop's {bare['store'] * 1000:.0f} ms per run: "
                 f"{per.get('store (weed)', 0) - bare['store'] * 1000:.0f} ms; the driver beyond the bare loop's "
                 f"services ({bare['services'] * 1000:.0f} ms): "
                 f"{per.get('driver (services, grading)', 0) - bare['services'] * 1000:.0f} ms"))


def _phases(d: Path, wall: float) -> dict:
    """A wave's fixed cost from its timeline: wall less the span of its attempts (first start to last end)."""
    events = [json.loads(x) for x in (d / "timeline.jsonl").read_text().splitlines()]
    at = {e["event"]: e["t"] for e in events}
    starts = [e["t"] for e in events if e["event"] == "attempt_start"]
    ends = [e["t"] for e in events if e["event"] == "attempt_end"]
    ready = next(e for e in events if e["event"] == "parts_ready")
    return {"wall": wall, "setup": at["parts_ready"], "to_first": min(starts) - at["parts_ready"],
            "span": max(ends) - min(starts), "end": at["wave_end"] - max(ends),
            "fixed": wall - (max(ends) - min(starts)), "attach": ready.get("fleet_attach_s")}


def bench_fleet(rows: list, runs: int = 3) -> None:
    """The fixed cost of a short wave (2 durable tasks, faults none) started from nothing (`--address local`) beside
    the same wave on a fleet already up (`sandfleet up`, then `--address fleet`), alternating, `runs` of each; the
    median of each. Fixed cost: the CLI's wall less the span of the wave's attempts."""
    root = Path(tempfile.mkdtemp(prefix="sfbench-fleet-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_USAGE_STATS_ENABLED="0", SANDFLEET_FLEET_FILE=str(root / "run" / "fleet.json"))
    cfg = root / "w.yaml"
    cfg.write_text("tasks: 2\nconcurrency: 2\nseed: 5\nrunner: durable\nfaults: none\n"
                   "workload: {steps: 4, think_ms: 50}\n")
    cli = [sys.executable, "-m", "cluster.cli"]
    got: dict[str, list] = {"local": [], "fleet": []}
    t = time.perf_counter()
    up = subprocess.run(cli + ["up"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    up_s = time.perf_counter() - t
    try:
        if up.returncode != 0:
            raise SystemExit(f"sandfleet up: exit {up.returncode}: {up.stderr[-2000:]}")
        for i in range(runs):
            for address in ("local", "fleet"):
                out = root / f"r-{address}-{i}"
                t = time.perf_counter()
                p = subprocess.run(cli + ["wave", "run", str(cfg), "--address", address, "--results", str(out),
                                          "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True,
                                   timeout=600)
                wall = time.perf_counter() - t
                if p.returncode != 0:
                    raise SystemExit(f"wave on {address}: exit {p.returncode}: {p.stdout[-500:]} {p.stderr[-2000:]}")
                got[address].append(_phases((out / "latest").resolve(), wall))
    finally:
        t = time.perf_counter()
        subprocess.run(cli + ["down"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        down_s = time.perf_counter() - t
        shutil_rm(root)

    def med(address: str, k: str) -> float:
        xs = sorted(x[k] for x in got[address])
        return xs[len(xs) // 2]

    rows.append(("`sandfleet up` / `sandfleet down`, wall", f"{up_s:.1f} s", f"{down_s:.1f} s", "once per fleet"))
    rows.append((f"short wave (2 tasks, faults none; median of {runs}): CLI wall, own Ray and store / on a fleet "
                 "already up", f"{med('local', 'wall'):.1f} s", f"{med('fleet', 'wall'):.1f} s",
                 f"x{med('fleet', 'wall') / med('local', 'wall'):.2f}"))
    rows.append(("short wave: fixed cost (wall less its attempts' span), own / fleet", f"{med('local', 'fixed'):.1f} s",
                 f"{med('fleet', 'fixed'):.1f} s", "goal: 8 s from nothing, 4 s on a fleet already up"))
    rows.append(("short wave: set-up (process start to parts_ready) / first attempt after it / end (last attempt to "
                 "wave_end), own -> fleet", f"{med('local', 'setup'):.2f} / {med('local', 'to_first'):.2f} / "
                 f"{med('local', 'end'):.2f} s", f"{med('fleet', 'setup'):.2f} / {med('fleet', 'to_first'):.2f} / "
                 f"{med('fleet', 'end'):.2f} s", f"attach to the fleet {med('fleet', 'attach'):.2f} s"))


def main() -> None:
    if os.geteuid() != 0 or not CPUACCT.is_dir():
        raise SystemExit("the cost bench needs root and the cpuacct cgroup controller")
    sys.path.insert(0, str(ROOT))
    rows: list = []
    bench_ray(rows)
    per = bench_waves(rows)
    bench_fleet(rows)
    own_share(rows, per, bench_bare(rows))
    write_section(MARK, "Harness cost (issue 19)", "Produced by `python -m tests.bench.cost` (part of `make bench`); one run, side by side; CPU from a cpuacct cgroup "
                  "around each measured tree",
                  "| measurement | value / before | value / after | note |", rows)


if __name__ == "__main__":
    main()
