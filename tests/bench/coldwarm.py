"""A cold wave beside a warm one (issue 45), in one run, back to back.

Each wave is `sandfleet wave run` with its own Ray and store, the durable runner, faults none (or each fault set of
`--faults`, e.g. `none,PK1`). Cold: a fresh results root, so every faulted task's reference (its seed's uninterrupted
run) runs beside it, and a task with no fault planned is its own (cluster/grade/selfref.py: it runs no second one and
fills the cache). Warm: the same wave again in the same root, every reference taken from the cache. Moved: the same runner's code copied to a second directory (the bytes
unchanged, the path new: another checkout, another venv's copy) and run in the root the first copy warmed. The
reference cache is keyed by the runner's content (cluster/artifacts.py `runner_digest`), so the moved wave reuses
every reference; a key holding the path ran them all again.

Rounds alternate cold, warm and moved; the table gives the median of the rounds and every run. Run it holding the
suite's lock (its waves are what the suite's leftover checks look for):

    flock /run/sandfleet-test-suite.lock .venv/bin/python -m tests.bench.coldwarm [--rounds N] [--faults none,PK1]

It prints the table and writes it into BENCHMARKS.md between `<!-- coldwarm -->` marks. With `--phases [--think-ms
50,150]` it runs only cold and warm, each in a cpuacct cgroup, and writes where the cold's extra wall and CPU go (by
the wave's own timeline marks, and by process) between `<!-- coldwarm-phases -->` marks.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.cpu import Cgroup, part_cpu

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- coldwarm -->"
PHASES = "<!-- coldwarm-phases -->"
PHASES_NOTE = (
    "A cold wave differs from a warm one only by its references: one more uninterrupted run per seed, beside its "
    "task. The set-up (Ray, the store, the fleet's actors) is the same in both and cancels out; making it cheaper "
    "raises the ratio (less fixed time dilutes the same extra). The extra is the references' attempts, and most of "
    "it is the runner's own CPU, which no harness change removes: the floor row is the cold wave with every harness "
    "cost of a reference at zero, on a machine whose cores the warm wave's attempts already fill (derived, an "
    "estimate). Below the floor only by running fewer or cheaper runners, or with cores the tasks leave free (the "
    "concurrency-1 row above).")


def _wave(results: Path, cfg: dict, env: dict, profile: dict | None = None) -> tuple[float, dict]:
    """The wave's wall and its plan; exit 0 or the bench stops, naming what the wave said. With `profile` (a dict),
    the wave runs in a cpuacct cgroup and `profile` gets its phases (`_phases`)."""
    results.mkdir(parents=True, exist_ok=True)
    path = results.parent / f"{results.name}-{time.monotonic_ns()}.yaml"
    path.write_text(json.dumps(cfg))  # (JSON is YAML)
    argv = [sys.executable, "-m", "cluster.cli", "wave", "run", str(path), "--results", str(results), "--no-progress"]
    cg = Cgroup(f"cw{time.monotonic_ns()}") if profile is not None else None
    t0 = time.time()
    t = time.perf_counter()
    try:
        if cg is not None:
            p, seen = cg.run(argv, sample=True, cwd=ROOT, env=env, timeout=900)
        else:
            p = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        wall = time.perf_counter() - t
        if cg is not None:
            total = cg.usage_s()
    finally:
        if cg is not None:
            cg.remove()
    if p.returncode != 0:
        raise SystemExit(f"wave in {results}: exit {p.returncode}: {p.stdout[-800:]} {p.stderr[-2000:]}")
    d = (results / "latest").resolve()
    plan = json.loads((d / "plan.json").read_text())
    if profile is not None:
        profile.update(_phases(d, t0, t0 + wall, total, seen))
    return wall, plan


def _phases(d: Path, t0: float, t1: float, total: float, seen: dict) -> dict:
    """Where one wave's wall and CPU went, by its own timeline marks: `cli` (the process start to `wave_start`),
    `setup` (to `parts_ready`), `attempts` (to the last `attempt_end`), `end` (to `wave_end`: sweeps, audit, parts
    stop), `after` (to the process's exit: grading, report, seal, the reference cache); the CPU of the runners (the
    tree's CPU less the harness's processes) and of each harness part."""
    events = [json.loads(x) for x in (d / "timeline.jsonl").read_text().splitlines()]
    base = next(e["wall"] - e["t"] for e in events if e["event"] == "wave_start")
    at = {e["event"]: e["t"] + base for e in events}
    last = max(e["t"] for e in events if e["event"] == "attempt_end") + base
    parts = part_cpu(seen)
    end = next(e for e in events if e["event"] == "wave_end")
    return {"cli": at["wave_start"] - t0, "setup": at["parts_ready"] - at["wave_start"],
            "attempts": last - at["parts_ready"], "end": at["wave_end"] - last, "after": t1 - at["wave_end"],
            "attempt_count": sum(1 for e in events if e["event"] == "attempt_end"),
            "fleet_start_s": end.get("fleet_start_s"), "store_start_s": end.get("store_start_s"),
            "cpu": total, "runners": total - sum(parts.values()), "parts": parts}


def _reused(plan: dict) -> int:
    return sum(1 for t in plan["tasks"] if t["reference"]["cached"])


def _copy_runner(d: Path) -> dict:
    """The built-in durable runner's code copied into `d`, run from there (its workdir: read-only in the sandbox)."""
    d.mkdir(parents=True)
    for p in (ROOT / "fleet" / "runners").glob("*.py"):
        shutil.copy(p, d / p.name)  # (a copy: new mtimes, same bytes)
    return {"name": "durable-copy", "command": [sys.executable, str(d / "durable.py")], "workdir": str(d)}


