"""The preemption family beyond PK1, and a full disk, on the process backend: PK2 spot notice (notice file,
SIGTERM, grace, SIGKILL), PK4 crash loop, DF1 disk full."""
from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.integration
DEFECTIVE = str(Path(__file__).resolve().parents[2] / "tests" / "runners" / "defective.py")
SMALL = dict(tasks=2, concurrency=2, workload={"steps": 7, "think_ms": 60}, deadline_s=60)


def _receipts(d):
    return orjson.loads((d / "faults.json").read_bytes())


def test_pk2_announces_the_interruption_then_terminates(run_wave):
    runner = {"name": "notice-reader", "command": [sys.executable, DEFECTIVE], "env": {"DEFECT": "notice"}}
    timing = {"PK2": {"after_model_calls": [2, 4], "window_s": [1.0, 1.0]}}
    result, d = run_wave(runner=runner, seed=3, faults=["PK2"], fault_timing=timing, **SMALL)
    assert result["verdict"] == "pass", [(g["task_id"], g["signature"]) for g in result["tasks"]]
    for r in _receipts(d):
        assert r["status"] == "applied" and "notice written" in r["detail"], r
    for g in result["tasks"]:
        log = (d / "sandboxes" / f"{g['task_id']}-a1" / "runner.log").read_text()
        notice = orjson.loads(log.split("notice: ", 1)[1].splitlines()[0])
        assert notice["action"] == "terminate" and notice["grace_s"] == 1.0
        assert g["attempts"] == 2


def test_pk4_crash_loop_then_left_alone(run_wave):
    result, d = run_wave(runner="durable", seed=4, faults=["PK4"], tasks=2, concurrency=2,
                         fault_timing={"PK4": {"kills": 3, "window_s": [0.3, 0.4]}},
                         workload={"steps": 8, "think_ms": 200}, deadline_s=60)
    assert result["verdict"] == "pass", [(g["task_id"], g["signature"], g["attempt_causes"]) for g in result["tasks"]]
    landed = {}
    for r in _receipts(d):
        landed[r["task_id"]] = sum(1 for k in r["evidence"]["kills"] if k["applied"])
        # a task that finishes between two kills ends the loop early; the kills that landed are counted
        assert r["status"] == "applied" and r["detail"].startswith(f"{landed[r['task_id']]} of 3 attempts"), r
    for g in result["tasks"]:
        assert landed[g["task_id"]] >= 2 and g["attempts"] == landed[g["task_id"]] + 1, (landed, g["attempt_causes"])
        assert g["checks"]["retry_loop"]["verdict"] == "pass"  # the harness's kills are not the runner's loop


def test_df1_fills_the_workspace_and_durable_does_the_step_again(run_wave):
    """DF1 right after the answer of longtool's shell step, for longer than the tool runs: its output file
    cannot be created (real ENOSPC), durable fails the attempt on the failed tool and its next attempt, in a
    fresh workspace, finishes with the same artifact as an uninterrupted run."""
    from faults.planner import task_seed
    from fleet import workloads

    seed = task_seed(6, 0)
    at = workloads.get("longtool").tool_step(seed, 6)
    result, d = run_wave(runner="durable", seed=6, tasks=1, concurrency=1, faults=["DF1"],
                         fault_timing={"DF1": {"after_model_calls": [at + 1, at + 1], "window_s": [6.0, 6.0]}},
                         workload={"name": "longtool", "steps": 6, "think_ms": 20}, deadline_s=90)
    g = result["tasks"][0]
    assert result["verdict"] == "pass", (g["signature"], g["attempt_causes"])
    rec = _receipts(d)[0]
    assert rec["status"] == "applied" and "left 0 bytes free" in rec["detail"], rec
    assert g["attempts"] == 2 and "workspace full" in g["attempt_causes"][0], g["attempt_causes"]
    assert g["checks"]["diagnosable"]["verdict"] == "pass"
    log = (d / "sandboxes" / f"{g['task_id']}-a1" / "runner.log").read_text()
    assert "tool run_command failed" in log  # sh's echo met ENOSPC (dash reports it as an I/O error)


PK6 = dict(tasks=3, concurrency=3, faults=["PK6"], lease_ttl_s=2.0, deadline_s=90,
           fault_timing={"PK6": {"after_model_calls": [2, 3]}}, workload={"steps": 6, "think_ms": 80})


def test_pk6_a_thawed_zombie_is_fenced(run_wave):
    """Frozen past its lease, abandoned, a new attempt takes the task, the old sandbox is thawed: whatever the
    zombie then does is refused (revoked key at the store and the services) and the task passes."""
    result, d = run_wave(runner="durable", seed=4, **PK6)
    grades = {g["task_id"]: g for g in result["tasks"]}
    checks = [g["checks"]["fenced_writes_rejected"] for g in grades.values()]
    assert all(c["verdict"] in ("pass", "not_applied") for c in checks), checks
    assert any(c["verdict"] == "pass" for c in checks), checks  # at least one zombie really tried and was refused
    for r in _receipts(d):
        assert r["status"] == "applied" and r["target"]["newer"], r
        tid, zombie = r["task_id"], r["target"]["zombie"]
        tl = [orjson.loads(x) for x in (d / "timeline.jsonl").read_bytes().splitlines()]
        end = next(e for e in tl if e["event"] == "attempt_end" and e["sandbox"] == zombie)
        assert end["cause"].startswith("killed: frozen") and end["killed_by"] == r["instance"]
        assert any(e["event"] == "zombie_end" and e["sandbox"] == zombie for e in tl)
        # the ledger: the zombie's lease expired (no one renewed it) before the next fence was handed out
        led = [orjson.loads(x) for x in (d / "ledger.jsonl").read_bytes().splitlines()]
        ev = [e for e in led if e["kind"] == "event" and e["task_id"].endswith("/" + tid)]
        assert [e["event"] for e in ev if e["fence"] == 1][:2] == ["acquired", "expired"], ev
        assert grades[tid]["verdict"] in ("pass", "not_applied"), grades[tid]["checks"]
    # the new attempt found the zombie's lease busy until it ran out, and tried again each second with the key
    # it had: one store key per attempt, every one revoked
    tl = [orjson.loads(x) for x in (d / "timeline.jsonl").read_bytes().splitlines()]
    assert any(e["event"] == "lease_busy" for e in tl)
    starts = sum(1 for e in tl if e["event"] == "attempt_start")
    keys = next(e for e in tl if e["event"] == "store_keys")
    assert keys["issued"] == starts and keys["revoked"] == starts, (keys, starts)


def test_pk6_broken_fencing_is_caught(run_wave, monkeypatch):
    """Negative control: the same waves with the harness's revocation switched off (an attempt's keys outlive its
    lease). A zombie whose calls are then answered must turn fenced_writes_rejected red."""
    from cluster.wave.access import Access

    monkeypatch.setattr(Access, "revoke", lambda self, sandbox_id, keep_files=False: None)
    result, d = run_wave(runner="durable", seed=4, **PK6)
    checks = [g["checks"]["fenced_writes_rejected"] for g in result["tasks"]]
    assert any(c["verdict"] == "fail" for c in checks), checks
    assert result["verdict"] == "fail"
