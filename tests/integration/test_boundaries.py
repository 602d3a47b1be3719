"""Faults at the runner's own boundaries: boundary enumeration kills one task at every model answer,
external effect and store write (ambiguous and after) of an uninterrupted run, so a runner's gap between
an effect and its commit is found on every wave, not by the luck of a clock; durable survives them all."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from cluster.grade import exit_code

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DEFECTIVE = str(ROOT / "tests" / "runners" / "defective.py")
# 4 steps: two patches, a publish (the effect boundary) and a patch; a snapshot after step 2 (multipart writes)
STEPS = 4
WAVE = dict(enumerate_boundaries=True, concurrency=4, workload={"steps": STEPS, "think_ms": 20}, deadline_s=60)


def _gcs_address() -> str:
    import ray

    return ray.get_runtime_context().gcs_address


def _receipts(d):
    return {r["task_id"]: r for r in orjson.loads((d / "faults.json").read_bytes())}


def test_durable_passes_a_kill_at_every_boundary(run_wave):
    result, d = run_wave(runner="durable", seed=31, **WAVE)
    plan = orjson.loads((d / "plan.json").read_bytes())
    counts = plan["enumerate"]["counts"]
    assert counts["model_call"] == STEPS + 1 and counts["effect"] >= 1 and counts["store_write"] >= 6, counts
    kinds = [t["boundary"]["kind"] for t in plan["tasks"]]
    assert len(plan["tasks"]) == counts["model_call"] + counts["effect"] + 2 * counts["store_write"]
    assert {"model_call", "effect", "store_write"} <= set(kinds)
    assert {t["seed"] for t in plan["tasks"]} == {plan["references"][0]["seed"]}
    receipts = _receipts(d)
    by_id = {g["task_id"]: g for g in result["tasks"]}
    for t in plan["tasks"]:
        g, r = by_id[t["task_id"]], receipts[t["task_id"]]
        assert g["verdict"] != "fail", (t["boundary"], g["signature"], g["checks"])
        if g["verdict"] != "pass":  # only a kill that could not land: the runner had already exited 0
            assert r["status"] == "not_applied" and "exited 0" in r["detail"], (t["boundary"], r)
    applied = [r for r in receipts.values() if r["status"] == "applied"]
    assert len(applied) >= len(plan["tasks"]) - 2
    ambiguous = [receipts[t["task_id"]] for t in plan["tasks"] if t["boundary"]["variant"] == "ambiguous"]
    assert any("ambiguous commit" in r["detail"] for r in ambiguous)


def test_an_effect_sent_before_its_commit_is_caught_at_every_effect_boundary(run_wave):
    runner = {"name": "defective-effect_gap", "command": [sys.executable, DEFECTIVE], "env": {"DEFECT": "effect_gap"}}
    result, d = run_wave(runner=runner, seed=31, **WAVE)
    plan = orjson.loads((d / "plan.json").read_bytes())
    by_id = {g["task_id"]: g for g in result["tasks"]}
    at_effects = [t["task_id"] for t in plan["tasks"] if t["boundary"]["kind"] == "effect"]
    assert at_effects, "the runner's effects were not enumerated"
    for tid in at_effects:  # the kill lands in the gap every time: the effect is sent twice
        g = by_id[tid]
        assert g["checks"]["no_double_apply"]["verdict"] == "fail", (tid, g["checks"]["no_double_apply"])
    # the reference (uninterrupted) run of the same runner passes: the defect only shows under a kill
    assert all(g["verdict"] == "pass" for g in result["references"])
    assert exit_code(result) == 1
    # the failure's replay command runs that task again with the same plan, and it fails the same way
    tid = at_effects[0]
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "replay", str(d / tid), "--address",
                        _gcs_address(), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "sandfleet wave replay " in (d / "SUMMARY.md").read_text()
    new = Path(next(l for l in r.stdout.splitlines() if l.startswith("SUMMARY: "))[len("SUMMARY: "):]).parent
    replay = orjson.loads((new / "plan.json").read_bytes())
    original = next(t for t in plan["tasks"] if t["task_id"] == tid)
    assert replay["replay_of"] == {"wave_id": plan["wave_id"], "task_id": tid}
    assert [t["task_id"] for t in replay["tasks"]] == [tid]
    assert {k: v for k, v in replay["tasks"][0].items() if k != "reference"} == \
        {k: v for k, v in original.items() if k != "reference"}
    g = orjson.loads((new / f"{tid}.grade.json").read_bytes())
    # the same defect is caught again (whether the kill also beat the journal commit, adding a recall, is
    # a race between the kill and a runner that does not wait: the plan is the same, not the timing)
    assert "no_double_apply" in g["signature"] and "no_double_apply" in by_id[tid]["signature"]


def test_a_kill_while_the_runner_is_still_starting_is_not_exercised(run_wave):
    """PK1 at 0.3-0.6 s lands while the runner is still importing (2 s before its first call): the kill is
    applied but tests nothing, so it is `not_exercised`, never counted as a survived interruption."""
    runner = {"name": "defective-slow_start", "command": [sys.executable, DEFECTIVE], "env": {"DEFECT": "slow_start"}}
    result, d = run_wave(runner=runner, tasks=2, concurrency=2, seed=33, faults=["PK1"],
                         fault_timing={"PK1": {"at_s": [0.3, 0.6]}}, workload={"steps": 4, "think_ms": 20},
                         deadline_s=90)
    receipts = _receipts(d)
    for g in result["tasks"]:
        assert receipts[g["task_id"]]["status"] == "applied"
        c = g["checks"]["fault_applied"]
        assert c["verdict"] == "not_applied" and "not_exercised" in c["detail"], c
        assert g["not_exercised"] == [f"{g['task_id']}-PK1"]
        assert g["checks"]["completed"]["verdict"] == "pass"  # the next attempt did the work
    summary = (d / "SUMMARY.md").read_text()
    assert "2 task(s) left out: their kill was not exercised" in summary
    assert exit_code(result) == 2


def test_named_windows_and_several_kills_in_one_task(run_wave):
    """PK5 kills right after the runner's Nth announced window; `kills: 2` puts two kills in one task.
    durable survives two kills right after its commits; naive, killed twice right before asking the
    model, is caught (it re-asks the model for steps it had already applied)."""
    timing = {"PK5": {"after_checkpoints": [2, 5], "window": "after-commit:", "kills": 2}}
    result, d = run_wave(runner="durable", seed=17, tasks=2, concurrency=2, faults="PK5", fault_timing=timing,
                         workload={"steps": 8, "think_ms": 20}, deadline_s=60)
    receipts = orjson.loads((d / "faults.json").read_bytes())
    assert len(receipts) == 4 and {r["fault_id"] for r in receipts} == {"PK5"}
    for r in receipts:
        assert r["status"] == "applied", r
        assert "'after-commit:" in r["detail"], r["detail"]
    for g in result["tasks"]:
        assert g["attempts"] == 3 and g["verdict"] == "pass", (g["attempt_causes"], g["checks"])
    plan = orjson.loads((d / "plan.json").read_bytes())
    ns = [[f["params"]["after"] for f in t["faults"]] for t in plan["tasks"]]
    assert all(len(n) == 2 and n[0] < n[1] for n in ns), ns
    timing = {"PK5": {"after_checkpoints": [4, 7], "window": "before-model:", "kills": 2}}
    # 150 ms a step: naive's whole run at 20 ms was ~0.5 s, and once a run ended before its kill's watch reached the
    # host (quiet run, 2026-12-02): the watch is armed by a call that races the attempt (a product fix: arm it
    # with the attempt); the runway here is several times that latency
    result, d = run_wave(runner="naive", seed=17, tasks=2, concurrency=2, faults="PK5", fault_timing=timing,
                         workload={"steps": 8, "think_ms": 150}, deadline_s=60)
    assert all(r["status"] == "applied" for r in orjson.loads((d / "faults.json").read_bytes()))
    assert any(g["verdict"] == "fail" for g in result["tasks"]), [g["checks"] for g in result["tasks"]]
