"""Credential faults (CR*)."""
from __future__ import annotations

import random
import time

from faults.base import APPLIED, NOT_APPLIED, UNKNOWN, FaultContext, FaultSpec, Receipt, register


@register
class RotateKey:
    """CR1: the attempt's key is replaced at the store itself (its identity rewritten, weed reloads it), so
    the old key gets a real 403 from the store, not from the proxy. The credential source behind
    `credential_process` keeps serving the old key for a seeded delay, then serves the new one: only a
    runner that resolves credentials again after a rejection keeps going. Key ids appear in the receipt;
    secrets never leave the harness."""

    id = "CR1"
    family = "credentials"
    # the grader asks the catalog, never the id: a runner that kept the dead key to its attempt's end is named
    adds_checks = ("credentials_reresolved",)
    description = ("rotate the attempt's key at the store (old key: real 403); the credential source serves "
                   "the new key only after a seeded delay")
    default_at = (0.6, 1.6)
    default_delay = (0.3, 1.5)

    def plan(self, task_id: str, rng: random.Random, base: dict) -> FaultSpec:
        delay = round(rng.uniform(*base.get("window_s", self.default_delay)), 3)
        if base.get("strength"):  # campaigns: how long the old key is still served
            delay = float(base["strength"])
        if "after_model_calls" in base:
            lo, hi = base["after_model_calls"]
            return FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id,
                             trigger="model_call", at_s=0.0, seed=rng.randrange(2**31),
                             params={"after": rng.randint(int(lo), int(hi)), "delay_s": delay})
        lo, hi = base.get("at_s", self.default_at)
        return FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id, trigger="time",
                         at_s=round(rng.uniform(lo, hi), 3), seed=rng.randrange(2**31), params={"delay_s": delay})

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        if spec.trigger == "model_call":
            await ctx.wait_model_answers(spec.task_id, spec.params["after"])
        return await ctx.rotate_credentials(spec.task_id, spec.params["delay_s"])

    async def settle(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> None:
        """Until a request signed with the new key succeeded (at most 15 s; cancelled when the task ends)."""
        import asyncio

        if not injected.get("applied") or not injected.get("published_at"):
            return
        deadline = time.time() + 15
        while time.time() < deadline:
            reqs = ctx.store_requests({injected["new_akid"]}, injected["rotated_at"], time.time())
            if any(200 <= (r.get("status") or 0) < 300 for r in reqs):
                return
            await asyncio.sleep(0.1)

    async def clear(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> dict:
        if not injected.get("applied"):
            return {}
        import asyncio

        await asyncio.sleep(0.2)  # the proxy's log lines of the last requests
        reqs = ctx.store_requests({injected["old_akid"], injected["new_akid"]}, injected["rotated_at"], time.time())
        dead = [r for r in reqs if r.get("akid") == injected["old_akid"]]
        return {"at": time.time(), "old_key_requests": len(dead),
                "old_key_rejected": sum(1 for r in dead if r.get("status") == 403 and not r.get("rule")),
                "old_key_codes": sorted({str(r.get("status")) for r in dead}),
                "new_key_ok": sum(1 for r in reqs if r.get("akid") == injected["new_akid"]
                                  and 200 <= (r.get("status") or 0) < 300)}

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt:
        applied = injected.get("applied")
        if applied is not True:
            status, detail = (UNKNOWN if applied is None else NOT_APPLIED), injected.get("why", "")
        elif not cleared.get("old_key_rejected"):
            status, detail = NOT_APPLIED, ("the key was rotated at the store, but the runner sent no store request "
                                           "with the dead key: the rotation changed nothing it did")
        else:
            pub = injected.get("published_at")
            status, detail = APPLIED, (
                f"key {injected['old_akid'][:8]}... replaced at the store by {injected['new_akid'][:8]}... (switched "
                f"in {injected['store_switch_ms']} ms); the old key got {cleared['old_key_rejected']} real 403(s) "
                f"from the store; the credential source served the old key {spec.params['delay_s']} s more"
                + ("" if pub else " (the attempt ended before the new key was published)")
                + f"; {cleared.get('new_key_ok', 0)} request(s) with the new key succeeded")
        return Receipt(fault_id=self.id, instance=spec.instance, task_id=spec.task_id, status=status,
                       target={"sandbox_id": injected.get("sandbox_id"), "old_akid": injected.get("old_akid"),
                               "new_akid": injected.get("new_akid"), "delay_s": spec.params["delay_s"],
                               "published_at": injected.get("published_at")},
                       detail=detail, fired_at=injected.get("rotated_at"), cleared_at=cleared.get("at"),
                       evidence={k: v for k, v in cleared.items() if k != "at"})
