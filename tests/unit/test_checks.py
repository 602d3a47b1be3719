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


def _cr1_history(old_key_until: float, new_key_from: float | None, published_at=95.5):
    """Attempt 1 (key A1) has its key rotated to A1b at 95 (published at `published_at`); it signs with the dead A1
    every second until `old_key_until` and with A1b from `new_key_from`; it exits 1 at 104 (the store's 403s in its
    last seconds); attempt 2 (key A2) finishes."""
    from cluster.grade import TaskHistory

    task = dict(TASK, faults=[{"fault_id": "CR1", "instance": "t000-CR1"}])
    events = [{"event": "attempt_start", "attempt": 1, "wall": 90.0, "sandbox": "t000-a1", "akid": "A1"},
              {"event": "key_rotated", "wall": 95.0, "sandbox": "t000-a1", "akid": "A1b", "old_akid": "A1"},
              {"event": "attempt_end", "attempt": 1, "sandbox": "t000-a1", "exit_code": 1, "ended_at": 104.0},
              {"event": "attempt_start", "attempt": 2, "wall": 105.0, "sandbox": "t000-a2", "akid": "A2"},
              {"event": "attempt_end", "attempt": 2, "sandbox": "t000-a2", "exit_code": 0, "ended_at": 120.0},
              {"event": "task_end", "state": "done"}]
    receipt = {"task_id": "t000", "instance": "t000-CR1", "fault_id": "CR1", "status": "applied", "detail": "ok",
               "fired_at": 95.0, "target": {"sandbox_id": "t000-a1", "old_akid": "A1", "new_akid": "A1b",
                                            "delay_s": 0.5, "published_at": published_at}}
    reqs = [{"t": 91.0, "akid": "A1", "method": "PUT", "key": "w/t000/journal/0", "status": 200}]
    t = 95.2
    while t <= old_key_until:
        reqs.append({"t": t, "akid": "A1", "method": "PUT", "key": "w/t000/journal/2", "status": 403})
        t += 1.0
    if new_key_from is not None:
        reqs.append({"t": new_key_from, "akid": "A1b", "method": "PUT", "key": "w/t000/journal/2", "status": 200})
    reqs.append({"t": 106.0, "akid": "A2", "method": "PUT", "key": "w/t000/journal/3", "status": 200})
    return TaskHistory(task=task, events=events, receipts=[receipt], calls=[], effects=[], writes=[],
                       requests=reqs, log_tails={1: "runner failed: ClientError"})


def test_credentials_reresolved_names_a_runner_that_kept_its_rotated_away_key_to_the_end_of_its_attempt():
    """CR1 with a runner that read its key once: refused every second after the new key was published, to the end of
    the attempt; the next attempt's fresh key finished the task (a hollow pass, now a named fail)."""
    got = _run("credentials_reresolved", _cr1_history(old_key_until=103.5, new_key_from=None))
    assert got["verdict"] == FAIL and "never re-resolves its credentials" in got["detail"], got
    assert "A1..." in got["detail"] and "7 request(s)" in got["detail"], got["detail"]
    # diagnosable names the store's refusals of the rotated-away key as attempt 1's cause, not "exit 1" alone
    d = _run("diagnosable", _cr1_history(old_key_until=103.5, new_key_from=None))
    assert d["verdict"] == PASS and "exit 1 after 9 store answer(s) 403" in d["detail"] \
        and "9 of them to requests signed with its key rotated away" in d["detail"], d


def test_credentials_reresolved_passes_a_runner_that_signed_with_the_new_key_once_published():
    got = _run("credentials_reresolved", _cr1_history(old_key_until=96.0, new_key_from=96.4))
    assert got["verdict"] == PASS and "first request with the new key 0.90 s after" in got["detail"], got
    # refused old-key requests that stopped well before the attempt's end (it went on with other work) are no run
    # to the end; and an attempt that ended before the new key was published had nothing to re-resolve to
    assert _run("credentials_reresolved", _cr1_history(old_key_until=97.5, new_key_from=None))["verdict"] == PASS
    idle = _run("credentials_reresolved", _cr1_history(old_key_until=103.5, new_key_from=None, published_at=None))
    assert idle["verdict"] == NOT_APPLIED and "before the new key was published" in idle["detail"], idle


def test_a_notice_answered_by_exit_0_is_an_interruption_and_completed_says_why_it_failed():
    """PK2's SIGTERM answered by an exit 0 in the grace: the task ended (exit 0 says done) with its work unfinished.
    The task counts as interrupted, and `completed` says the exit 0 came while it was being stopped."""
    from cluster.grade import grade_task
    from tests.unit.test_workload import apply_script

    from tests.unit.test_grade import SEED

    events = [{"event": "attempt_start", "attempt": 1, "wall": 90.0, "sandbox": "t000-a1"},
              {"event": "attempt_end", "attempt": 1, "sandbox": "t000-a1", "exit_code": 0, "killed_by": "t000-PK2",
               "ended_at": 95.0},
              {"event": "task_end", "state": "done"}]
    h = hist(events=events, artifact=apply_script(SEED, 3))
    facts = checks.Facts.of(h)
    assert facts.interrupted == [] and facts.was_interrupted and [a["attempt"] for a in facts.noticed] == [1]
    g = grade_task(h)
    assert g["interrupted"] and g["checks"]["completed"]["verdict"] == FAIL, g["checks"]["completed"]
    assert g["checks"]["completed"]["detail"].endswith("it exited 0 while being stopped (t000-PK2): exit 0 says the "
                                                       "task is done, exit non-zero to be resumed")
