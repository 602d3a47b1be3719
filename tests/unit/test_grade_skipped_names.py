"""A file whose name is not UTF-8 is left out of the artifact by the harness's capture (`read_tree`: no JSON record,
report or artifact can hold the name as it is), named escaped. Issue 42's last review, finding 5: the grader took
that skip for a cap the runner went past, so `completed` failed, and the fault-free reference of `oddname` (the
durable runner plus one such file) was "the runner fails on its own" (exit 1) for the harness's own skip. Now the
skip is named in the grade, and the checks judge what was captured; a real cap (depth, files, bytes) still fails."""
from __future__ import annotations

import shutil

import orjson
import pytest

from cluster import results
from cluster.grade import grade_wave
from tests.unit.test_grade_fuzz import FIXTURE

SKIP = "artifact capture skipped: a file name that is not UTF-8 (shown escaped)"
ODD = "odd\\xffname.txt"  # as the capture names it: the byte 0xff escaped


def _wave(tmp_path, capped: str, tasks=("ref-t000", "t000")):
    """The fixture, with the last exit-0 attempt of each task in `tasks` captured with `capped` and ODD skipped."""
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    lines = []
    for line in (d / results.TIMELINE).read_bytes().splitlines():
        e = orjson.loads(line)
        if e.get("event") == "attempt_end" and e.get("task") in tasks and e.get("exit_code") == 0:
            e["artifact"] = dict(e["artifact"], skipped=[ODD], capped=[capped])
        lines.append(orjson.dumps(e))
    (d / results.TIMELINE).write_bytes(b"\n".join(lines) + b"\n")
    for tid in tasks:
        m = d / "artifacts" / tid / "artifact.json"
        m.write_bytes(orjson.dumps(dict(orjson.loads(m.read_bytes()), skipped=[ODD], capped=[capped])))
    return d


def test_a_name_the_capture_cannot_hold_fails_no_reference_and_is_named(tmp_path):
    result = grade_wave(_wave(tmp_path, SKIP))
    assert not result["runner_failures"], result["runner_failures"]
    by = {g["task_id"]: g for g in result["tasks"] + result["references"]}
    for tid in ("ref-t000", "t000"):
        done = by[tid]["checks"]["completed"]
        assert done["verdict"] == "pass", (tid, done)
        assert ODD in done["detail"] and "not UTF-8" in done["detail"], done  # named, never silent
        assert done.get("left_out") == [ODD], done
    same = by["t000"]["checks"]["resume_equivalent"]
    if same["verdict"] == "pass":
        assert ODD in same["detail"] and "not compared" in same["detail"], same


@pytest.mark.parametrize("cap", ["artifact capture skipped: depth > 64", "artifact capture skipped: bytes > 33554432"])
def test_a_real_cap_still_fails_completed(tmp_path, cap):
    result = grade_wave(_wave(tmp_path, cap, tasks=("t000",)))
    done = next(g for g in result["tasks"] if g["task_id"] == "t000")["checks"]["completed"]
    assert done["verdict"] == "fail" and cap in done["detail"], done
