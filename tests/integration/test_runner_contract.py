"""What a runner owes the contract, seen from outside: it re-resolves its store key after a refusal (CR1), and a
spot notice (PK2) it handles is still the interruption it is. Runners of our own (tests/runners/defective.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from cluster import results

pytestmark = pytest.mark.integration
DEFECTIVE = str(Path(__file__).resolve().parents[2] / "tests" / "runners" / "defective.py")
CR1_TIMING = {"CR1": {"after_model_calls": [2, 3], "window_s": [0.4, 0.8]}}


def _receipts(d):
    return orjson.loads((d / "faults.json").read_bytes())


def _events(d):
    return results.read_jsonl(d / results.TIMELINE)


def test_a_runner_that_reads_its_key_once_is_a_named_fail_under_cr1_not_a_hollow_pass(run_wave):
    """The runner caches the key it read at its start. Under CR1 its attempt retries the rotated-away key every
    second, refused each time, and gives up (exit 1); the next attempt gets a fresh key and finishes. The silence
    watch counts those refused requests as the attempt's acts (liveness_s 4: it was ended as silent before), and
    the grade names the defect instead of passing the task."""
    runner = {"name": "key-cache", "command": [sys.executable, DEFECTIVE],
              "env": {"DEFECT": "key_cache", "KEY_CACHE_RETRY_S": "1", "KEY_CACHE_TRIES": "8"}}
    result, d = run_wave(runner=runner, tasks=2, concurrency=2, seed=8, faults=["CR1"], fault_timing=CR1_TIMING,
                         workload={"steps": 7, "think_ms": 60}, deadline_s=90, liveness_s=4)
    applied = {r["task_id"]: r for r in _receipts(d) if r["status"] == "applied"}
    assert applied, _receipts(d)
    events = _events(d)
    assert not [e for e in events if e["event"] == "attempt_silent"], "a refused request is not silence"
    for g in result["tasks"]:
        if g["task_id"] not in applied:
            continue
        checks = g["checks"]
        assert g["verdict"] == "fail" and "credentials_reresolved" in g["signature"].split("+"), \
            (g["task_id"], g["signature"], checks)
        detail = checks["credentials_reresolved"]["detail"]
        assert "never re-resolves its credentials" in detail and applied[g["task_id"]]["target"]["old_akid"][:8] \
            in detail, detail
        # the hollow pass it was: the next attempt, with a fresh key, finished the work
        assert checks["completed"]["verdict"] == "pass" and g["attempts"] == 2, (g["attempt_causes"], checks)
        assert checks["liveness"]["verdict"] == "pass" and checks["liveness"]["longest_silence_s"] < 4, checks
        assert checks["diagnosable"]["verdict"] == "pass" and "rotated away" in checks["diagnosable"]["detail"], \
            checks["diagnosable"]
    # the fault-free references of the same runner pass: the defect shows only when a key rotates
    assert all(g["verdict"] == "pass" for g in result["references"]), [(g["task_id"], g["signature"])
                                                                       for g in result["references"]]

    # an honest runner (durable re-resolves after every refusal) passes the same plan, the check included
    result, d = run_wave(runner="durable", tasks=2, concurrency=2, seed=8, faults=["CR1"], fault_timing=CR1_TIMING,
                         workload={"steps": 7, "think_ms": 60}, deadline_s=90, liveness_s=4)
    assert result["verdict"] == "pass", [(g["task_id"], g["signature"], g["checks"]) for g in result["tasks"]]
    for g in result["tasks"]:
        c = g["checks"]["credentials_reresolved"]
        assert c["verdict"] == "pass" and "first request with the new key" in c["detail"], c


def test_a_spot_notice_answered_by_exit_0_is_applied_and_the_unfinished_task_fails(run_wave):
    """PK2 against a runner whose SIGTERM handler exits 0 at once: the notice and the SIGTERM reached it, so the
    receipt is `applied` and says it exited within the grace with no SIGKILL (it said `not_applied`, "SIGKILL ...").
    Exit 0 says the task is done: its unfinished workspace is the artifact, so `completed` fails, and
    `resume_equivalent` fails rather than calling the difference the runner's non-determinism: the notice
    interrupted the task."""
    runner = {"name": "notice-exit0", "command": [sys.executable, DEFECTIVE], "env": {"DEFECT": "notice_exit0"}}
    timing = {"PK2": {"after_model_calls": [2, 3], "window_s": [2.0, 2.0]}}
    result, d = run_wave(runner=runner, tasks=2, concurrency=2, seed=3, faults=["PK2"], fault_timing=timing,
                         workload={"steps": 7, "think_ms": 60}, deadline_s=60)
    receipts = _receipts(d)
    assert len(receipts) == 2, receipts
    for r in receipts:
        assert r["status"] == "applied", r
        assert r["detail"].startswith("notice written to $SANDFLEET_NOTICE, SIGTERM delivered, 2.0 s grace: the "
                                      "runner exited 0 "), r["detail"]
        assert "within the grace: no SIGKILL was sent" in r["detail"] and "SIGKILL to every" not in r["detail"]
        assert r["target"]["exited_in_grace"] is True and r["target"]["sigkill"] is False, r["target"]
    ends = {e["task"]: e for e in _events(d) if e["event"] == "attempt_end"}
    for g in result["tasks"]:
        assert ends[g["task_id"]]["exit_code"] == 0 and ends[g["task_id"]]["killed_by"].endswith("PK2"), ends
        checks = g["checks"]
        assert g["verdict"] == "fail" and g["attempts"] == 1 and g["interrupted"], (g["task_id"], g["signature"])
        assert checks["fault_applied"]["verdict"] == "pass", checks["fault_applied"]
        assert checks["completed"]["verdict"] == "fail" and "without doing every step" in \
            checks["completed"]["detail"], checks["completed"]
        assert checks["completed"]["detail"].endswith(f"it exited 0 while being stopped ({g['task_id']}-PK2): exit 0 "
                                                      "says the task is done, exit non-zero to be resumed")
        assert checks["resume_equivalent"]["verdict"] == "fail", checks["resume_equivalent"]
    summary = (d / results.SUMMARY).read_text()
    assert "PK2 applied 2/2" in summary and "no task was interrupted" not in summary, summary
    assert result["verdict"] == "fail"
