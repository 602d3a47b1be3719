"""The built-in workloads beyond patch-repo, on the real parts: a multi-file rename (`rename4`) that a
runner can tear, eight hunks (`hunks8`) whose duplicates still pass the code's tests, and a long shell
tool (`longtool`) that faults land in the middle of."""
from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from cluster.grade import exit_code

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DEFECTIVE = str(ROOT / "tests" / "runners" / "defective.py")
KILL_AFTER_ANSWER = {"PK1": {"after_model_calls": [2, 4]}}


def test_a_torn_multi_file_apply_is_caught_while_the_store_only_tests_pass(run_wave):
    runner = {"name": "defective-torn", "command": [sys.executable, DEFECTIVE], "env": {"DEFECT": "torn_apply"}}
    result, d = run_wave(runner=runner, seed=12, tasks=2, concurrency=2, faults="none",
                         workload={"name": "rename4", "steps": 6, "think_ms": 10}, deadline_s=60)
    for g in result["tasks"]:
        assert g["attempts"] >= 2, g["attempt_causes"]  # attempt 1 died halfway through the rename
        torn = g["checks"]["no_torn_apply"]
        assert torn["verdict"] == "fail", torn
        assert torn["tests"]["store-only"]["passed"] is True and torn["tests"]["contract"]["passed"] is False
        assert torn["torn"][0]["applied"] == ["svc/schema.py", "svc/store.py"], torn
        assert "no_torn_apply" in g["signature"]
    # its uninterrupted run is whole: the defect only shows when a kill tears the apply
    assert {g["checks"]["no_torn_apply"]["verdict"] for g in result["references"]} == {"pass"}
    assert exit_code(result) == 1


def test_durable_keeps_the_rename_whole_under_kills(run_wave):
    result, d = run_wave(runner="durable", seed=12, tasks=3, concurrency=3, faults="PK1",
                         fault_timing=KILL_AFTER_ANSWER, workload={"name": "rename4", "steps": 6, "think_ms": 10},
                         deadline_s=60)
    assert result["verdict"] == "pass", [(g["task_id"], g["signature"], g["checks"]) for g in result["tasks"]]
    for g in result["tasks"]:
        assert g["interrupted"] and g["checks"]["no_torn_apply"]["detail"].startswith("every multi-file apply")
        assert g["checks"]["no_torn_apply"]["tests"]["contract"]["passed"]


def test_a_duplicated_hunk_is_caught_and_longtool_kills_land_mid_tool(run_wave):
    # naive re-applies hunks after a kill: each duplicate still compiles, only its marker shows it. The kill lands
    # while the proxy holds naive's first progress save: three hunks applied and none saved, on every run
    result, d = run_wave(runner="naive", seed=5, tasks=3, concurrency=3, faults="PK1",
                         fault_timing={"PK1": {"at_request": {"methods": ["PUT"], "key_prefix": "naive/progress.json"}}},
                         workload={"name": "hunks8", "think_ms": 10}, deadline_s=60)
    twice = [g for g in result["tasks"] if g["checks"]["no_double_apply"]["verdict"] == "fail"]
    assert twice, [(g["task_id"], g["checks"]["no_double_apply"]) for g in result["tasks"]]
    assert all(g["checks"]["no_double_apply"]["applied_twice"] for g in twice)
    # longtool: PK5 kills right after durable announces `after-commit:<tool step>`, i.e. while the tool's
    # `sleep` runs; durable resumes and runs the tool once in the final workspace
    from faults.planner import task_seed
    from fleet import workloads

    wl, seed = workloads.get("longtool"), task_seed(8, 0)
    at = wl.tool_step(seed, 6)
    result, d = run_wave(runner="durable", seed=8, tasks=1, concurrency=1, faults="PK5",
                         fault_timing={"PK5": {"after_checkpoints": [at + 1, at + 1], "window": "after-commit:"}},
                         workload={"name": "longtool", "steps": 6, "think_ms": 10}, deadline_s=90)
    task = result["tasks"][0]
    assert result["verdict"] == "pass", task["checks"]
    rec = next(r for r in orjson.loads((d / "faults.json").read_bytes()) if r["task_id"] == task["task_id"])
    assert rec["status"] == "applied" and f"after-commit:{at}" in rec["detail"], rec
    log = (d / "sandboxes" / f"{task['task_id']}-a1" / "runner.log").read_text()
    assert f"step {at} committed" in log and f"before-model:{at + 1}" not in log, log[-2000:]
