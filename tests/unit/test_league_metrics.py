"""The league counts a kill as SUMMARY does: one that landed before the attempt did anything durable (the task
`not_applied`, its fault `not_exercised`) tested no recovery, so it is in neither Rcrash's numerator nor its n (the
agents' league once reported Temporal 9/12 where all 9 exercised kills passed)."""
from __future__ import annotations

from cluster.league import wave_metrics


def _grade(tid: str, verdict: str, not_exercised: list[str]) -> dict:
    return {"task_id": tid, "verdict": verdict, "interrupted": True, "ended": True, "not_exercised": not_exercised,
            "checks": {}, "attempts": 2, "model_recalls": 0, "wasted_calls": 0, "wasted_tokens": 0}


def test_a_kill_that_was_not_exercised_is_not_a_failed_recovery(tmp_path):
    grades = [_grade("t000", "pass", []), _grade("t001", "fail", []), _grade("t002", "not_applied", ["t002-PK1"])]
    result = {"wave_id": "w", "verdict": "fail", "tasks": grades,
              "plan": {"config": {"workload": {"steps": 4, "think_ms": 0}}}}
    m = wave_metrics(result, tmp_path)
    assert (m["interrupted"], m["survived"]) == (2, 1)
