"""The results layout (cluster/results.py): one place names every file, and the stored shape does not move."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import orjson
import pytest

from cluster import results
from cluster.grade import grade_wave

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "wave-before-results-py"


def test_a_torn_last_line_is_left_out_and_a_damaged_middle_line_is_named(tmp_path):
    p = tmp_path / results.TIMELINE
    p.write_bytes(b'{"event": "a"}\n\n{"event": "b"}\n{"event": "c", "t": 1')
    assert [r["event"] for r in results.read_jsonl(p, required=("event",))] == ["a", "b"]
    p.write_bytes(b'{"event": "a"}\n{"eve\n{"event": "b"}\n')
    with pytest.raises(ValueError, match=r"timeline.jsonl line 2"):
        results.read_jsonl(p)
    assert [r["event"] for r in results.read_jsonl(p, skip_bad=True)] == ["a", "b"]
    p.write_bytes(b'{"event": "a"}\n["not", "a", "record"]\n{"event": "b"}\n')
    with pytest.raises(ValueError, match="not a record with event"):
        results.read_jsonl(p, required=("event",))
    assert results.read_jsonl(tmp_path / "missing.jsonl") == []


def test_naming_rules_are_the_stored_ones():
    """A wave's bucket, prefixes, lease keys and sandbox ids are what waves before results.py stored: a resumed or
    re-graded old wave finds its things under the same names."""
    wave = "w-20261202T130229-s31-871f"
    assert results.bucket_name(wave) == "sf-" + __import__("hashlib").sha256(wave.encode()).hexdigest()[:16]
    assert re.fullmatch(r"[a-z0-9-]{3,63}", results.bucket_name(wave))
    assert results.task_prefix(wave, "t003") == f"{wave}/t003/"
    assert results.lease_key(wave, "t003") == f"{wave}/t003"
    assert results.sandbox_id("ref-t003", 12) == "ref-t003-a12"
    assert results.attempt_of("ref-t003-a12") == ("ref-t003", 12)
    assert results.attempt_of("t-a-b-a3") == ("t-a-b", 3)
    for bad in ("t003", "t003-a", "-a3", "t003-ax"):
        assert results.attempt_of(bad) is None, bad


def test_runner_logs_come_in_attempt_order(tmp_path):
    out = results.ResultsDir(tmp_path)
    for n in (10, 2, 1):
        out.runner_log(results.sandbox_id("t001", n)).parent.mkdir(parents=True)
        out.runner_log(results.sandbox_id("t001", n)).write_text(str(n))
    out.runner_log("t0011-a1").parent.mkdir(parents=True)  # another task whose id starts the same
    out.runner_log("t0011-a1").write_text("x")
    assert [p.read_text() for p in out.runner_logs("t001")] == ["1", "2", "10"]


def test_latest_points_at_the_newest_wave_and_a_real_dir_named_latest_is_left(tmp_path):
    for w in ("w-1", "w-2"):
        (tmp_path / w).mkdir()
        results.link_latest(tmp_path, tmp_path / w)
        assert (tmp_path / results.LATEST).resolve() == (tmp_path / w).resolve()
    other = tmp_path / "other"
    (other / results.LATEST).mkdir(parents=True)
    results.link_latest(other, other / "w-3")
    assert (other / results.LATEST).is_dir() and not (other / results.LATEST).is_symlink()


def test_the_architecture_map_lists_every_file_of_the_layout():
    """docs/architecture.md's results table is LAYOUT: a file added to one and not the other fails here."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| (.+?) \|$", text, re.M)
    assert rows, "docs/architecture.md has no results table"
    assert [name for name, _ in rows] == [name for name, _ in results.LAYOUT]


def test_no_file_name_of_the_layout_is_spelled_outside_results_py():
    names = {n for n in vars(results).values() if isinstance(n, str) and re.fullmatch(r"[\w.-]+\.(jsonl?|md|png|log|db)", n)}
    offenders = []
    for folder in ("cluster", "fleet", "faults", "storage"):
        for py in (ROOT / folder).rglob("*.py"):
            if py.name == "results.py":
                continue
            for line in py.read_text().splitlines():
                offenders += [f"{py.relative_to(ROOT)} {n}" for n in names if f'"{n}"' in line or f"'{n}'" in line]
    # left: the sandbox host names its runner's log, and fleet/markers.py the private dir's records that the sweeps
    # read (fleet/ may not import cluster/, so results.py re-exports those two; issue 17 moves the log)
    assert sorted(offenders) == ["fleet/markers.py credentials.json", "fleet/markers.py driver.json",
                                 "fleet/markers.py ray.json",
                                 "fleet/sandbox/spec.py runner.log"], offenders


@pytest.mark.skipif(not FIXTURE.is_dir(), reason="no stored wave fixture")
def test_regrading_a_wave_stored_before_results_py_gives_the_same_grades(tmp_path):
    """A wave graded on main before the results layout was defined once: re-graded from its stored files only,
    every grade file comes out byte for byte as it was stored (and plan, timeline and faults are read unchanged)."""
    d = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, d, symlinks=True)
    stored = {p.name: p.read_bytes() for p in results.ResultsDir(FIXTURE).grades()}
    assert stored
    result = grade_wave(d)
    assert {p.name: p.read_bytes() for p in results.ResultsDir(d).grades()} == stored
    assert {g["task_id"]: g["verdict"] for g in result["tasks"]} == {
        orjson.loads(b)["task_id"]: orjson.loads(b)["verdict"] for n, b in stored.items() if not n.startswith("ref-")}
    for name in (results.PLAN, results.FAULTS):
        assert orjson.loads((d / name).read_bytes()) == orjson.loads((FIXTURE / name).read_bytes())
    assert results.read_jsonl(d / results.TIMELINE) == results.read_jsonl(FIXTURE / results.TIMELINE)
