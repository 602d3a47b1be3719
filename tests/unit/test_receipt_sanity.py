"""A receipt that cannot be true is no evidence that a fault applied (a hostile review's finds). faults.json is the
injector's, but its folder can be edited, and a resumed wave writes receipts too: a receipt that fired after the
wave's end or before its start, one whose target is another task's, one cleared before it fired, and a second
receipt for the same planned fault were each counted as `applied`. Now each is named and its task's `fault_applied`
is `unknown`, never pass. A kill whose receipt names no sandbox was counted as exercised; it now shows nothing."""
from __future__ import annotations

import shutil

import orjson
import pytest

from cluster import results
from cluster.grade import grade_wave
from cluster.league import wave_metrics
from cluster.receipts import checked_receipts
from cluster.report import write_summary
from tests.unit.test_grade_fuzz import FIXTURE, no_picture  # noqa: F401 - a fixture, used by name


def _wave(tmp_path):
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    recs = orjson.loads((d / results.FAULTS).read_bytes())
    events = results.read_jsonl(d / results.TIMELINE)
    walls = {e["event"]: e["wall"] for e in events if e["event"] in ("wave_start", "wave_end")}
    assert [r["instance"] for r in recs] == ["t000-PK1", "t001-ST1"] and all(r["status"] == "applied" for r in recs)
    return d, recs, walls


def _graded(d, recs: list[dict], task: str) -> tuple[dict, dict, str]:
    (d / results.FAULTS).write_bytes(orjson.dumps(recs))
    result = grade_wave(d)
    g = next(g for g in result["tasks"] if g["task_id"] == task)
    return result, g["checks"]["fault_applied"], write_summary(d, result).read_text()


@pytest.mark.parametrize("when,why", [("end", "after the wave ended"), ("start", "before the wave started")])
def test_a_receipt_that_fired_outside_the_wave_is_unknown_not_applied(tmp_path, no_picture, when, why):  # noqa: F811
    d, recs, walls = _wave(tmp_path)
    recs[0]["fired_at"] = walls["wave_end"] + 3600 if when == "end" else walls["wave_start"] - 3600
    _, check, summary = _graded(d, recs, "t000")
    assert check["verdict"] == "unknown", check
    assert "t000-PK1: unknown" in check["detail"] and why in check["detail"], check
    assert "PK1 applied 0/1, unknown 1" in summary, summary


def test_a_receipt_whose_target_is_another_tasks_sandbox_is_unknown(tmp_path, no_picture):  # noqa: F811
    d, recs, _ = _wave(tmp_path)
    recs[0]["target"]["sandbox_id"] = "t001-a1"
    _, check, summary = _graded(d, recs, "t000")
    assert check["verdict"] == "unknown", check
    assert "t000-PK1: unknown" in check["detail"] and "'t001-a1'" in check["detail"], check
    assert "PK1 applied 0/1, unknown 1" in summary, summary


def test_a_receipt_whose_key_prefix_is_another_tasks_is_unknown(tmp_path, no_picture):  # noqa: F811
    d, recs, _ = _wave(tmp_path)
    recs[1]["target"]["key_prefix"] = recs[1]["target"]["key_prefix"].replace("/t001/", "/t000/")
    _, check, _ = _graded(d, recs, "t001")
    assert check["verdict"] == "unknown", check
    assert "t001-ST1: unknown" in check["detail"] and "key_prefix" in check["detail"], check


def test_a_receipt_cleared_before_it_fired_is_unknown(tmp_path, no_picture):  # noqa: F811
    d, recs, _ = _wave(tmp_path)
    recs[1]["cleared_at"] = recs[1]["fired_at"] - 60
    _, check, summary = _graded(d, recs, "t001")
    assert check["verdict"] == "unknown", check
    assert "t001-ST1: unknown" in check["detail"] and "cleared_at" in check["detail"], check
    assert "ST1 applied 0/1, unknown 1" in summary, summary


def test_a_second_receipt_for_the_same_planned_fault_is_named_not_counted(tmp_path, no_picture):  # noqa: F811
    d, recs, _ = _wave(tmp_path)
    recs.append(dict(recs[0], status="not_applied", detail="a second word on the same kill"))
    result, check, summary = _graded(d, recs, "t000")
    assert check["verdict"] == "unknown", check
    assert "t000-PK1: unknown" in check["detail"] and "2 receipts" in check["detail"], check
    assert "PK1 applied 0/1, unknown 1" in summary, summary
    assert "receipt (t000-PK1): a second receipt for the same planned fault" in summary, summary


def test_checked_receipts_keeps_a_sane_receipt_as_it_was(tmp_path):
    d, recs, _ = _wave(tmp_path)
    plan = orjson.loads((d / results.PLAN).read_bytes())
    assert checked_receipts(recs, plan, results.read_jsonl(d / results.TIMELINE)) == (recs, [])


def test_a_kill_that_names_no_sandbox_is_not_counted_as_exercised(tmp_path, no_picture):  # noqa: F811
    d, recs, _ = _wave(tmp_path)
    recs[0]["target"] = {}
    result, check, summary = _graded(d, recs, "t000")
    assert check["verdict"] == "unknown", check
    assert "t000-PK1" in check["detail"] and "names no sandbox" in check["detail"], check
    g = next(g for g in result["tasks"] if g["task_id"] == "t000")
    assert g["interrupted"] and g["kill_not_shown"] == ["t000-PK1"] and g["not_exercised"] == [], g
    # neither SUMMARY's survival rate nor the league counts it as a kill that interrupted a run
    assert "1 task(s) left out: their kill names no sandbox" in summary, summary
    assert wave_metrics(result, d)["interrupted"] == 0
