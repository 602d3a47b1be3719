"""Network faults (NP*): what only a real link between machines allows. They need isolated nodes
(`--isolated-nodes`), where every sandbox node has a link of its own to the head (cluster/isolated.py)."""
from __future__ import annotations

import random

from faults.base import APPLIED, FaultContext, FaultSpec, Receipt, register
from faults.preempt import SigkillSandbox, run_to_end, zombie_evidence


@register
class Partition(SigkillSandbox):
    """NP1: the link between the task's node and the head goes down for a seeded window: Ray, the store, the
    model endpoint and the effects service are all out of the node's reach, and it out of theirs. The driver cannot
    tell a cut node from a dead one: it gives up on every attempt there (their keys are revoked now) and runs them
    elsewhere. The node's sandboxes run on through the cut; when the link heals they are zombies that believe they
    still hold their tasks, and everything they do must be refused (`fenced_writes_rejected`). They are followed
    until the task's zombie made a request after the heal or ended (bounded), then killed. Triggers as PK1.
    `fencing: false` is the negative control: the cut attempts keep their keys, and the wave must fail."""

    id = "NP1"
    family = "network"
    kills_attempt = False  # the attempt lives through the cut; the zombie is judged by the check it adds
    takes_node = True  # every sandbox on the node is cut off (reference runs go first, as for PK3)
    adds_checks = ("fenced_writes_rejected",)
    disk_modes = ("wipe",)  # the next attempt runs on another node
    description = ("network partition: the task's node loses its link to the head (Ray, store, model, effects) for "
                   "a seeded window; its attempts are abandoned and, after the heal, fenced")
    default_cut = (1.0, 3.0)
    follow_s = 15.0  # after the heal: until the zombie made a request (or ended), at most this long
    linger_s = 1.0  # then this much more of what it does is kept as evidence before it is killed

    def plan(self, task_id: str, rng: random.Random, base: dict):
        lo, hi = base.get("window_s", self.default_cut)
        fencing = base.get("fencing")
        return self.plan_with(task_id, rng, base, ("window_s", "fencing"), lambda r: {
            "cut_s": round(r.uniform(lo, hi), 3), "fencing": True if fencing is None else bool(fencing)})

    async def strike(self, host, sandbox_id: str, spec: FaultSpec, ctx: FaultContext) -> dict:
        node = await ctx.node_of(spec.task_id)
        if node is None:
            return {"applied": False, "why": "the task had no attempt on a node at the planned time"}
        # from the cut on, the fault runs to its end even if the task ends first: a cut link is always healed
        return await run_to_end(self._cut(host, sandbox_id, node, spec, ctx))

    async def _cut(self, host, sandbox_id: str, node: str, spec: FaultSpec, ctx: FaultContext) -> dict:
        import asyncio
        import time

        p = spec.params
        out = await ctx.partition(node, p["cut_s"], spec.instance, spec.task_id, p["fencing"])
        if not out.get("applied"):
            return out
        healed = out.get("healed_at") or time.time()
        deadline = time.monotonic() + self.follow_s
        act: dict = {}
        while time.monotonic() < deadline:
            act = ctx.fenced_activity(spec.task_id, sandbox_id, healed)
            if act["store"] or act["refused_calls"] or not await _running(host, sandbox_id):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(self.linger_s)
        ended_by_itself = not await _running(host, sandbox_id)
        for sid in out.get("sandboxes") or []:  # every zombie of the cut goes now
            try:
                await asyncio.wait_for(host.kill.remote(sid, 0.0, f"{spec.instance} (zombie after the heal)"), 30)
            except Exception:  # noqa: BLE001 - the node is unreachable again: the sweep ends what it left
                pass
        out.update(sandbox_id=sandbox_id, zombie=sandbox_id, zombie_ended_by_itself=ended_by_itself,
                   newer=await ctx.newer_attempt(spec.task_id, sandbox_id, timeout_s=0),
                   activity=ctx.fenced_activity(spec.task_id, sandbox_id, healed))
        return out

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt:
        r = super().receipt(spec, injected, cleared)
        if r.status != APPLIED:
            return r
        act, store, landed, r.evidence = zombie_evidence(injected)
        node, cut = injected.get("node"), injected.get("cut_s")
        r.target = {"sandbox_id": injected.get("sandbox_id"), "node": node, "link": injected.get("link"),
                    "sandboxes": injected.get("sandboxes"), "zombie": injected.get("zombie"),
                    "newer": injected.get("newer"), "cut_at": injected.get("at"),
                    "healed_at": injected.get("healed_at"), "thawed_at": injected.get("healed_at"),
                    "fencing": spec.params["fencing"]}
        back = (f"its Ray node answered again {injected.get('back_after_heal_s')} s after the heal"
                if injected.get("host_back") else f"its Ray node did NOT answer after the heal "
                                                  f"({injected.get('why_not_back', '?')})")
        sandboxes = injected.get("sandboxes") or []
        fence = ("their keys revoked at once" if spec.params["fencing"] else
                 "FENCING OFF (negative control): their keys were left valid")
        r.detail = (f"node {node}'s link to the head ({injected.get('link')}) cut for {cut} s: Ray, the store, the "
                    f"model endpoint and the effects service out of reach of its "
                    f"{len(sandboxes)} sandbox(es) ({', '.join(sandboxes)}); "
                    f"the driver gave them up, {fence}; healed: {back}; the zombie {injected.get('zombie')} then made "
                    f"{len(store)} store request(s) ({len(landed)} write(s) landed) and "
                    f"{len(act.get('refused_calls') or [])} model/effects call(s) refused; "
                    + ("it exited by itself" if injected.get("zombie_ended_by_itself") else "then killed")
                    + self._where(spec, injected))
        return r


