"""Disk faults (DF*)."""
from __future__ import annotations

import asyncio
import random

from faults.base import APPLIED, NOT_APPLIED, UNKNOWN, FaultContext, FaultSpec, Receipt, register, timed_spec


@register
class DiskFull:
    """DF1: the sandbox's workspace fills up: a root-owned ballast takes every free byte of its tmpfs for a
    seeded window (the runner meets a real ENOSPC), then is removed. A runner must fail the step cleanly and
    do it again once space returns (in this attempt, or in the next one's fresh workspace)."""

    id = "DF1"
    family = "disk"
    description = "disk full: a ballast fills the sandbox's workspace (real ENOSPC) for a seeded window"
    default_at = (0.5, 1.5)
    default_len = (1.0, 3.0)

    def plan(self, task_id: str, rng: random.Random, base: dict) -> FaultSpec:
        lo, hi = base.get("at_s", self.default_at)
        wlo, whi = base.get("window_s", self.default_len)
        if base.get("strength"):
            wlo = whi = float(base["strength"])
        if "after_model_calls" in base:
            a, b = base["after_model_calls"]
            return FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id, trigger="model_call",
                             at_s=0.0, window_s=round(rng.uniform(wlo, whi), 3), seed=rng.randrange(2**31),
                             params={"after": rng.randint(int(a), int(b))})
        return timed_spec(self.id, task_id, rng, (lo, hi), (wlo, whi), {})

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        if spec.trigger == "model_call":
            await ctx.wait_model_answers(spec.task_id, spec.params["after"])
        current = await ctx.current_sandbox(spec.task_id)
        if current is None:
            return {"applied": False, "why": "the task had no running sandbox at the planned time"}
        host, sandbox_id = current
        out = await host.fill_workspace.remote(sandbox_id)
        out.update(sandbox_id=sandbox_id, host=host)
        return out

    async def settle(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> None:
        await asyncio.sleep(spec.window_s)

    async def clear(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> dict:
        host = injected.pop("host", None)
        if not injected.get("applied") or host is None:
            return {}
        try:
            return await host.drain_workspace.remote(injected["sandbox_id"])
        except Exception as exc:  # noqa: BLE001
            return {"removed": False, "why": f"drain failed: {exc}"}

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt:
        applied = injected.get("applied")
        if applied is True:
            status = APPLIED
            detail = (f"a {injected['ballast_bytes'] / 1048576:.1f} MiB ballast left {injected['free_bytes']} bytes "
                      f"free in the workspace for {spec.window_s} s; then "
                      + ("removed" if cleared.get("removed") else f"not removed: {cleared.get('why', '?')}"))
        else:
            status = NOT_APPLIED if applied is False else UNKNOWN
            detail = injected.get("why", "")
        return Receipt(fault_id=self.id, instance=spec.instance, task_id=spec.task_id, status=status,
                       target={"sandbox_id": injected.get("sandbox_id"), "window_s": spec.window_s},
                       detail=detail, fired_at=injected.get("at"), cleared_at=cleared.get("at"),
                       evidence={"ballast_bytes": injected.get("ballast_bytes"),
                                 "free_bytes": injected.get("free_bytes")})
