"""Single checks of the grader's registry (cluster/grade/checks.py), called directly on synthetic histories."""
from __future__ import annotations

from cluster.grade import checks
from cluster.grade.verdicts import FAIL, NOT_APPLIED, PASS
from tests.unit.test_grade import EFFECTS, TASK, hist


def _run(name: str, h) -> dict:
    check = next(c for c in checks.REGISTRY if c.name == name)
    return check.fn(h, checks.Facts.of(h))


def test_no_double_apply_alone_catches_an_effect_applied_twice():
    twice = EFFECTS + [dict(EFFECTS[0], attempt=2, t=EFFECTS[0]["t"] + 20)]
    got = _run("no_double_apply", hist(effects=twice))
    assert got["verdict"] == FAIL and got["effects_applied_twice"] == [EFFECTS[0]["effect_id"]]
    assert _run("no_double_apply", hist())["verdict"] == PASS


def test_attempt_budget_alone():
    h = hist()
    h.limits = {"max_attempts": 2}
    assert _run("attempt_budget", h)["verdict"] == PASS
    h.events = [e if e["event"] != "task_end" else {"event": "task_end", "state": "failed", "why": "max"}
                for e in h.events]
    assert _run("attempt_budget", h)["verdict"] == FAIL


def test_which_checks_apply_comes_from_the_catalog_not_from_fault_ids():
    """PK6 brings fenced_writes_rejected through its catalog entry (adds_checks); a reference has no resume or
    fault check; a workload without multi-file applies has no torn-apply check."""
    names = lambda h: [c.name for c in checks.applicable(h, checks.Facts.of(h))]  # noqa: E731
    plain = hist()
    assert "fenced_writes_rejected" not in names(plain) and "no_torn_apply" not in names(plain)
    pk6 = hist()
    pk6.task = dict(TASK, faults=[{"fault_id": "PK6", "instance": "t000-PK6"}])
    assert "fenced_writes_rejected" in names(pk6)
    ref = hist()
    ref.task = dict(TASK, role="reference", faults=[])
    assert "resume_equivalent" not in names(ref) and "fault_applied" not in names(ref)
    assert checks.kills_attempt("PK1") and checks.kills_attempt("PK2") and checks.kills_attempt("PK5")
    assert not checks.kills_attempt("PK3") and not checks.kills_attempt("PK6") and not checks.kills_attempt("ST1")
    assert checks.takes_node("PK3") and not checks.takes_node("PK1")


def test_fenced_writes_rejected_alone_without_a_zombie_is_not_applied():
    h = hist()
    h.task = dict(TASK, faults=[{"fault_id": "PK6", "instance": "t000-PK6"}])
    assert _run("fenced_writes_rejected", h)["verdict"] == NOT_APPLIED


def test_completed_fails_when_a_cap_of_the_read_back_left_files_out():
    h = hist()
    assert _run("completed", h)["verdict"] == PASS
    h.events = list(h.events)  # (the synthetic history's list is shared with other tests)
    last = max((i for i, e in enumerate(h.events) if e["event"] == "attempt_end"))
    h.events[last] = dict(h.events[last], artifact={"captured": True, "skipped": ["d/d"],
                                                     "capped": ["artifact capture skipped: depth > 64"]})
    got = _run("completed", h)
    assert got["verdict"] == FAIL and "artifact capture skipped: depth > 64" in got["detail"], got
