"""Storage faults (ST*), applied as rules in the S3 fault proxy."""
from __future__ import annotations

import asyncio
import random
import time

from faults.base import APPLIED, NOT_APPLIED, FaultContext, FaultSpec, Receipt, register


def close_rule(spec: FaultSpec, ctx: FaultContext, injected: dict) -> dict:
    """Clear of every proxy-rule fault: close its rule (its final counts become the receipt's evidence)."""
    if not injected.get("applied"):
        return {}
    try:
        return {"rule": ctx.proxy().close_rule(spec.instance), "at": time.time()}
    except RuntimeError as exc:
        return {"error": str(exc), "at": time.time()}


@register
class StoreOutage:
    """ST1: every request of the task's prefix answers 503 ServiceUnavailable for a seeded window.

    The rule is armed at the planned time; the window opens at the task's first storage request
    after that (a matching-request trigger) and lasts `window_s`, so an outage that was armed
    always meets the runner unless the task ends first.
    """

    id = "ST1"
    family = "storage"
    description = "storage outage: 503 ServiceUnavailable on the task's prefix for a seeded window"
    default_at = (0.4, 1.2)
    default_len = (1.0, 2.5)

    def plan(self, task_id: str, rng: random.Random, base: dict) -> FaultSpec:
        lo, hi = base.get("at_s", self.default_at)
        wlo, whi = base.get("window_s", self.default_len)
        return FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id, trigger="time",
                         at_s=round(rng.uniform(lo, hi), 3), window_s=round(rng.uniform(wlo, whi), 3),
                         seed=rng.randrange(2**31), params={"status": 503, "code": "ServiceUnavailable"})

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        rule = ctx.proxy().open_rule(rule_id=spec.instance, action="error", status=spec.params["status"],
                                     code=spec.params["code"], bucket=ctx.bucket,
                                     key_prefix=ctx.task_prefix(spec.task_id), seed=spec.seed, fault=self.id,
                                     duration_s=spec.window_s)
        return {"applied": True, "at": time.time(), "rule": rule}

    async def settle(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> None:
        """Wait until the window has opened and run its length (cancelled when the task ends)."""
        if not injected.get("applied"):
            return
        while True:
            rules = await asyncio.to_thread(ctx.proxy().rules)
            rule = next((r for r in rules["rules"] if r["rule_id"] == spec.instance), None)
            if rule is None or rule["expired"]:
                return
            if rule["first_hit_at"] is not None:
                await asyncio.sleep(max(0.0, rule["first_hit_at"] + spec.window_s - time.time()) + 0.01)
            else:
                await asyncio.sleep(0.1)

    async def clear(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> dict:
        return close_rule(spec, ctx, injected)

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt:
        rule = cleared.get("rule") or {}
        hits = int(rule.get("hits", 0))
        if not injected.get("applied"):
            status, detail = NOT_APPLIED, injected.get("why", "window never opened")
        elif "error" in cleared:
            status, detail = "unknown", f"window could not be closed: {cleared['error']}"
        elif hits == 0 and rule.get("first_hit_at") is None:
            status, detail = NOT_APPLIED, ("armed, but no request of the task arrived after arming: the window "
                                           "never opened (does the runner use the store?)")
        elif hits == 0:
            status, detail = NOT_APPLIED, "window opened but no request of the task arrived while it was open"
        else:
            opened = rule.get("first_hit_at")
            status, detail = APPLIED, (f"{hits} request(s) answered 503 ServiceUnavailable; window opened "
                                       f"{opened - (injected.get('at') or opened):.2f}s after arming")
        return Receipt(fault_id=self.id, instance=spec.instance, task_id=spec.task_id, status=status,
                       target={"bucket": rule.get("bucket"), "key_prefix": rule.get("key_prefix"),
                               "window_s": spec.window_s},
                       detail=detail, fired_at=injected.get("at"), cleared_at=cleared.get("at"),
                       evidence={"hits": hits, "matched": rule.get("matched", 0),
                                 "first_hit_at": rule.get("first_hit_at"), "last_hit_at": rule.get("last_hit_at")})


@register
class CutPut:
    """ST6: the task's next PUT after the planned time is cut after its head.

    The store receives the request's head and never its body; its connection is closed `hold_s` later,
    and the runner's connection is reset at once (the runner sees a dropped connection, as when its
    network or a previous incarnation of it died mid-request). SeaweedFS then stores an EMPTY object
    under that key, even over a newer complete write of it (docs/store-hazards.md): a runner survives
    only if it does not trust a record it cannot verify.
    """

    id = "ST6"
    family = "storage"
    description = "a PUT cut after its head: the store gets no body (SeaweedFS then stores an empty object)"
    default_at = (0.4, 1.2)
    default_hold = (0.2, 1.0)

    def plan(self, task_id: str, rng: random.Random, base: dict) -> FaultSpec:
        lo, hi = base.get("at_s", self.default_at)
        hlo, hhi = base.get("hold_s", self.default_hold)
        return FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id, trigger="time",
                         at_s=round(rng.uniform(lo, hi), 3), seed=rng.randrange(2**31),
                         params={"hold_s": round(rng.uniform(hlo, hhi), 3)})

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        rule = ctx.proxy().open_rule(rule_id=spec.instance, action="cut_body", methods=["PUT"], bucket=ctx.bucket,
                                     key_prefix=ctx.task_prefix(spec.task_id), seed=spec.seed, fault=self.id,
                                     max_hits=1, hold_s=spec.params["hold_s"])
        return {"applied": True, "at": time.time(), "rule": rule}

    async def settle(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> None:
        """Until a PUT was cut and the store's connection closed (cancelled when the task ends)."""
        if not injected.get("applied"):
            return
        while True:
            rules = await asyncio.to_thread(ctx.proxy().rules)
            rule = next((r for r in rules["rules"] if r["rule_id"] == spec.instance), None)
            if rule is None:
                return
            if rule["hits"]:
                await asyncio.sleep(spec.params["hold_s"] + 0.05)
                return
            await asyncio.sleep(0.05)

    async def clear(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> dict:
        return close_rule(spec, ctx, injected)

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt:
        rule = cleared.get("rule") or {}
        hits = int(rule.get("hits", 0))
        keys = rule.get("hit_keys") or []
        if not injected.get("applied"):
            status, detail = NOT_APPLIED, injected.get("why", "not armed")
        elif "error" in cleared:
            status, detail = "unknown", f"rule could not be closed: {cleared['error']}"
        elif hits == 0:
            status, detail = NOT_APPLIED, "armed, but the task sent no PUT afterwards"
        else:
            status, detail = APPLIED, (f"PUT {keys[0] if keys else '?'} cut after its head (body never sent to "
                                       f"the store; its connection closed {spec.params['hold_s']} s later; the "
                                       "runner's connection reset)")
        return Receipt(fault_id=self.id, instance=spec.instance, task_id=spec.task_id, status=status,
                       target={"bucket": rule.get("bucket"), "key_prefix": rule.get("key_prefix"),
                               "hold_s": spec.params["hold_s"]},
                       detail=detail, fired_at=injected.get("at"), cleared_at=cleared.get("at"),
                       evidence={"hits": hits, "keys": keys, "first_hit_at": rule.get("first_hit_at")})
