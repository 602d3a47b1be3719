"""A cold wave beside a warm one (issue 45), in one run, back to back.

Each wave is `sandfleet wave run` with its own Ray and store, the durable runner, faults none. Cold: a fresh results
root, so every task's reference (its seed's uninterrupted run) runs beside it. Warm: the same wave again in the same
root, every reference taken from the cache. Moved: the same runner's code copied to a second directory (the bytes
unchanged, the path new: another checkout, another venv's copy) and run in the root the first copy warmed. The
reference cache is keyed by the runner's content (cluster/artifacts.py `runner_digest`), so the moved wave reuses
every reference; a key holding the path ran them all again.

Rounds alternate cold, warm and moved; the table gives the median of the rounds and every run. Run it holding the
suite's lock (its waves are what the suite's leftover checks look for):

    flock /run/sandfleet-test-suite.lock .venv/bin/python -m tests.bench.coldwarm [--rounds N]

It prints the table and writes it into BENCHMARKS.md between `<!-- coldwarm -->` marks.
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

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- coldwarm -->"


def _wave(results: Path, cfg: dict, env: dict) -> tuple[float, dict]:
    """The wave's wall and its plan; exit 0 or the bench stops, naming what the wave said."""
    results.mkdir(parents=True, exist_ok=True)
    path = results.parent / f"{results.name}-{time.monotonic_ns()}.yaml"
    path.write_text(json.dumps(cfg))  # (JSON is YAML)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(path), "--results", str(results),
                        "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"wave in {results}: exit {p.returncode}: {p.stdout[-800:]} {p.stderr[-2000:]}")
    plan = json.loads(((results / "latest").resolve() / "plan.json").read_text())
    return wall, plan


def _reused(plan: dict) -> int:
    return sum(1 for t in plan["tasks"] if t["reference"]["cached"])


def _copy_runner(d: Path) -> dict:
    """The built-in durable runner's code copied into `d`, run from there (its workdir: read-only in the sandbox)."""
    d.mkdir(parents=True)
    for p in (ROOT / "fleet" / "runners").glob("*.py"):
        shutil.copy(p, d / p.name)  # (a copy: new mtimes, same bytes)
    return {"name": "durable-copy", "command": [sys.executable, str(d / "durable.py")], "workdir": str(d)}


def bench_coldwarm(rows: list, rounds: int = 2, tasks: int = 32, concurrency: int = 16, steps: int = 10,
                   think_ms: int = 50, small: tuple[int, int] = (8, 1)) -> None:
    root = Path(tempfile.mkdtemp(prefix="sfbench-coldwarm-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_USAGE_STATS_ENABLED="0")
    base = {"seed": 5, "runner": "durable", "faults": "none", "deadline_s": 300,
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
                 f"Ray and store: cold (a fresh results root: {tasks} references run beside the tasks) / warm (the "
                 f"same root again: {min(reused['warm'])} of {tasks} references from the cache)",
                 f"{med('cold'):.1f} s", f"{med('warm'):.1f} s",
                 f"x{med('cold') / med('warm'):.2f} (goal: x1.3); runs: cold {runs('cold')}; warm {runs('warm')}"))
    rows.append((f"the same wave with the runner's code copied elsewhere (same bytes, new path and mtimes), in the "
                 f"root the first copy warmed: {min(reused['moved'])} of {tasks} references from the cache",
                 f"{med('moved'):.1f} s", f"{med('moved_cold'):.1f} s",
                 f"x{med('moved') / med('moved_cold'):.2f} of the first copy's cold wave; x{med('moved') / med('warm'):.2f}"
                 f" of the warm wave; runs: moved {runs('moved')}; first copy cold {runs('moved_cold')}"))
    rows.append((f"{small[0]} durable tasks, concurrency {small[1]} (a reference beside each task: two runners on "
                 f"two cores): cold / warm ({min(reused['small_warm'])} of {small[0]} from the cache)",
                 f"{med('small_cold'):.1f} s", f"{med('small_warm'):.1f} s",
                 f"x{med('small_cold') / med('small_warm'):.2f}; runs: cold {runs('small_cold')}; warm "
                 f"{runs('small_warm')}"))


def write_table(rows: list, rounds: int) -> str:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    head = (f"{MARK}\n\nCold beside warm (`flock /run/sandfleet-test-suite.lock .venv/bin/python -m tests.bench.coldwarm"
            f" --rounds {rounds}`), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {rev.strip()}, "
            f"median of {rounds} rounds:\n\n| measurement | value | beside | ratio / note |\n|---|---|---|---|\n")
    note = ("\nA cold wave runs every seed twice (the task, and beside it its reference), so on a machine whose cores "
            "the tasks already fill it does up to twice the runners' work: there the ratio is the CPU's, not the "
            "schedule's. With a core free for each reference (the last row) it is near warm. The reference cache's "
            "key is the runner's content, so a copy of the same runner elsewhere runs warm (the middle row: a path in "
            "the key ran all of its references again).\n")
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


def main() -> None:
    sys.path.insert(0, str(ROOT))
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 2
    rows: list = []
    bench_coldwarm(rows, rounds=rounds)
    print(write_table(rows, rounds))


if __name__ == "__main__":
    main()
