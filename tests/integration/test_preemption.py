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
