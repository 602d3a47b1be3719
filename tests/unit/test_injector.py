"""A fault whose host went with its task's node (PK3) is `not_applied`, saying so; any other crash stays `unknown`."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from ray.exceptions import RayActorError

from cluster.wave.injector import Injector
from faults.base import CATALOG, FaultSpec


class _Lost(RayActorError):
    def __init__(self):
        super().__init__()


def _fire(exc: BaseException, lost: dict) -> object:
    pk1 = CATALOG["PK1"]
    spec = FaultSpec(fault_id="PK1", instance="t001-PK1", task_id="t001", trigger="time", at_s=0.0, seed=1)
    async def started(task_id):
        return None

    ctx = SimpleNamespace(nodes=SimpleNamespace(lost=lost, faults={n: "t000-PK3" for n in lost}),
                          runs={"t001": SimpleNamespace(node="node-1")}, runner_started=started)
    events = []
    inj = Injector(lambda event, **kw: events.append((event, kw)), lambda: None)

    async def boom(spec, ctx):
        raise exc

    orig = pk1.inject
    pk1.inject = boom
    try:
        asyncio.run(inj.fire(spec, ctx))
    finally:
        pk1.inject = orig
    return inj.receipts[0]


def test_a_fault_on_a_task_whose_node_pk3_took_is_not_applied_with_the_reason():
    r = _fire(_Lost(), {"node-1": {"mode": "abrupt"}})
    assert r.status == "not_applied", r
    assert "node-1 went with t000-PK3" in r.detail, r.detail


def test_any_other_crash_stays_unknown():
    assert _fire(_Lost(), {"node-2": {"mode": "abrupt"}}).status == "unknown"  # another node was lost
    assert _fire(RuntimeError("boom"), {"node-1": {"mode": "abrupt"}}).status == "unknown"


def test_disk_evidence_noted_before_the_receipt_is_kept_reaches_it():
    """The task's next attempt can start (and say what became of its disk) before the fault that ended the last one
    has cleared and kept its receipt: the evidence waits for the receipt and is merged into it then, and later."""
    pk1 = CATALOG["PK1"]
    spec = FaultSpec(fault_id="PK1", instance="t001-PK1", task_id="t001", trigger="time", at_s=0.0, seed=1)
    inj = Injector(lambda event, **kw: None, lambda: None)
    inj.add_evidence("t001-PK1", "disk", {"mode": "keep", "kept": True})
    inj.add_evidence("t009-PK1", "disk", {"mode": "wipe", "kept": False})  # another fault's: not this receipt's

    async def boom(spec, ctx):
        raise RuntimeError("boom")

    async def started(task_id):
        return None

    orig = pk1.inject
    pk1.inject = boom
    try:
        asyncio.run(inj.fire(spec, SimpleNamespace(runner_started=started)))
    finally:
        pk1.inject = orig
    assert inj.receipts[0].evidence["disk"] == {"mode": "keep", "kept": True}, inj.receipts[0].evidence
    inj.add_evidence("t001-PK1", "disk", {"done": {"dropped": 2}})  # the next attempt's host did the crash
    assert inj.receipts[0].evidence["disk"] == {"mode": "keep", "kept": True, "done": {"dropped": 2}}
