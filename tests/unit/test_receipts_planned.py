"""A fault receipt that answers no planned fault is named and left out, never counted as a fault that applied."""
from __future__ import annotations

import shutil

import orjson

from cluster import results
from cluster.grade import grade_wave
from cluster.receipts import planned_receipts
from cluster.report import write_summary
from tests.unit.test_grade_fuzz import FIXTURE, no_picture  # noqa: F401 - a fixture, used by name


def test_a_receipt_whose_fault_id_matches_no_planned_fault_is_named_not_counted(tmp_path, no_picture):  # noqa: F811
    """A hostile review's find: faults.json with `[0].fault_id` "x" was counted ("x applied 1/1")."""
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    recs = orjson.loads((d / results.FAULTS).read_bytes())
    planned_as, instance = recs[0]["fault_id"], recs[0]["instance"]
    recs[0]["fault_id"] = "x"
    (d / results.FAULTS).write_bytes(orjson.dumps(recs))
    result = grade_wave(d)
    summary = write_summary(d, result).read_text()
    assert "x applied" not in summary
    assert f"receipt ({instance}): fault_id 'x', but the plan's is '{planned_as}'" in summary, summary
    g = next(g for g in result["tasks"] if g["task_id"] == recs[0]["task_id"])
    assert g["checks"]["fault_applied"]["verdict"] != "pass"


def test_planned_receipts_names_an_instance_the_plan_never_had():
    plan = {"tasks": [{"task_id": "t0", "faults": [{"fault_id": "PK1", "instance": "t0-PK1", "task_id": "t0"}]}]}
    rec = {"fault_id": "PK1", "instance": "t9-PK1", "task_id": "t9", "status": "applied"}
    kept, left = planned_receipts([rec], plan)
    assert kept == [] and "matches no planned fault" in left[0]
    ok = dict(rec, instance="t0-PK1", task_id="t0")
    assert planned_receipts([ok], plan) == ([ok], [])
