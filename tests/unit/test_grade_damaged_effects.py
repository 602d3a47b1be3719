"""A hostile review's find: the grader read effects.jsonl as None both when it is missing and when it is damaged,
so a damaged effects log made `completed` FAIL ("effects missing") for every task; damaged is `unknown`, with why."""
from __future__ import annotations

import shutil
from pathlib import Path

from cluster import results
from cluster.grade import grade_wave

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "wave-before-results-py"


def _completed(d: Path) -> dict:
    r = grade_wave(d)
    return {g["task_id"]: g["checks"]["completed"] for g in r["tasks"] + r["references"]}


def test_a_damaged_effects_log_makes_completed_unknown_not_fail(tmp_path):
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    assert {c["verdict"] for c in _completed(d).values()} == {"pass"}
    with open(d / results.EFFECTS, "ab") as f:
        f.write(b'garbage\n{"t": 1}\n')
    got = _completed(d)
    assert {c["verdict"] for c in got.values()} == {"unknown"}, got
    assert all("effects.jsonl is unreadable" in c["detail"] for c in got.values()), got


def test_an_effects_log_that_lost_lines_makes_completed_unknown(tmp_path):
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    lines = (d / results.EFFECTS).read_bytes().splitlines(keepends=True)
    (d / results.EFFECTS).write_bytes(b"".join(lines[1:]))  # the driver's counts no longer add up
    got = _completed(d)
    assert "unknown" in {c["verdict"] for c in got.values()} and "fail" not in {c["verdict"] for c in got.values()}


def test_a_missing_effects_log_is_still_effects_missing(tmp_path):
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    (d / results.EFFECTS).unlink()
    got = _completed(d)
    assert {c["verdict"] for c in got.values()} == {"fail"} and all(c["missing_effects"] for c in got.values())
