"""The scale envelope on hollow nodes (issue 45); writes the `Hollow nodes` section of BENCHMARKS.md.

A wave (`sandfleet wave run`, its own Ray and store, faults none) whose fleet is N hollow nodes
(`SANDFLEET_BENCH_HOLLOW_NODES=N`, fleet/hollow.py): N real sandbox host actors whose sandboxes are coroutines that
follow the durable runner's protocol against the real head (driver with its model endpoint and effects service,
store, fault proxy, ledger, sweep actor). Every process of the tree is sampled every `SFBENCH_SAMPLE_S` (its own
CPU from /proc/<pid>/stat, its peak RSS from VmHWM), grouped by part, and split by the wave's timeline into set-up
(to `parts_ready`), the run (first attempt start to last attempt end) and the end (grading, report, exit).

Per part: CPU per attempt over the whole wave and over the run, peak RSS, and its busiest second (cores): a part
that is one event loop saturates at 1.0. `head` is driver + store + proxy + ledger + sweep actor; the hollow hosts
stand for the nodes and are not the head.

`python -m tests.bench.hollow` (part of `make bench`: 10 nodes x 200 sandboxes by default);
`SFBENCH_HOLLOW="10x1000,50x1000,100x1000"` runs those sizes (nodes x concurrent sandboxes: half of them tasks, half
their references, which run beside them), `SFBENCH_HOLLOW_STEPS` (4), `SFBENCH_HOLLOW_THINK_MS` (the model's think
per call, 50) and `SFBENCH_HOLLOW_HOLD_S` (the sandbox's own work per step, 5 s) shape each attempt; `SFBENCH_HOLLOW_KEEP=DIR`
keeps each wave's results folder in DIR. The model
endpoint holds a thread per open connection (at most 512, fleet/services/): a long model think with more sandboxes
than that in a call at once is refused, and the wave ends as a harness fault; so the attempts' length is the
sandbox's own work, not the model's.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.bench import write_section

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- hollow -->"  # make bench's default size
ENVELOPE = "<!-- hollow-envelope -->"  # the sizes asked by SFBENCH_HOLLOW (kept when make bench rewrites MARK)
TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_S = float(os.environ.get("SFBENCH_SAMPLE_S", "0.5"))
# The leases' TTL: at the default 6 s a 2-core machine that runs the head and a thousand hollow sandboxes answers a
# host's renewal later than its 3 s wait, and the attempt is fenced (BENCHMARKS.md names it); SFBENCH_HOLLOW_TTL_S
TTL_S = float(os.environ.get("SFBENCH_HOLLOW_TTL_S", "30"))
HEAD = ("driver", "store (weed)", "fault proxy", "ledger actor", "sweep actor")
PARTS = (("weed ", "store (weed)"), ("storage.proxy", "fault proxy"), ("sandfleet-relay", "fault proxy"),
         ("ray::HollowHost", "hollow hosts"), ("ray::LeaseLedger", "ledger actor"), ("ray::SweepActor", "sweep actor"),
         ("gcs_server", "Ray GCS"), ("raylet", "raylet"), ("cluster.cli", "driver"), ("cluster.report", "driver"),
         ("ray::IDLE", "Ray idle workers"))


def part_of(cmd: str) -> str:
    return next((name for key, name in PARTS if key in cmd), "other")


def read_proc(pid: int) -> tuple[float, int, str] | None:
    """(CPU-seconds, peak RSS in KiB, command line) of one process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    f = raw[raw.rindex(")") + 2:].split()
    hwm = next((int(x.split()[1]) for x in status.splitlines() if x.startswith("VmHWM:")), 0)
    return (int(f[11]) + int(f[12])) / TICK, hwm, cmd