# a fault set's timing: at boundaries of the runner (its Nth model answer), so load cannot move where a kill lands and
# the durable runner resumes (every wave must exit 0)
TIMING = {"PK1": {"after_model_calls": [3, 8]}}


def bench_faulted(rows: list, faults: str, rounds: int = 2, tasks: int = 32, concurrency: int = 16, steps: int = 10,
                  think_ms: int = 50) -> None:
    """Cold beside warm with a fault set (`PK1`, `PK1+ST1`, ...): every task has a fault, so every reference runs
    beside its task in the cold wave, as before."""
    root = Path(tempfile.mkdtemp(prefix="sfbench-coldwarm-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_USAGE_STATS_ENABLED="0")
    ids = sorted(set(faults.split("+")))
    cfg = {"seed": 5, "runner": "durable", "faults": [faults], "deadline_s": 300, "tasks": tasks,
           "concurrency": concurrency, "workload": {"steps": steps, "think_ms": think_ms},
           "fault_timing": {f: TIMING[f] for f in ids if f in TIMING}}
    got: dict[str, list[float]] = {"cold": [], "warm": []}
    reused: dict[str, list[int]] = {"cold": [], "warm": []}
    try:
        for r in range(rounds):
            for name in ("cold", "warm"):
                wall, plan = _wave(root / f"round{r}" / "a", cfg, env)
                got[name].append(wall)
                reused[name].append(_reused(plan))
    finally:
        if not os.environ.get("SFBENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
    cold, warm = statistics.median(got["cold"]), statistics.median(got["warm"])
    runs = {k: ", ".join(f"{x:.1f}" for x in v) for k, v in got.items()}
    timing = "; ".join(f"{f} after model answer {a}-{b}" for f, t in cfg["fault_timing"].items()
                       for a, b in [t["after_model_calls"]])
    rows.append((f"{tasks} durable tasks ({steps} steps x {think_ms} ms), concurrency {concurrency}, faults {faults} "
                 f"({timing or 'default timing'}: every task has one), own Ray and store: cold ({tasks} references run "
                 f"beside the tasks) / warm ({min(reused['warm'])} of {tasks} references from the cache)",
                 f"{cold:.1f} s", f"{warm:.1f} s",
                 f"x{cold / warm:.2f} (goal: x1.3); runs: cold {runs['cold']}; warm {runs['warm']}"))


def bench_coldwarm(rows: list, rounds: int = 2, tasks: int = 32, concurrency: int = 16, steps: int = 10,
                   think_ms: int = 50, small: tuple[int, int] = (8, 1)) -> None:
    root = Path(tempfile.mkdtemp(prefix="sfbench-coldwarm-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_USAGE_STATS_ENABLED="0")
    base = {"seed": 5, "runner": "durable", "faults": "none", "deadline_s": 300, "fault_free_reference": "self",
            "workload": {"steps": steps, "think_ms": think_ms}}
    big = dict(base, tasks=tasks, concurrency=concurrency)
    little = dict(base, tasks=small[0], concurrency=small[1])
    got: dict[str, list[float]] = {k: [] for k in ("cold", "warm", "moved_cold", "moved", "small_cold",
                                                   "small_warm")}
    reused: dict[str, list[int]] = {k: [] for k in got}
    try:
        for r in range(rounds):
            here = root / f"round{r}"
            for name, res, cfg in (("cold", here / "a", big), ("warm", here / "a", big)):
                wall, plan = _wave(res, cfg, env)
                got[name].append(wall)
                reused[name].append(_reused(plan))
            first, second = _copy_runner(here / "copy1"), _copy_runner(here / "elsewhere" / "copy2")
            for name, res, runner in (("moved_cold", here / "m", first), ("moved", here / "m", second)):
                wall, plan = _wave(res, dict(big, runner=runner), env)
                got[name].append(wall)
                reused[name].append(_reused(plan))
            for name, res in (("small_cold", here / "s"), ("small_warm", here / "s")):
                wall, plan = _wave(res, little, env)
                got[name].append(wall)
                reused[name].append(_reused(plan))
    finally:
        if not os.environ.get("SFBENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)

    def med(k: str) -> float:
        return statistics.median(got[k])

    def runs(k: str) -> str:
        return ", ".join(f"{x:.1f}" for x in got[k])

    rows.append((f"{tasks} durable tasks ({steps} steps x {think_ms} ms), concurrency {concurrency}, faults none, own "
                 f"Ray and store: cold (a fresh results root: each task its own reference, none run beside it; they "
                 f"fill the cache) / warm (the same root again: {min(reused['warm'])} of {tasks} references from the "
                 "cache)",
                 f"{med('cold'):.1f} s", f"{med('warm'):.1f} s",
                 f"x{med('cold') / med('warm'):.2f} (goal: x1.3); runs: cold {runs('cold')}; warm {runs('warm')}"))
    rows.append((f"the same wave with the runner's code copied elsewhere (same bytes, new path and mtimes), in the "
                 f"root the first copy warmed: {min(reused['moved'])} of {tasks} references from the cache",
                 f"{med('moved'):.1f} s", f"{med('moved_cold'):.1f} s",
                 f"x{med('moved') / med('moved_cold'):.2f} of the first copy's cold wave; x{med('moved') / med('warm'):.2f}"
                 f" of the warm wave; runs: moved {runs('moved')}; first copy cold {runs('moved_cold')}"))
    rows.append((f"{small[0]} durable tasks, concurrency {small[1]}, faults none: cold / warm "
                 f"({min(reused['small_warm'])} of {small[0]} from the cache)",
                 f"{med('small_cold'):.1f} s", f"{med('small_warm'):.1f} s",
                 f"x{med('small_cold') / med('small_warm'):.2f}; runs: cold {runs('small_cold')}; warm "
                 f"{runs('small_warm')}"))


def write_table(rows: list, rounds: int, faults: str = "none") -> str:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    flag = f" --faults {faults}" if faults != "none" else ""
    head = (f"{MARK}\n\nCold beside warm (`flock /run/sandfleet-test-suite.lock .venv/bin/python -m tests.bench.coldwarm"
            f" --rounds {rounds}{flag}`), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {rev.strip()}, "
            f"median of {rounds} rounds:\n\n| measurement | value | beside | ratio / note |\n|---|---|---|---|\n")
    note = ("\nWith `fault_free_reference: self` (opt-in; the default `run` keeps two runs of each seed, which catches a "
            "runner that is not deterministic), a task with no fault planned that ran once, untouched, is its own "
            "reference (cluster/grade/selfref.py): "
            "a cold `faults: none` wave runs no second run of any seed, and its tasks fill the cache. A faulted task "
            "still runs its reference beside it, so a cold faulted wave runs every seed twice: on a machine whose "
            "cores the tasks already fill that is up to twice the runners' work, a ratio the CPU sets, not the "
            "schedule. The reference cache's key is the runner's content, so a copy of the same runner elsewhere runs "
            "warm (the moved row).\n")
    table = head + "".join(f"| {' | '.join(r)} |\n" for r in rows) + note + f"\n{MARK}"
    bench = ROOT / "BENCHMARKS.md"
    text = bench.read_text()
    if text.count(MARK) == 2:
        a, b = text.index(MARK), text.rindex(MARK) + len(MARK)
        text = text[:a] + table + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + table + "\n"
    bench.write_text(text)
    return table


def bench_phases(rounds: int = 1, tasks: int = 32, concurrency: int = 16, steps: int = 10,
                 think_ms: int = 50) -> str:
    """Cold then warm, each in a cpuacct cgroup, `rounds` times: a markdown table of where each one's wall and CPU
    went (`_phases`), the cold's extra beside it, and the floor the runners' own CPU sets for the cold wave."""
    root = Path(tempfile.mkdtemp(prefix="sfbench-coldwarm-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_USAGE_STATS_ENABLED="0")
    cfg = {"seed": 5, "runner": "durable", "faults": "none", "deadline_s": 300, "tasks": tasks,
           "concurrency": concurrency, "workload": {"steps": steps, "think_ms": think_ms}}
    got: dict[str, list[dict]] = {"cold": [], "warm": []}
    try:
        for r in range(rounds):
            for name in ("cold", "warm"):
                prof: dict = {}
                wall, _ = _wave(root / f"round{r}" / "a", cfg, env, prof)
                got[name].append(dict(prof, wall=wall))
    finally:
        if not os.environ.get("SFBENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)

    def med(name: str, f) -> float:
        return statistics.median(f(x) for x in got[name])

    keys = [("wall", "wall"), ("cli start (to wave_start)", "cli"), ("set-up (to parts_ready)", "setup"),
            ("attempts (to the last attempt_end)", "attempts"), ("end (sweeps, audit, parts stop)", "end"),
            ("after wave_end (grading, report, seal, cache)", "after"), ("fleet start (figure)", "fleet_start_s"),
            ("store start (figure)", "store_start_s"), ("CPU all in", "cpu"), ("CPU of the runners", "runners")]
    lines = [f"| {tasks} durable tasks ({steps} steps x {think_ms} ms), C={concurrency}, faults none, own Ray and "
             f"store; median of {rounds} | cold | warm | cold - warm |",
             "|---|---|---|---|"]
    for label, k in keys:
        c, w = (med(s, lambda x, k=k: x[k] or 0.0) for s in ("cold", "warm"))
        lines.append(f"| {label} | {c:.2f} s | {w:.2f} s | {c - w:+.2f} s |")
    names = sorted({n for x in got["cold"] + got["warm"] for n in x["parts"]})
    for n in names:
        c, w = (med(s, lambda x, n=n: x["parts"].get(n, 0.0)) for s in ("cold", "warm"))
        if max(c, w) >= 0.005:
            lines.append(f"| CPU of {n} | {c:.2f} s | {w:.2f} s | {c - w:+.2f} s |")
    c, w = med("cold", lambda x: x["attempt_count"]), med("warm", lambda x: x["attempt_count"])
    lines.append(f"| attempts | {c:.0f} | {w:.0f} | |")
    runs = {k: ", ".join(f"{x['wall']:.1f}" for x in v) for k, v in got.items()}
    ratio = med("cold", lambda x: x["wall"]) / med("warm", lambda x: x["wall"])
    lines.append(f"| cold / warm wall | x{ratio:.2f} | runs: cold {runs['cold']} | warm {runs['warm']} |")
    # derived: the cold wave if the references cost the harness nothing and the machine were busy only with their
    # runners (their CPU spread over every core): the least a cold wave can take here while it runs each reference
    per_run = med("cold", lambda x: x["runners"] / x["attempt_count"]) * 1000
    extra = med("cold", lambda x: x["runners"]) - med("warm", lambda x: x["runners"])
    floor = med("warm", lambda x: x["wall"]) + extra / (os.cpu_count() or 1)
    lines.append(f"| the runners' CPU per run (the tree's CPU less every harness process seen: the runner and its sandbox's processes) | "
                 f"{per_run:.0f} ms | | derived floor of the cold wave at zero harness cost: warm + the references' "
                 f"runner CPU / {os.cpu_count()} cores = {floor:.1f} s, x{floor / med('warm', lambda x: x['wall']):.2f}"
                 " |")
    return "\n".join(lines)


def write_phases(tables: list[str], rounds: int, thinks: list[int]) -> str:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    think = ",".join(map(str, thinks))
    body = (f"{PHASES}\n\nWhere a cold wave's extra time goes (`flock /run/sandfleet-test-suite.lock .venv/bin/python -m "
            f"tests.bench.coldwarm --phases --rounds {rounds} --think-ms {think}`), "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {rev.strip()}: each wave in a cpuacct cgroup, "
            "its phases cut at its own timeline marks, the CPU split by process (the runners: every process in a "
            "sandbox's cgroup).\n\n" + "\n\n".join(tables) + "\n\n" + PHASES_NOTE + f"\n\n{PHASES}")
    bench = ROOT / "BENCHMARKS.md"
    text = bench.read_text()
    if text.count(PHASES) == 2:
        a, b = text.index(PHASES), text.rindex(PHASES) + len(PHASES)
        text = text[:a] + body + text[b:]
    elif text.count(MARK) == 2:  # after the cold/warm table and the paragraph under it
        b = text.rindex(MARK) + len(MARK)
        nxt = text.find("\n\n", text.find("\n\n", b) + 2)
        b = len(text) if nxt < 0 else nxt
        text = text[:b] + "\n\n" + body + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    bench.write_text(text)
    return body


def main() -> None:
    sys.path.insert(0, str(ROOT))
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 2
    if "--phases" in sys.argv:  # where the cold's extra goes, by phase and part
        thinks = ([int(x) for x in sys.argv[sys.argv.index("--think-ms") + 1].split(",")]
                  if "--think-ms" in sys.argv else [50])
        print(write_phases([bench_phases(rounds=rounds, think_ms=t) for t in thinks], rounds, thinks))
        return
    faults = sys.argv[sys.argv.index("--faults") + 1] if "--faults" in sys.argv else "none"
    rows: list = []
    for fs in faults.split(","):  # `none,PK1`: the rows of each fault set (`PK1+ST1`: both on every task)
        if fs == "none":
            bench_coldwarm(rows, rounds=rounds)
        else:
            bench_faulted(rows, fs, rounds=rounds)
    print(write_table(rows, rounds, faults))


if __name__ == "__main__":
    main()
