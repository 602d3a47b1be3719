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


def test_pk4_crash_loop_then_left_alone_and_df1_disk_full(run_wave):
    result, d = run_wave(runner="durable", seed=4, faults=["PK4", "DF1"],
                         fault_timing={"PK4": {"kills": 3, "window_s": [0.4, 0.8]},
                                       "DF1": {"after_model_calls": [2, 3], "window_s": [1.5, 1.5]}}, **SMALL)
    assert result["verdict"] == "pass", [(g["task_id"], g["signature"], g["attempt_causes"]) for g in result["tasks"]]
    by_fault = {g["faults"][0]: g for g in result["tasks"]}
    rec = {r["fault_id"]: r for r in _receipts(d)}
    assert rec["PK4"]["status"] == "applied" and rec["PK4"]["detail"].startswith("3 of 3 attempts"), rec["PK4"]
    assert by_fault["PK4"]["attempts"] == 4
    assert by_fault["PK4"]["checks"]["retry_loop"]["verdict"] == "pass"  # the harness's kills are not a loop
    assert rec["DF1"]["status"] == "applied" and "ballast" in rec["DF1"]["detail"], rec["DF1"]
    df = by_fault["DF1"]
    assert any("workspace full" in c or "No space" in c for c in df["attempt_causes"]), df["attempt_causes"]
    assert df["checks"]["diagnosable"]["verdict"] == "pass"