def descendants(root: int) -> list[int]:
    """Every process under `root` (by /proc's parent links), `root` included."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                raw = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(raw[raw.rindex(")") + 2:].split()[1]), []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


class Sampler:
    """Samples every process of the wave's tree: per pid its last (CPU, peak RSS, part), and per sample time the
    CPU of each part (so a phase's CPU is a difference of two samples)."""

    def __init__(self, root: int):
        self.root = root
        self.seen: dict[int, dict] = {}
        self.series: list[tuple[float, dict[str, float]]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            for pid in descendants(self.root):
                got = read_proc(pid)
                if got is None:
                    continue
                cpu, hwm, cmd = got
                prev = self.seen.get(pid)
                part = part_of(cmd) if cmd else (prev["part"] if prev else "other")
                self.seen[pid] = {"cpu": cpu, "hwm": max(hwm, prev["hwm"] if prev else 0), "part": part,
                                  "cmd": cmd or (prev["cmd"] if prev else "")}
            now: dict[str, float] = {}
            for st in self.seen.values():
                now[st["part"]] = now.get(st["part"], 0.0) + st["cpu"]
            self.series.append((time.time(), now))
            self.stop.wait(SAMPLE_S)

    def at(self, t: float) -> dict[str, float]:
        """Each part's CPU at the last sample at or before wall time `t`."""
        best = self.series[0][1] if self.series else {}
        for ts, parts in self.series:
            if ts > t:
                break
            best = parts
        return best

    def busiest(self, part: str, window_s: float = 2.0) -> float:
        """The part's highest CPU rate (cores) over any `window_s` of the run."""
        top, j = 0.0, 0
        for i, (ti, pi) in enumerate(self.series):
            while j < i and ti - self.series[j][0] > window_s:
                j += 1
            tj, pj = self.series[j]
            if ti - tj >= window_s / 2:
                top = max(top, (pi.get(part, 0) - pj.get(part, 0)) / (ti - tj))
        return top

    def peak_rss(self) -> dict[str, tuple[int, int]]:
        """Part -> (the biggest one process's peak RSS, the sum of its processes' peaks), KiB."""
        out: dict[str, tuple[int, int]] = {}
        for st in self.seen.values():
            one, tot = out.get(st["part"], (0, 0))
            out[st["part"]] = (max(one, st["hwm"]), tot + st["hwm"])
        return out


def run_wave(nodes: int, sandboxes: int, steps: int, think_ms: int, hold_s: float, root: Path) -> dict:
    cfg = root / f"h{nodes}x{sandboxes}.yaml"
    tasks = max(1, sandboxes // 2)  # each task's uninterrupted reference runs beside it: two sandboxes a task
    cfg.write_text(f"name: hollow{nodes}x{sandboxes}\ntasks: {tasks}\nconcurrency: {tasks}\nseed: 5\n"
                   f"runner: durable\nfaults: none\nworkload: {{steps: {steps}, think_ms: {think_ms}}}\n"
                   f"deadline_s: 3600\nliveness_s: 600\nlease_ttl_s: {TTL_S}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["SANDFLEET_BENCH_HOLLOW_NODES"] = str(nodes)
    env["SANDFLEET_BENCH_HOLLOW_HOLD_S"] = str(hold_s)  # the sandbox's own work between steps (not the model's)
    out = root / f"r{nodes}x{sandboxes}"
    t = time.time()
    p = subprocess.Popen([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--results", str(out),
                          "--no-progress"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    s = Sampler(p.pid)
    s.thread.start()
    try:
        stdout, stderr = p.communicate(timeout=float(os.environ.get("SFBENCH_HOLLOW_TIMEOUT_S", "3000")))
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)  # the wave's own stop: every part it started is ended
        try:
            p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
        raise SystemExit(f"hollow wave {nodes}x{sandboxes}: no end within its timeout") from None
    finally:
        s.stop.set()
        s.thread.join()
    wall = time.time() - t
    d = (out / "latest").resolve()
    events = [json.loads(x) for x in (d / "timeline.jsonl").read_text().splitlines()]
    t0 = next(e["wall"] - e["t"] for e in events if e["event"] == "wave_start")
    at = {e["event"]: e["t"] for e in events}
    starts = sorted(e["t"] for e in events if e["event"] == "attempt_start")
    ends = sorted(e["t"] for e in events if e["event"] == "attempt_end")
    running, peak = 0, 0
    for _, d_ in sorted([(x, 1) for x in starts] + [(x, -1) for x in ends]):
        running += d_
        peak = max(peak, running)
    verdicts: dict[str, int] = {}
    for g in d.glob("*.grade.json"):
        v = json.loads(g.read_text()).get("verdict", "?")
        verdicts[v] = verdicts.get(v, 0) + 1
    others = sorted({st["cmd"][:100] for st in s.seen.values() if st["part"] == "other"})
    res = {"nodes": nodes, "sandboxes": sandboxes, "exit": p.returncode, "wall": wall, "attempts": len(ends),
           "peak_running": peak, "setup": at.get("parts_ready", 0), "first": starts[0] if starts else 0,
           "last": ends[-1] if ends else 0, "end": at.get("wave_end", 0), "verdicts": verdicts,
           "stderr": stderr[-1500:], "stdout": stdout[-1500:], "others": others}
    zero, first, last, final = (s.at(t0 - 1e9), s.at(t0 + res["first"]), s.at(t0 + res["last"]),
                                s.series[-1][1] if s.series else {})
    parts = sorted(set(final))
    res["cpu_all"] = {k: final.get(k, 0) - zero.get(k, 0) for k in parts}
    res["cpu_run"] = {k: last.get(k, 0) - first.get(k, 0) for k in parts}
    res["cpu_after"] = {k: final.get(k, 0) - last.get(k, 0) for k in parts}
    res["busiest"] = {k: s.busiest(k) for k in parts}
    res["rss"] = s.peak_rss()
    res["run_s"] = res["last"] - res["first"]
    keep = os.environ.get("SFBENCH_HOLLOW_KEEP")  # a folder to keep the wave's results in (grading benches)
    if keep:
        shutil.copytree(d, Path(keep) / d.name, symlinks=True)
    shutil.rmtree(out, ignore_errors=True)
    return res


def rows_of(r: dict) -> list:
    n, a = f"{r['nodes']} nodes x {r['sandboxes']} sandboxes", max(r["attempts"], 1)
    v = ", ".join(f"{k} {c}" for k, c in r["verdicts"].items() if c)
    rows = [(f"**{n}**: exit, wall; attempts; most running at once", f"exit {r['exit']}, {r['wall']:.0f} s",
             f"{r['attempts']} attempts; {r['peak_running']} at once",
             f"set-up {r['setup']:.1f} s; attempts {r['first']:.1f}-{r['last']:.1f} s; end {r['end'] - r['last']:.1f} s; "
             f"verdicts: {v or 'none read'}")]
    head_all = sum(r["cpu_all"].get(k, 0) for k in HEAD)
    head_run = sum(r["cpu_run"].get(k, 0) for k in HEAD)
    rows.append((f"{n}: head CPU per attempt (driver + store + proxy + ledger + sweep)",
                 f"{head_all / a * 1000:.0f} ms whole wave", f"{head_run / a * 1000:.0f} ms during the run",
                 f"grading and the end: {sum(r['cpu_after'].get(k, 0) for k in HEAD):.1f} CPU-s (goal: 50 ms per "
                 "attempt all in)"))
    for k in sorted(r["cpu_all"], key=lambda k: -r["cpu_all"][k]):
        if r["cpu_all"][k] < 0.05:
            continue
        one, tot = r["rss"].get(k, (0, 0))
        rss = f"{one / 1024:.0f} MiB" + (f" (one; {tot / 1024:.0f} MiB all)" if tot != one else "")
        rows.append((f"{n}: {k}", f"{r['cpu_all'][k] / a * 1000:.1f} ms / attempt whole wave; "
                                  f"{r['cpu_run'][k] / a * 1000:.1f} ms in the run",
                     f"peak RSS {rss}", f"busiest 2 s: {r['busiest'][k]:.2f} cores"))
    return rows


def main() -> None:
    sys.path.insert(0, str(ROOT))
    sizes = [tuple(int(x) for x in s.split("x")) for s in os.environ.get("SFBENCH_HOLLOW", "10x200").split(",")]
    steps = int(os.environ.get("SFBENCH_HOLLOW_STEPS", "4"))
    think = int(os.environ.get("SFBENCH_HOLLOW_THINK_MS", "50"))
    hold = float(os.environ.get("SFBENCH_HOLLOW_HOLD_S", "5"))
    root = Path(tempfile.mkdtemp(prefix="sfbench-hollow-"))
    rows: list = []
    try:
        for nodes, sandboxes in sizes:
            r = run_wave(nodes, sandboxes, steps, think, hold, root)
            print(json.dumps({k: v for k, v in r.items() if k not in ("stdout",)}, default=str), flush=True)
            rows += rows_of(r)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    big = bool(os.environ.get("SFBENCH_HOLLOW"))
    write_section(ENVELOPE if big else MARK, "Hollow nodes: the scale envelope (issue 45)" if big else
                  "Hollow nodes: the default size (issue 45)",
                  f"Produced by `SFBENCH_HOLLOW={os.environ.get('SFBENCH_HOLLOW', '10x200')} python -m "
                  f"tests.bench.hollow` ({steps} steps per attempt, each {think} ms of model think and {hold:g} s of "
                  f"the sandbox's own work; lease TTL {TTL_S:g} s; faults none; `make bench` "
                  "runs 10x200); per part: CPU per attempt, peak RSS, busiest 2 s", "| measurement | value | value | "
                  "note |", rows)


if __name__ == "__main__":
    main()
