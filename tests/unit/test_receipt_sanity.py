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
from cluster.receipts import checked_receipts, receipts_of
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


PLAN = {"wave_id": "w1", "tasks": [{"task_id": "t0", "faults": [
    {"fault_id": "PK3", "instance": "t0-PK3", "task_id": "t0"}]}, {"task_id": "t1", "faults": []}], "references": []}
PK3 = {"fault_id": "PK3", "instance": "t0-PK3", "task_id": "t0", "status": "applied", "detail": "node lost",
       "target": {"sandbox_id": "t0-a1", "node": "node-1", "sandboxes": ["t0-a1", "t1-a2"]},
       "fired_at": 1000.0, "cleared_at": 1010.0, "evidence": {}}
SPINE = [{"event": "wave_start", "wall": 990.0}, {"event": "wave_end", "wall": 1100.0}]


def test_a_node_loss_that_took_another_tasks_sandbox_too_is_sane():
    assert checked_receipts([PK3], PLAN, SPINE) == ([PK3], [])


def test_clocks_that_differ_by_less_than_the_slack_are_not_named():
    r = dict(PK3, fired_at=989.5, cleared_at=1100.5)
    assert checked_receipts([r], PLAN, [SPINE[0], dict(SPINE[1], wall=1000.0)]) == ([r], [])


def test_a_timeline_with_no_end_or_no_readable_times_bounds_nothing_and_never_raises():
    late = dict(PK3, fired_at=5000.0, cleared_at=None)
    for spine in ([SPINE[0]], [], [{"event": "wave_start", "wall": "early"}, {"event": "wave_end"}], [None, 3]):
        assert checked_receipts([late], PLAN, spine) == ([late], []), spine


def test_every_wrong_thing_about_one_receipt_is_named_in_its_detail():
    bad = dict(PK3, fired_at=2000.0, cleared_at=900.0, target={"sandbox_id": "t1-a1", "key_prefix": "w1/t1/x"})
    (got,), left = checked_receipts([bad], PLAN, SPINE)
    assert left == [] and got["status"] == "unknown" and bad["status"] == "applied"
    for why in ("after the wave ended", "cleared_at 900.000 is before fired_at", "'t1-a1' is not a sandbox of task",
                "key_prefix 'w1/t1/x' is not under task 't0'", "it says applied (node lost)"):
        assert why in got["detail"], (why, got["detail"])


def test_a_receipt_a_resumed_wave_kept_from_its_timeline_is_sane(tmp_path):
    from tests.unit.test_receipt_fired_at import _resumed_receipts

    got = _resumed_receipts(tmp_path, {"fired_at": 1796219241.3, "target": {"sandbox_id": "t0-a1"}})
    plan = {"wave_id": "w", "tasks": [{"task_id": "t0", "faults": [
        {"fault_id": "PK1", "instance": "t0-PK1", "task_id": "t0"}]}], "references": []}
    timeline = results.read_jsonl(tmp_path / "w" / results.TIMELINE)
    assert [e["event"] for e in timeline][-1] == "wave_resumed"
    assert checked_receipts(receipts_of(got)[0], plan, timeline) == (got, [])


def test_the_task_page_shows_a_receipt_that_cannot_be_true_as_unknown(tmp_path, no_picture):  # noqa: F811
    from cluster.htmlreport import write_html

    d, recs, walls = _wave(tmp_path)
    recs[0]["fired_at"] = walls["wave_end"] + 3600
    result, _, _ = _graded(d, recs, "t000")
    write_html(d, result)
    page = (d / results.PAGES / "t000.html").read_text()
    table = page[page.index("<table id=receipts>"):]
    row = table[:table.index("</table>")]
    assert "<td>t000-PK1</td><td><span class='v unknown'>unknown</span>" in row and "after the wave ended" in row, row


A1_END = 1796219241.4768643  # the fixture's attempt t000-a1: killed by t000-PK1 (its timeline's attempt_end wall)


@pytest.mark.parametrize("sandbox,why", [("t000-a1", "after attempt t000-a1 ended"),
                                         ("t000-a2", "t000-a2 exited 0 and nothing killed it")])
