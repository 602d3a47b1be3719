"""Preemption faults (PK*)."""
from __future__ import annotations

import random

from faults.base import APPLIED, NOT_APPLIED, UNKNOWN, FaultContext, FaultSpec, Receipt, register


@register
class SigkillSandbox:
    """PK1: SIGKILL every process of the task's running sandbox at a seeded time after launch."""

    id = "PK1"
    family = "preemption"
    description = "SIGKILL the sandbox at a seeded time after launch"
    default_window = (0.6, 1.8)

    def plan(self, task_id: str, rng: random.Random, base: dict) -> FaultSpec:
        lo, hi = base.get("at_s", self.default_window)
        return FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id, trigger="time",
                         at_s=round(rng.uniform(lo, hi), 3), seed=rng.randrange(2**31), params={})

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        current = await ctx.current_sandbox(spec.task_id)
        if current is None:
            return {"applied": False, "why": "the task had no running sandbox at the planned time"}
        host, sandbox_id = current
        out = await host.kill.remote(sandbox_id, 0.0, f"{spec.instance}")
        out["sandbox_id"] = sandbox_id
        return out

    async def settle(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> None:
        return None  # a kill is over once sent

    async def clear(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> dict:
        return {}  # a kill has nothing to heal: the driver starts the next attempt

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt:
        applied = injected.get("applied")
        ok = applied is True
        return Receipt(fault_id=self.id, instance=spec.instance, task_id=spec.task_id,
                       status=APPLIED if ok else (UNKNOWN if applied is None else NOT_APPLIED),
                       target={"sandbox_id": injected.get("sandbox_id"), "pid": injected.get("pid"),
                               "node": injected.get("node")},
                       detail="SIGKILL to every process of the sandbox" if ok else injected.get("why", ""),
                       fired_at=injected.get("at"))
