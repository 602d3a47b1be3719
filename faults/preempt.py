"""Preemption faults (PK*)."""
from __future__ import annotations

import random

from faults.base import APPLIED, NOT_APPLIED, UNKNOWN, FaultContext, FaultSpec, Receipt, register


@register
class SigkillSandbox:
    """PK1: SIGKILL every process of the task's running sandbox at a seeded time after launch, or
    right after the Nth model answer was delivered to it (a boundary of the runner, black-box)."""

    id = "PK1"
    family = "preemption"
    description = "SIGKILL the sandbox at a seeded time after launch (or after its Nth model answer)"
    default_window = (0.6, 1.8)

    def plan(self, task_id: str, rng: random.Random, base: dict) -> FaultSpec:
        if "after_model_calls" in base:
            lo, hi = base["after_model_calls"]
            n = rng.randint(int(lo), int(hi))
            return FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id,
                             trigger="model_call", at_s=0.0, seed=rng.randrange(2**31), params={"after_calls": n})
        lo, hi = base.get("at_s", self.default_window)
        return FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id, trigger="time",
                         at_s=round(rng.uniform(lo, hi), 3), seed=rng.randrange(2**31), params={})

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        if spec.trigger == "model_call":
            n = spec.params["after_calls"]
            if not await ctx.wait_model_answers(spec.task_id, n):
                return {"applied": False, "why": f"the task ended before its model answer #{n} was delivered"}
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
                       detail=("SIGKILL to every process of the sandbox" + (
                           f", right after model answer #{spec.params['after_calls']}"
                           if spec.trigger == "model_call" else "")) if ok else injected.get("why", ""),
                       fired_at=injected.get("at"))