def test_a_kill_that_fired_after_its_attempt_ended_is_unknown_never_pass(tmp_path, no_picture, sandbox, why):  # noqa: F811
    """H4: a kill that fired after the attempt it names had ended counted as exercised (the next attempt's store
    writes fell before its fire time), turning `not_applied` into pass; one naming the attempt that exited 0 with
    nothing killing it did too."""
    d, recs, _ = _wave(tmp_path)
    recs[0]["fired_at"], recs[0]["target"]["sandbox_id"] = A1_END + 2.5, sandbox
    result, check, summary = _graded(d, recs, "t000")
    assert check["verdict"] == "unknown", check
    assert "t000-PK1: unknown" in check["detail"] and why in check["detail"], check
    assert result["verdict"] != "pass" and "PK1 applied 0/1, unknown 1" in summary, summary
    assert "Resume survival rate 1/1" not in summary, summary


def test_a_kill_that_fired_within_the_clock_slack_of_its_attempts_end_is_sane(tmp_path):
    d, recs, _ = _wave(tmp_path)
    recs[0]["fired_at"] = A1_END + 0.5
    plan = orjson.loads((d / results.PLAN).read_bytes())
    assert checked_receipts(recs, plan, results.read_jsonl(d / results.TIMELINE)) == (recs, [])


ST = {"fault_id": "ST1", "instance": "t0-ST1", "task_id": "t0", "status": "applied", "detail": "3 request(s) 503",
      "target": {"bucket": "b", "key_prefix": "w1/t0/", "window_s": 1.0}, "fired_at": 1000.0, "cleared_at": 1010.0,
      "evidence": {"hits": 3, "matched": 3}}
ST_PLAN = {"wave_id": "w1", "tasks": [{"task_id": "t0", "faults": [
    {"fault_id": "ST1", "instance": "t0-ST1", "task_id": "t0"}]}], "references": []}


@pytest.mark.parametrize("change,why", [
    ({"target": None}, "names no key_prefix"), ({"target": {"bucket": "b"}}, "names no key_prefix"),
    ({"target": {"key_prefix": ["w1/t0/"]}}, "names no key_prefix"),
    ({"evidence": {"hits": 0}}, "evidence.hits 0"), ({"evidence": {"hits": -4}}, "evidence.hits -4"),
    ({"evidence": None}, "evidence.hits None"), ({"evidence": {"hits": "3"}}, "evidence.hits '3'")])
def test_an_applied_storage_fault_with_no_usable_target_or_no_hit_is_unknown(change, why):
    """M4: a storage fault's receipt with no key prefix it applied to, or no request it answered, still counted as
    applied. The harness writes every applied one with the task's prefix and at least one hit (faults/storage_faults.py),
    a resumed wave with its target and no count (test below)."""
    (got,), left = checked_receipts([dict(ST, **change)], ST_PLAN, SPINE)
    assert left == [] and got["status"] == "unknown" and why in got["detail"], got


def test_a_sane_or_not_applied_or_resumed_storage_receipt_is_kept_as_it_was():
    not_applied = dict(ST, status="not_applied", evidence={"hits": 0}, target={"bucket": "b", "key_prefix": None})
    # a resumed wave rebuilds a receipt from its timeline's fault_clear: the target, but no count of hits
    resumed = dict(ST, evidence={"from": "the timeline of the driver that died"})
    for r in (ST, not_applied, resumed):
        assert checked_receipts([r], ST_PLAN, SPINE) == ([r], [])


def test_a_kill_is_never_exercised_by_the_next_attempts_store_write():
    """H4's cause: the store writes counted for a kill ran from its attempt's start to the fire time, with no bound
    at the attempt's end, so the next attempt's writes made a kill that tested nothing count as exercised."""
    from types import SimpleNamespace

    from cluster.grade.runs import exercised

    facts = SimpleNamespace(starts={"t0-a1": {"attempt": 1, "wall": 10.0}, "t0-a2": {"attempt": 2, "wall": 11.6}},
                            attempts=[{"sandbox": "t0-a1", "attempt": 1, "ended_at": 11.4, "wall": 11.5}])
    kill = {"target": {"sandbox_id": "t0-a1"}, "fired_at": 12.3}
    h = SimpleNamespace(calls=[], effects=[], writes=[{"t": 12.0}])  # attempt 2's
    assert exercised(h, facts, kill) is None
    h.writes = [{"t": 11.0}]  # its own, before the kill
    assert exercised(h, facts, kill) == "the killed attempt had a store write answered"
    assert exercised(h, facts, dict(kill, fired_at=10.5)) is None  # that write came after an earlier kill
