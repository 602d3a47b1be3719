"""Faults ship with their cleanup: the injector always runs `clear`, and its receipt is honest."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from cluster.wave.injector import Injector
from cluster.wave.timeline import Timeline
from faults.base import CATALOG, FaultSpec, Receipt


@dataclass
class WindowFault:
    id: str = "XW1"
    family: str = "test"
    description: str = "a window fault that records what was done to it"
    calls: list = field(default_factory=list)
    fail_inject: bool = False

    def plan(self, task_id, rng, base):
        raise NotImplementedError

    async def inject(self, spec, ctx):
        self.calls.append("inject")
        if self.fail_inject:
            raise RuntimeError("injector blew up")
        return {"applied": True, "at": 1.0}

    async def settle(self, spec, ctx, injected):
        await asyncio.sleep(spec.window_s or 0)

    async def clear(self, spec, ctx, injected):
        self.calls.append("clear")
        return {"at": 2.0}

    def receipt(self, spec, injected, cleared):
        return Receipt(self.id, spec.instance, spec.task_id, "applied" if injected.get("applied") else "not_applied",
                       detail=injected.get("why", ""))


def _injector(tmp_path) -> Injector:
    return Injector(Timeline(tmp_path / "timeline.jsonl"), lambda: None)


def _spec(at_s, window_s=None) -> FaultSpec:
    return FaultSpec(fault_id="XW1", instance="t000-XW1", task_id="t000", trigger="time", at_s=at_s,
                     window_s=window_s)


def run_fire(tmp_path, fault, spec, cancel_after=None):
    CATALOG["XW1"] = fault
    try:
        inj = _injector(tmp_path)

        async def main():
            t = asyncio.create_task(inj.fire(spec, ctx=None))
            if cancel_after is not None:
                await asyncio.sleep(cancel_after)
                t.cancel()
            await asyncio.gather(t, return_exceptions=True)

        asyncio.run(main())
        return inj.receipts
    finally:
        CATALOG.pop("XW1", None)


def test_window_cleared_when_the_task_ends_mid_window(tmp_path):
    f = WindowFault()
    receipts = run_fire(tmp_path, f, _spec(0.0, window_s=30), cancel_after=0.05)
    assert f.calls == ["inject", "clear"]
    assert receipts[0].status == "applied"


def test_fault_cancelled_before_its_time_is_not_applied_and_still_cleared(tmp_path):
    f = WindowFault()
    receipts = run_fire(tmp_path, f, _spec(30.0), cancel_after=0.05)
    assert f.calls == ["clear"]
    assert receipts[0].status == "not_applied" and "ended before" in receipts[0].detail


def test_crashed_injection_is_unknown_never_pass(tmp_path):
    f = WindowFault(fail_inject=True)
    receipts = run_fire(tmp_path, f, _spec(0.0, window_s=1))
    assert f.calls == ["inject", "clear"]
    assert receipts[0].status == "unknown" and "injector blew up" in receipts[0].detail
