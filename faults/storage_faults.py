"""Storage faults (ST*), applied as rules in the S3 fault proxy."""
from __future__ import annotations

import asyncio
import random
import time

from faults.base import (APPLIED, NOT_APPLIED, FaultContext, FaultSpec, Receipt, arm_at_model_answer, armed_spec,
                         register, wait_armed)


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
        if base.get("strength"):  # campaigns: the outage's length in seconds
            wlo = whi = float(base["strength"])
        return armed_spec(self.id, task_id, rng, base, (lo, hi), (wlo, whi),
                          {"status": 503, "code": "ServiceUnavailable"})

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        early = await wait_armed(spec, ctx)
        if early is not None:
            return early
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
        spec = FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id, trigger="time",
                         at_s=round(rng.uniform(lo, hi), 3), seed=rng.randrange(2**31),
                         params={"hold_s": round(rng.uniform(hlo, hhi), 3)})
        return arm_at_model_answer(spec, rng, base)

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        early = await wait_armed(spec, ctx)
        if early is not None:
            return early
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


class ProxyWindowFault:
    """A storage fault that is one or more proxy rules on the task's prefix, armed at a seeded time. Each
    rule's window opens at the task's first matching request after arming and lasts `window_s`; `hits: N`
    (fault_timing) ends it after N hit requests instead. A fault none of whose rules changed a request is
    `not_applied`. Subclasses say which rules (`rules()`) and how a hit reads (`what`)."""

    family = "storage"
    default_at = (0.3, 1.0)
    default_len = (1.5, 4.0)
    what = "request(s) changed"

    def plan(self, task_id: str, rng: random.Random, base: dict) -> FaultSpec:
        lo, hi = base.get("at_s", self.default_at)
        wlo, whi = base.get("window_s", self.default_len)
        params = self.plan_params(rng)
        if base.get("strength"):
            wlo, whi, params = self.strengthen(float(base["strength"]), (wlo, whi), params)
        if base.get("hits"):
            params["max_hits"] = int(base["hits"])
        return armed_spec(self.id, task_id, rng, base, (lo, hi), (wlo, whi), params)

    def plan_params(self, rng: random.Random) -> dict:
        return {}

    def strengthen(self, x: float, window: tuple, params: dict) -> tuple[float, float, dict]:
        """Campaigns set one knob (`strength`); by default it is the window's length in seconds."""
        return x, x, params

    def rules(self, spec: FaultSpec, ctx: FaultContext) -> list[dict]:
        raise NotImplementedError

    def _rule_ids(self, spec: FaultSpec) -> list[str]:
        return [spec.instance] + [f"{spec.instance}{sfx}" for sfx in spec.params.get("extra_rules", [])]

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        early = await wait_armed(spec, ctx)
        if early is not None:
            return early
        ctl = ctx.proxy()
        opened = []
        for r in self.rules(spec, ctx):
            r = {"bucket": ctx.bucket, "key_prefix": ctx.task_prefix(spec.task_id), "seed": spec.seed,
                 "fault": self.id, "duration_s": spec.window_s, **r}
            if "max_hits" in spec.params and "max_hits" not in r:
                r["max_hits"] = spec.params["max_hits"]
            opened.append(await asyncio.to_thread(ctl.open_rule, **r))
        return {"applied": True, "at": time.time(), "rules": [r["rule_id"] for r in opened]}

    async def settle(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> None:
        """Until every rule's window ran (or its hits are used up); cancelled when the task ends."""
        if not injected.get("applied"):
            return
        extra = float(spec.params.get("lag_s", 0.0))
        while True:
            rules = await asyncio.to_thread(ctx.proxy().rules)
            mine = [r for r in rules["rules"] if r["rule_id"] in injected["rules"]]
            if not mine:
                return
            done = all(r["expired"] or (r["max_hits"] is not None and r["hits"] >= r["max_hits"]) for r in mine)
            if done:
                await asyncio.sleep(extra + 0.01)
                return
            opened = [r["first_hit_at"] for r in mine if r["first_hit_at"] is not None]
            wait = max(0.05, min(opened) + spec.window_s - time.time()) if opened else 0.1
            await asyncio.sleep(min(wait, 0.5))

    async def clear(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> dict:
        if not injected.get("applied"):
            return {}
        out, ctl = {"rules": [], "at": time.time()}, ctx.proxy()
        for rid in injected["rules"]:
            try:
                out["rules"].append(await asyncio.to_thread(ctl.close_rule, rid))
            except RuntimeError as exc:
                out["error"] = str(exc)
        return out

    def describe(self, spec: FaultSpec, rules: list[dict]) -> str:
        return ""

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt:
        rules = cleared.get("rules") or []
        hits = sum(int(r.get("hits", 0)) for r in rules)
        matched = sum(int(r.get("matched", 0)) for r in rules)
        keys = [k for r in rules for k in r.get("hit_keys") or []][:20]
        if not injected.get("applied"):
            status, detail = NOT_APPLIED, injected.get("why", "not armed")
        elif "error" in cleared:
            status, detail = "unknown", f"a rule could not be closed: {cleared['error']}"
        elif hits == 0:
            status, detail = NOT_APPLIED, (f"armed, but no request of the task matched ({matched} seen): the fault "
                                           "changed nothing (does the runner make such requests?)")
        else:
            status, detail = APPLIED, f"{hits} {self.what}" + self.describe(spec, rules)
        first = min((r["first_hit_at"] for r in rules if r.get("first_hit_at")), default=None)
        return Receipt(fault_id=self.id, instance=spec.instance, task_id=spec.task_id, status=status,
                       target={"key_prefix": (rules[0] if rules else {}).get("key_prefix"),
                               "window_s": spec.window_s, **{k: v for k, v in spec.params.items()
                                                             if k not in ("extra_rules",)}},
                       detail=detail, fired_at=injected.get("at"), cleared_at=cleared.get("at"),
                       evidence={"hits": hits, "matched": matched, "keys": keys, "first_hit_at": first})


@register
class SlowStore(ProxyWindowFault):
    """ST2: a slow store: seeded latency with jitter before each request, and a bandwidth cap shared by all
    of the task's requests in the window, each direction."""

    id = "ST2"
    description = "slow store: added latency with jitter and a shared bandwidth cap on the task's prefix"
    what = "request(s) slowed"

    def plan_params(self, rng):
        lo = round(rng.uniform(50, 250))
        return {"latency_ms": [lo, lo * 3], "bandwidth_bps": int(rng.choice([256, 512, 1024, 2048]) * 1024)}

    def strengthen(self, x, window, params):  # added latency in ms (jitter up to +50%)
        return window[0], window[1], dict(params, latency_ms=[round(x), round(x * 1.5)])

    def rules(self, spec, ctx):
        return [{"rule_id": spec.instance, "action": "delay", "latency_ms": spec.params["latency_ms"],
                 "bandwidth_bps": spec.params["bandwidth_bps"]}]

    def describe(self, spec, rules):
        lo, hi = spec.params["latency_ms"]
        return f" ({lo}-{hi} ms added, {spec.params['bandwidth_bps'] // 1024} KiB/s shared cap)"


@register
class StoreErrors(ProxyWindowFault):
    """ST3: a seeded share of the task's requests answer 503, half of them SlowDown."""

    id = "ST3"
    description = "a seeded share of requests answer 503 (half ServiceUnavailable, half SlowDown)"
    what = "request(s) answered 503"

    def plan_params(self, rng):
        return {"ratio": round(rng.uniform(0.25, 0.6), 2)}

    def strengthen(self, x, window, params):  # the share of requests that fail
        return window[0], window[1], dict(params, ratio=min(1.0, x))

    def rules(self, spec, ctx):
        return [{"rule_id": spec.instance, "action": "error", "ratio": spec.params["ratio"],
                 "codes": [[503, "ServiceUnavailable"], [503, "SlowDown"]]}]

    def describe(self, spec, rules):
        return f" (share {spec.params['ratio']}: ServiceUnavailable or SlowDown)"


@register
class PartialMultipart(ProxyWindowFault):
    """ST4: partial multipart: a seeded subset of UploadPart requests fails (503, a reset before the body,
    or a reset after part of the body reached the store); sometimes CompleteMultipartUpload fails once."""

    id = "ST4"
    description = "partial multipart: UploadPart fails (503 / reset / reset mid-body), sometimes Complete fails"
    what = "multipart request(s) failed"
    default_len = (5.0, 15.0)

    def plan_params(self, rng):
        how = rng.choice(["503", "reset", "reset_mid"])
        out = {"how": how, "ratio": round(rng.uniform(0.3, 0.7), 2),
               "complete_fails": rng.random() < 0.5}
        if out["complete_fails"]:
            out["extra_rules"] = ["-complete"]
        return out

    def rules(self, spec, ctx):
        how = spec.params["how"]
        part = {"rule_id": spec.instance, "ops": ["UploadPart"], "ratio": spec.params["ratio"]}
        if how == "503":
            part.update(action="error", codes=[[503, "ServiceUnavailable"], [503, "SlowDown"]])
        else:
            part.update(action="reset", reset_after=0 if how == "reset" else 64 * 1024)
        out = [part]
        if spec.params.get("complete_fails"):
            out.append({"rule_id": f"{spec.instance}-complete", "ops": ["CompleteMultipartUpload"],
                        "action": "error", "status": 500, "code": "InternalError", "max_hits": 1})
        return out

    def describe(self, spec, rules):
        by = {r["rule_id"]: r.get("hits", 0) for r in rules}
        how = {"503": "answered 503", "reset": "reset before the body", "reset_mid": "reset after 64 KiB"}
        out = f" (UploadPart {how[spec.params['how']]}: {by.get(spec.instance, 0)}"
        if spec.params.get("complete_fails"):
            out += f"; CompleteMultipartUpload answered 500: {by.get(spec.instance + '-complete', 0)}"
        return out + ")"


@register
class CredentialsRejected(ProxyWindowFault):
    """ST5: the proxy rejects the task's credentials for a window: 403 ExpiredToken, InvalidAccessKeyId or
    SignatureDoesNotMatch (seeded per window)."""

    id = "ST5"
    description = "credentials rejected by the proxy: 403 ExpiredToken / InvalidAccessKeyId / SignatureDoesNotMatch"
    what = "request(s) answered 403"
    default_len = (0.8, 2.0)

    def plan_params(self, rng):
        return {"code": rng.choice(["ExpiredToken", "InvalidAccessKeyId", "SignatureDoesNotMatch"])}

    def rules(self, spec, ctx):
        return [{"rule_id": spec.instance, "action": "error", "status": 403, "code": spec.params["code"],
                 "message": "The credentials were rejected (sandfleet fault window)"}]

    def describe(self, spec, rules):
        return f" {spec.params['code']}"


@register
class ReadAfterWriteLag(ProxyWindowFault):
    """ST7: read-after-write lag: an object the task writes in the window reads as missing (GET/HEAD 404
    NoSuchKey, absent from listings) for a seeded time after its PUT or Complete succeeded."""

    id = "ST7"
    description = "read-after-write lag: a new object reads as missing (404, absent from listings) for a while"
    what = "read(s) answered as if a written object did not exist"
    default_len = (3.0, 8.0)

    def plan_params(self, rng):
        return {"lag_s": round(rng.uniform(0.5, 2.0), 2)}

    def strengthen(self, x, window, params):  # the lag in seconds
        return window[0], window[1], dict(params, lag_s=x)

    def rules(self, spec, ctx):
        return [{"rule_id": spec.instance, "action": "lag", "lag_s": spec.params["lag_s"]}]

    def describe(self, spec, rules):
        return f" (lag {spec.params['lag_s']} s after each write)"


@register
class ThrottlePrefix(ProxyWindowFault):
    """ST8: throttle one prefix: the task's next N PUTs answer 503 SlowDown."""

    id = "ST8"
    description = "throttle one prefix: the next N PUTs answer 503 SlowDown"
    what = "PUT(s) answered 503 SlowDown"
    default_len = (30.0, 60.0)

    def plan_params(self, rng):
        return {"max_hits": rng.randint(3, 8)}

    def strengthen(self, x, window, params):  # how many PUTs are throttled
        return window[0], window[1], dict(params, max_hits=max(1, round(x)))

    def rules(self, spec, ctx):
        return [{"rule_id": spec.instance, "action": "error", "methods": ["PUT"], "status": 503, "code": "SlowDown",
                 "message": "Please reduce your request rate (sandfleet throttle)"}]
