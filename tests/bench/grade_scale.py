"""Grading a large wave again, measured (issue 45); writes the `Grading at scale` section of BENCHMARKS.md.

Takes a wave's results folder that a hollow-node bench kept (`SFBENCH_HOLLOW_KEEP=DIR python -m tests.bench.hollow`,
e.g. `SFBENCH_HOLLOW=100x10000`: 5,000 tasks and their 5,000 references, 10,000 graded runs), copies it, and runs
`sandfleet grade --reseal` on the copy in a child process: its wall time and CPU, the grade of every task and
reference, SUMMARY.md, verdict.json, index.html and the pages, the seal. Then the report's size (index.html and every
file under pages/) and whether headless Chromium loads index.html (launched as the browser test launches it).

`python -m tests.bench.grade_scale FOLDER [FOLDER...]` (not in `make bench`: it needs a kept hollow wave, which takes
about ten minutes to make at 10,000 sandboxes).
"""
from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench import write_section
from tests.bench.report import _browser_load

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- grade-scale -->"


def _size(paths) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def grade_again(folder: Path, work: Path) -> tuple:
    copy = work / folder.name
    shutil.copytree(folder, copy, symlinks=True)
    tasks = len(list(copy.glob("*.grade.json")))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "cluster.cli", "grade", str(copy), "--reseal"], cwd=ROOT,
                       capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    index = copy / "index.html"
    pages = list((copy / "pages").glob("*")) if (copy / "pages").is_dir() else []
    ok, load_s, why = _browser_load(index, work) if shutil.which("chromium") else (False, 0.0, "no chromium")
    mib = 1024 * 1024
    return (f"`sandfleet grade --reseal` of a kept hollow wave, {tasks} graded runs ({folder.name})",
            f"{wall:.1f} s wall, {cpu:.1f} CPU-s (exit {p.returncode})",
            f"report {(_size([index]) + _size(pages)) / mib:.2f} MiB: index.html {_size([index]) / mib:.2f} MiB "
            f"+ {len(pages)} pages {_size(pages) / mib:.2f} MiB",
            f"Chromium --dump-dom: {'loaded' if ok else 'not loaded: ' + why} in {load_s:.1f} s; goal: under 60 s, "
            "under 10 MiB")


def main() -> None:
    sys.path.insert(0, str(ROOT))
    folders = [Path(a) for a in sys.argv[1:]]
    if not folders:
        raise SystemExit("usage: python -m tests.bench.grade_scale FOLDER... (a hollow bench's kept wave folder)")
    rows = []
    work = Path(tempfile.mkdtemp(prefix="sfbench-grade-"))
    try:
        for f in folders:
            rows.append(grade_again(f, work))
            print(rows[-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_section(MARK, "Grading at scale (issue 45)",
                  "Produced by `python -m tests.bench.grade_scale FOLDER` on the results a hollow-node wave kept "
                  "(`SFBENCH_HOLLOW_KEEP`), graded again from its stored files", "| measurement | wall and CPU | "
                  "report size | note |", rows)


if __name__ == "__main__":
    main()