async def _running(host, sandbox_id: str) -> bool:
    import asyncio

    try:
        return bool(await asyncio.wait_for(host.is_running.remote(sandbox_id), 10))
    except Exception:  # noqa: BLE001 - not answering: taken as ended (the kill after it says more)
        return False


@register
class DegradedLink:
    """NP2: the link of the task's node to the head carries less for a seeded window: seeded loss, a rate cap,
    delay and jitter (the kernel's netem), on everything the node sends and gets (Ray too). Where the kernel has no
    netem, loss is a packet filter of seeded probability and the rate a token bucket; the receipt names delay and
    jitter as not applied. A durable runner rides it out: its tasks must pass as without it."""

    id = "NP2"
    family = "network"
    times_from_runner_start = True
    description = "degraded link: seeded loss, rate cap, delay and jitter on the node's link to the head, for a window"
    default_at = (0.3, 1.0)
    default_window = (2.0, 5.0)

    def plan(self, task_id: str, rng: random.Random, base: dict) -> FaultSpec:
        lo, hi = base.get("at_s", self.default_at)
        wlo, whi = base.get("window_s", self.default_window)
        loss = float(base["strength"]) if base.get("strength") else round(rng.uniform(2.0, 8.0), 2)
        return FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id, trigger="time",
                         at_s=round(rng.uniform(lo, hi), 3), seed=rng.randrange(2**31),
                         params={"window_s": round(rng.uniform(wlo, whi), 3), "loss_pct": min(loss, 50.0),
                                 "rate_kbit": rng.choice([2000, 5000, 10000]),
                                 "delay_ms": rng.randint(20, 120), "jitter_ms": rng.randint(5, 30)})

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        node = await ctx.node_of(spec.task_id)
        if node is None:
            return {"applied": False, "why": "the task had no attempt on a node at the planned time"}
        p = spec.params
        return await run_to_end(ctx.degrade_link(node, p["window_s"], spec.instance, loss_pct=p["loss_pct"],
                                                 rate_kbit=p["rate_kbit"], delay_ms=p["delay_ms"],
                                                 jitter_ms=p["jitter_ms"]))

    async def settle(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> None:
        return None

    async def clear(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> dict:
        return {}  # the link is restored inside the fault (it runs to its end)

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt:
        from faults.base import NOT_APPLIED, UNKNOWN

        applied = injected.get("applied")
        status = APPLIED if applied is True else (UNKNOWN if applied is None else NOT_APPLIED)
        if status != APPLIED:
            return Receipt(fault_id=self.id, instance=spec.instance, task_id=spec.task_id, status=status,
                           target={"node": injected.get("node")}, detail=injected.get("why", ""),
                           fired_at=injected.get("at"))
        what = [f"{k.split('_')[0]} {injected[k]}{' %' if k == 'loss_pct' else ' kbit/s'}"
                for k in ("loss_pct", "rate_kbit") if k in injected]
        what += [f"delay {injected['delay_ms']} ms ± {injected['jitter_ms']} ms"] if "delay_ms" in injected else []
        restored = injected.get("restored") or {}
        return Receipt(fault_id=self.id, instance=spec.instance, task_id=spec.task_id, status=APPLIED,
                       target={"node": injected.get("node"), "how": injected.get("how"),
                               "sandboxes": injected.get("sandboxes")},
                       detail=(f"node {injected.get('node')}'s link to the head degraded for "
                               f"{spec.params['window_s']} s ({injected.get('how')}): {', '.join(what) or 'nothing'}"
                               + (f"; not applied: {'; '.join(injected['not_applied'])}"
                                  if injected.get("not_applied") else "")
                               + ("; restored" if restored.get("restored") else
                                  f"; NOT restored: {restored.get('errors') or restored.get('why')}")),
                       fired_at=injected.get("at"), evidence={"planned": dict(spec.params)})
