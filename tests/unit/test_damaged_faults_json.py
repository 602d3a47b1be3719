"""A damaged `faults.json` (issue 42's last hostile review, finding 1): truncated, not a list, entries of the wrong
shape, numbers no clock gives. `sandfleet report` (and the grade behind it) named the file nowhere and ended in a
traceback (`_fault_coverage` indexing a receipt that is a number). Now the file and what is wrong with it are named
in SUMMARY.md and the grades, the rest of SUMMARY.md is written, and a planned fault whose receipt cannot be read
is `unknown`, never `pass` or `not_applied`."""
from __future__ import annotations

import shutil

import orjson
import pytest

from cluster import results
from tests.unit.test_damaged_files_fuzz import _cli
from tests.unit.test_grade_fuzz import FIXTURE, no_picture  # noqa: F401 - a fixture, used by name


def _receipts() -> list[dict]:
    return orjson.loads((FIXTURE / results.FAULTS).read_bytes())


def _huge(rs: list[dict]) -> list[dict]:
    return [dict(rs[0], fired_at=1e300), dict(rs[1], cleared_at=-1e300)]


DAMAGE = {  # name: (the bytes of faults.json, what SUMMARY.md must say of it)
    "truncated": (orjson.dumps(_receipts())[:100], "not valid JSON"),
    "an object": (b'{"fault_id": "PK1"}', "not a list"),
    "numbers": (b"[1, 2, 3]", "record 1"),
    "wrong shape": (orjson.dumps([dict(r, fault_id=["PK1"], status={"x": 1}) for r in _receipts()]), "fault_id"),
    "huge numbers": (orjson.dumps(_huge(_receipts())), "fired_at"),
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_faults_json_is_named_and_the_summary_still_written(tmp_path, monkeypatch, no_picture,  # noqa: F811
                                                                       how):
    monkeypatch.setenv("SANDFLEET_SEAL_KEY", str(tmp_path / "seal.key"))
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    data, said = DAMAGE[how]
    (d / results.FAULTS).write_bytes(data)
    (d / results.SUMMARY).unlink()
    code, out, err = _cli("report", d)
    assert code == 2, (code, out, err)  # every planned fault's receipt is damaged: the wave cannot say it tested them
    summary = (d / results.SUMMARY).read_text()
    assert "faults.json" in summary and said in summary, summary
    assert "## Tasks" in summary and "## Durability" in summary  # the rest of it is there
    for tid in ("t000", "t001"):
        g = orjson.loads((d / f"{tid}.grade.json").read_bytes())
        fa = g["checks"]["fault_applied"]
        assert fa["verdict"] == "unknown" and "faults.json" in fa["detail"], fa
        assert g["verdict"] == "unknown", g["verdict"]
    index = (d / results.INDEX_HTML).read_text()
    assert "not drawn" not in index


def test_one_damaged_receipt_leaves_the_others_graded(tmp_path, no_picture):  # noqa: F811
    from cluster.grade import grade_wave
    from cluster.report import write_summary

    whole = tmp_path / "whole"
    shutil.copytree(FIXTURE, whole)
    t000 = next(g for g in grade_wave(whole)["tasks"] if g["task_id"] == "t000")["checks"]["fault_applied"]
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    rs = _receipts()
    (d / results.FAULTS).write_bytes(orjson.dumps([rs[0], dict(rs[1], task_id=7)]))
    result = grade_wave(d)
    by = {g["task_id"]: g for g in result["tasks"]}
    assert by["t000"]["checks"]["fault_applied"]["verdict"] == t000["verdict"] != "unknown"  # its receipt stands
    fa = by["t001"]["checks"]["fault_applied"]
    assert fa["verdict"] == "unknown" and "record 2" in fa["detail"] and "task_id" in fa["detail"], fa
    write_summary(d, result)
    summary = (d / results.SUMMARY).read_text()
    assert "PK1 applied 1/1" in summary and "faults.json" in summary and "record 2" in summary, summary


@pytest.mark.parametrize("name", [results.SANDBOX_SWEEP, results.SWEEPER, results.STORE_AUDIT])
def test_a_report_of_another_shape_is_named_and_its_check_unknown(tmp_path, monkeypatch, no_picture,  # noqa: F811
                                                                  name):
    """The same review's kind of find, for the other JSON reports a grade reads: a sweep's or the audit's report that
    is a list ended `report` with "AttributeError: 'list' object has no attribute 'get'", naming no file."""
    monkeypatch.setenv("SANDFLEET_SEAL_KEY", str(tmp_path / "seal.key"))
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    (d / name).write_bytes(b"[1]")
    code, out, err = _cli("report", d)
    assert code == 2 and "AttributeError" not in err, (code, out, err)
    summary = (d / results.SUMMARY).read_text()
    assert f"`{name}`: unreadable: a JSON list" in summary, summary
    v = orjson.loads((d / results.VERDICT).read_bytes())
    assert v["verdict"] != "pass"
    check = "store_audit" if name == results.STORE_AUDIT else "no_leaked_sandbox"
    assert orjson.loads((d / "t000.grade.json").read_bytes())["inputs"]["unreadable"][name]
    from cluster.grade import grade_wave
    assert grade_wave(d)["wave_checks"][check] == "unknown"
