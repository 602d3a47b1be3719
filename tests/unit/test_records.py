"""The typed records at the wave's seams (fleet/records.py): a stored wave's plan, leases and harness faults come
back byte for byte through them, and each record emits exactly the keys its producer's dict had."""
from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from cluster.config import build_config
from cluster.wave.plan import build_plan, enumerate_tasks, replay_plan
from fleet.records import AttemptResult, HarnessFault, Injected, Lease, Plan, PlannedTask

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "wave-before-results-py"


def test_a_stored_plan_round_trips_through_plan_byte_for_byte():
    stored = (FIXTURE / "plan.json").read_bytes()
    plan = Plan.of(orjson.loads(stored))
    assert plan.tasks and plan.references and all(isinstance(t, PlannedTask) for t in plan.tasks)
    assert orjson.dumps(plan.to_dict(), option=orjson.OPT_INDENT_2, default=str) == stored


def test_stored_leases_and_a_harness_fault_round_trip():
    rows = [orjson.loads(x) for x in (FIXTURE / "ledger.jsonl").read_bytes().splitlines()]
    leases = [{k: v for k, v in r.items() if k != "kind"} for r in rows if r.get("kind") == "lease"]
    assert leases
    for row in leases:
        lease = Lease.of(row)
        assert lease.fence >= 1 and list(lease.to_dict().items()) == list(row.items())
    fault = {"part": "proxy", "why": "pid 7 exited", "since_wall": 1.5, "hint": "re-run the wave"}
    assert HarnessFault.of(fault).to_dict() == fault and HarnessFault.of(None) is None
    assert HarnessFault.of(fault).text() == "harness fault: proxy: pid 7 exited. re-run the wave"


@pytest.mark.parametrize("extra", [{}, {"enumerate_boundaries": True}])
def test_every_plan_builder_gives_a_plan_the_records_read_back_unchanged(extra):
    cfg = build_config({"tasks": 3, "faults": ["PK1"], "seed": 5, **extra})
    plan = build_plan(cfg, "w-x")
    assert Plan.of(plan).to_dict() == plan and list(Plan.of(plan).to_dict()) == list(plan)
    if extra:
        assert list(plan) == ["wave_id", "seed", "created_at", "config", "runner", "tasks", "enumerate", "references"]
        tasks = enumerate_tasks(plan, {"model_call": 2, "effect": 1, "store_write": 1}, None)
        assert [list(t) for t in tasks][0] == ["task_id", "role", "seed", "runner", "workload", "steps", "faults",
                                               "boundary", "reference"]
        return
    assert list(plan["tasks"][0]) == ["task_id", "role", "seed", "runner", "workload", "steps", "faults", "reference"]
    assert list(plan["references"][0])[:3] == ["task_id", "role", "reference_of"]
    replay = replay_plan(plan, "t001", "w-y")
    assert [t["task_id"] for t in replay["tasks"]] == ["t001"] and replay["tasks"][0]["faults"] == \
        plan["tasks"][1]["faults"]
    assert replay["replay_of"] == {"wave_id": "w-x", "task_id": "t001"} and Plan.of(replay).to_dict() == replay


def test_an_attempt_result_keeps_the_keys_its_host_gave_and_refuses_unknown_ones():
    host = {"sandbox_id": "t0-a1", "exit_code": None, "start_error": "no such command", "node": "node-0"}
    r = AttemptResult.of(host)
    assert r.start_error == "no such command" and r.to_dict() == host and list(r.to_dict()) == list(host)
    drained = r.but(cause="exit 1 (node node-1 draining)")
    assert list(drained.to_dict()) == [*host, "cause"] and r.cause is None
    lost = AttemptResult(error="sandbox host lost: x", host_lost=True)
    assert lost.to_dict() == {"error": "sandbox host lost: x", "host_lost": True}
    with pytest.raises(ValueError, match="exit_cod"):
        AttemptResult.of({"exit_cod": 0})


def test_an_injection_keeps_the_faults_own_facts_and_an_error_makes_it_crashed():
    given = {"applied": True, "sandbox_id": "t0-a1", "kills": 2, "why": ""}
    inj = Injected.of(given)
    assert inj.applied and inj.facts == {"sandbox_id": "t0-a1", "kills": 2} and inj.to_dict() == given
    crashed = inj.crashed("RuntimeError: boom")
    assert crashed.error == "RuntimeError: boom" and crashed.to_dict() == {**given, "error": "RuntimeError: boom"}
    assert Injected(_keys=()).crashed("E").to_dict() == {"error": "E"}
    assert Injected(why="draw said no").to_dict() == {"applied": False, "why": "draw said no"}
    with pytest.raises(ValueError, match="why"):
        Injected.of({"applied": False, "why": 3})
