"""Preemption faults (PK*)."""
from __future__ import annotations

import random

from faults.base import APPLIED, NOT_APPLIED, UNKNOWN, FaultContext, FaultSpec, Receipt, register


async def run_to_end(coro):
    """Await `coro` to its end even if the awaiting fault task is cancelled meanwhile (its task ended): a fault
    that has begun changing the world (a drain, a freeze) finishes and restores it, and says so in its receipt.
    Every such coroutine is bounded by its own timeouts."""
    import asyncio

    task = asyncio.ensure_future(coro)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                return task.result()


def boundary_kills(fid: str, task_id: str, rng: random.Random, trigger: str, rng_range, base: dict,
                   extra: dict) -> FaultSpec | list[FaultSpec]:
    """One kill at a seeded Nth boundary, or `kills` K kills at K distinct seeded N (instances -1, -2, ...)."""
    lo, hi = int(rng_range[0]), int(rng_range[1])
    k = int(base.get("kills") or 1)
    ns = sorted(rng.sample(range(lo, hi + 1), k)) if k > 1 else [rng.randint(lo, hi)]
    specs = [FaultSpec(fault_id=fid, instance=f"{task_id}-{fid}" + (f"-{i + 1}" if k > 1 else ""), task_id=task_id,
                       trigger=trigger, at_s=0.0, seed=rng.randrange(2**31),
                       params={"after": n, **extra, **({"kill": i + 1, "kills": k} if k > 1 else {})})
             for i, n in enumerate(ns)]
    return specs if k > 1 else specs[0]


@register
class SigkillSandbox:
    """PK1: SIGKILL every process of the task's running sandbox at a seeded time after launch, or
    right after the Nth model answer was delivered to it (a boundary of the runner, black-box)."""

    id = "PK1"
    family = "preemption"
    # what the grader asks the catalog (cluster/grade/facts.py), never a fault id: one kill of the running attempt at a
    # moment of the runner (a kill that landed before the attempt did anything durable tested nothing)
    kills_attempt = True
    # what becomes of the task's disk when this interruption ends its attempt (`sandbox.disk`, fault_timing's `disk`):
    # wipe (a new machine's fresh disk) or keep (the process died, the disk stayed: a restarted container, a
    # rebooted VM), lose-unsynced / torn (a power loss: what was not fsynced is gone, the write in flight torn). A
    # fault that takes the node can wipe or move it; one that leaves a zombie on the disk can only wipe
    disk_modes = ("wipe", "keep", "lose-unsynced", "torn")
    # its seeded time counts from the runner's start, not the lease's (a container can take seconds to start);
    # storage faults keep launch-relative windows
    times_from_runner_start = True
    description = ("SIGKILL the sandbox at a seeded time after launch, or at a boundary of the runner: right after "
                   "its Nth model answer, external effect or store write (ambiguous: write applied, answer held)")
    default_window = (0.6, 1.8)

    # boundary kinds: config key -> (trigger, what the receipt calls it)
    BOUNDARIES = {"after_model_calls": ("model_call", "model answer"), "after_effects": ("effect", "external effect"),
                  "after_store_writes": ("store_write", "store write"),
                  # the runner's own disk, counted by the lazy file system on its host (a crash-mode volume)
                  "after_disk_writes": ("disk_write", "disk write"), "after_disk_fsyncs": ("disk_fsync", "fsync"),
                  "after_disk_renames": ("disk_rename", "rename")}

    def plan(self, task_id: str, rng: random.Random, base: dict) -> FaultSpec:
        if "during" in base:  # inside another fault's window (ST1+PK1): a seeded time after it opened
            return FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id, trigger="during",
                             at_s=0.0, seed=rng.randrange(2**31),
                             params={"during": base["during"], "into_s": round(rng.uniform(0.1, 0.6), 3)})
        if "at_request" in base:  # the next matching store request, held by the proxy while the kill lands
            return FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id, trigger="request",
                             at_s=0.0, seed=rng.randrange(2**31), params={"at_request": dict(base["at_request"])})
        for key, (trigger, _) in self.BOUNDARIES.items():
            if key in base:
                return boundary_kills(self.id, task_id, rng, trigger, base[key], base,
                                      {"variant": base.get("variant", "after")})
        lo, hi = base.get("at_s", self.default_window)
        return FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id, trigger="time",
                         at_s=round(rng.uniform(lo, hi), 3), seed=rng.randrange(2**31), params={})

    def plan_with(self, task_id: str, rng: random.Random, base: dict, own: tuple, params) -> FaultSpec | list:
        """PK1's plan (its triggers, `kills`) for a fault built on it, without that fault's `own` config keys;
        `params(rng)` gives each planned instance its own seeded knobs."""
        specs = SigkillSandbox.plan(self, task_id, rng, {k: v for k, v in base.items() if k not in own})
        for sp in specs if isinstance(specs, list) else [specs]:
            sp.params.update(params(rng))
        return specs

    async def _store_write(self, spec: FaultSpec, ctx: FaultContext) -> dict | None:
        """Arm a proxy boundary rule at the task's Nth 2xx write; returns None once it fired."""
        import asyncio

        n, variant = spec.params["after"], spec.params.get("variant", "after")
        ctl = ctx.proxy()
        await asyncio.to_thread(ctl.open_rule, rule_id=spec.instance, action="boundary",
                                methods=["PUT", "POST", "DELETE"],
                                bucket=ctx.bucket, key_prefix=ctx.task_prefix(spec.task_id), nth=n, variant=variant,
                                fault=self.id)
        while True:
            rules = await asyncio.to_thread(ctl.rules)
            rule = next((r for r in rules["rules"] if r["rule_id"] == spec.instance), None)
            if rule is None:
                return {"applied": False, "why": "the boundary rule was closed before it fired"}
            if rule["first_hit_at"] is not None:
                self_key = (rule.get("hit_keys") or ["?"])[0]
                return {"boundary_key": self_key}
            await asyncio.sleep(0.005)

    async def _at_request(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        """Arm a proxy `hold` rule; returns once a matching request of the task arrived (and is held)."""
        import asyncio

        want = spec.params["at_request"]
        ctl = ctx.proxy()
        await asyncio.to_thread(ctl.open_rule, rule_id=spec.instance, action="hold", bucket=ctx.bucket,
                                key_prefix=ctx.task_prefix(spec.task_id) + (want.get("key_prefix") or ""),
                                ops=want.get("ops"), methods=want.get("methods"), max_hits=1, fault=self.id)
        while True:
            rules = await asyncio.to_thread(ctl.rules)
            rule = next((r for r in rules["rules"] if r["rule_id"] == spec.instance), None)
            if rule is None:
                return {"applied": False, "why": "the hold rule was closed before a matching request came"}
            if rule["first_hit_at"] is not None:
                return {"held_request": (rule.get("hit_keys") or ["?"])[0], "held_at": rule["first_hit_at"]}
            await asyncio.sleep(0.005)

    async def _during(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        """Wait until the other fault's proxy window has opened (its first hit), then `into_s` more."""
        import asyncio
        import time

        rid = spec.params["during"]
        while True:
            rules = await asyncio.to_thread(ctx.proxy().rules)
            rule = next((r for r in rules["rules"] if r["rule_id"] == rid), None)
            if rule is not None and rule["first_hit_at"] is not None:
                break
            if rule is None and any(r["rule_id"] == rid for r in rules["closed"]):
                return {"applied": False, "why": f"{rid} closed without its window opening"}
            await asyncio.sleep(0.01)
        await asyncio.sleep(max(0.0, rule["first_hit_at"] + spec.params["into_s"] - time.time()))
        closes = rule["first_hit_at"] + rule["duration_s"] if rule.get("duration_s") else None
        return {"window_opened_at": rule["first_hit_at"], "window_closes_at": closes}

    def attempt_arm(self, spec: FaultSpec) -> dict | None:
        """A kill at the runner's own disk boundary is armed with every attempt on the task's host, which kills from
        where the volume is served while the operation is held (no round trip): N counts over the volume's life."""
        if not spec.trigger.startswith("disk_"):
            return None
        return {"kind": "disk", "op": spec.trigger.removeprefix("disk_"), "nth": spec.params["after"],
                "reason": spec.instance}

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        at = {}
        n = spec.params.get("after", spec.params.get("after_calls"))
        if spec.trigger.startswith("disk_"):
            return await ctx.armed_outcome(spec.task_id, spec.instance)
        if spec.trigger == "model_call":
            if not await ctx.wait_model_answers(spec.task_id, n):
                return {"applied": False, "why": f"the task ended before its model answer #{n} was delivered"}
        elif spec.trigger == "effect":
            if not await ctx.wait_effects(spec.task_id, n):
                return {"applied": False, "why": f"the task ended before its external effect #{n} was answered"}
        elif spec.trigger == "store_write":
            at = await self._store_write(spec, ctx)
            if "applied" in at:
                return at
        elif spec.trigger == "during":
            at = await self._during(spec, ctx)
            if "applied" in at:
                return at
        elif spec.trigger == "request":
            at = await self._at_request(spec, ctx)
            if "applied" in at:
                return at
        current = await ctx.current_sandbox(spec.task_id)
        if current is None:
            return {"applied": False, "why": "the task had no running sandbox at the planned time"}
        host, sandbox_id = current
        # a kill once sent is seen to its end, and said: a runner that answers a notice by exiting 0 ends its task,
        # which cancels the task's faults while the host still reports how the sandbox ended
        out = await run_to_end(self.strike(host, sandbox_id, spec, ctx))
        out["sandbox_id"] = sandbox_id
        out.update(at)
        return out

    async def strike(self, host, sandbox_id: str, spec: FaultSpec, ctx: FaultContext) -> dict:
        """The preemption itself, once the trigger fired: PK1 is a SIGKILL with no notice."""
        return await host.kill.remote(sandbox_id, 0.0, f"{spec.instance}")

    async def settle(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> None:
        return None  # a kill is over once sent

    async def clear(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> dict:
        if spec.trigger in ("store_write", "request"):  # release what the rule held (the runner is gone)
            import asyncio

            try:
                await asyncio.to_thread(ctx.proxy().close_rule, spec.instance)
            except RuntimeError:
                pass  # never opened, or already closed
        return {}  # a kill has nothing else to heal: the driver starts the next attempt

    def _where(self, spec: FaultSpec, injected: dict) -> str:
        n = spec.params.get("after", spec.params.get("after_calls"))
        if spec.trigger == "model_call":
            return f", right after model answer #{n}"
        if spec.trigger == "effect":
            return f", right after external effect #{n} was answered"
        if spec.trigger == "request":
            return (f", while the proxy held its store request {injected.get('held_request')} (never forwarded; "
                    "dropped when the kill was done)")
        if spec.trigger == "during":
            closes, at = injected.get("window_closes_at"), injected.get("at")
            if closes is not None and at is not None and at > closes:  # said as it was, not as it was planned
                return (f", {at - injected['window_opened_at']:.2f} s after the {spec.params['during']} outage "
                        f"opened: after it had closed (planned {spec.params['into_s']} s into it)")
            return f", {spec.params['into_s']} s into the {spec.params['during']} outage (the runner was retrying)"
        if spec.trigger.startswith("disk_"):
            what = {"disk_write": "while its disk write", "disk_fsync": "right before its fsync",
                    "disk_rename": "right after its rename"}[spec.trigger]
            return f", {what} #{n} ({injected.get('disk_path')}) was held by the lazy file system"
        if spec.trigger == "store_write":
            if spec.params.get("variant") == "ambiguous":
                return (f", when the store had applied write #{n} ({injected.get('boundary_key')}) but before the "
                        "runner got its answer (ambiguous commit)")
            return f", right after the runner got the answer to store write #{n} ({injected.get('boundary_key')})"
        return ""

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt:
        applied = injected.get("applied")
        ok = applied is True
        return Receipt(fault_id=self.id, instance=spec.instance, task_id=spec.task_id,
                       status=APPLIED if ok else (UNKNOWN if applied is None else NOT_APPLIED),
                       target={"sandbox_id": injected.get("sandbox_id"), "pid": injected.get("pid"),
                               "node": injected.get("node")},
                       detail=("SIGKILL to every process of the sandbox" + self._where(spec, injected))
                       if ok else injected.get("why", ""),
                       fired_at=injected.get("at"))


@register
class NamedWindowKill(SigkillSandbox):
    """PK5: SIGKILL right after the runner announced its Nth named window (a line appended to the file
    `$SANDFLEET_CHECKPOINT`, e.g. `{"name": "before-commit:3"}`). The sandbox host watches the file and
    kills from where the sandbox runs (no round trip), so the kill lands a few ms after the announcement."""

    id = "PK5"
    family = "preemption"
    description = ("SIGKILL right after the runner's Nth named window announced through SANDFLEET_CHECKPOINT "
                   "(optionally only names starting with `window`)")

    def plan(self, task_id: str, rng: random.Random, base: dict) -> FaultSpec | list[FaultSpec]:
        return boundary_kills(self.id, task_id, rng, "checkpoint", base.get("after_checkpoints", (1, 3)), base,
                              {"window": base.get("window") or ""})

    def attempt_arm(self, spec: FaultSpec) -> dict | None:
        """Armed with every attempt of the task: N counts the task's announcements over its attempts (an
        attempt that ends first hands the rest of the count to the next one)."""
        return {"kind": "checkpoints", "nth": spec.params["after"], "window": spec.params.get("window", ""),
                "reason": spec.instance}

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        return await ctx.armed_outcome(spec.task_id, spec.instance)

    def _where(self, spec: FaultSpec, injected: dict) -> str:
        w = spec.params.get("window")
        return (f", right after named window #{spec.params['after']}" + (f" starting {w!r}" if w else "") +
                f" ({injected.get('window_name')!r}, " + (f"{injected['lag_ms']} ms after it was announced)"
                                                          if injected.get("lag_ms") is not None else
                                                          "its announced time was not usable)"))

    async def clear(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> dict:
        return {}


@register
class SpotNotice(SigkillSandbox):
    """PK2: a spot interruption: a notice is written to `$SANDFLEET_NOTICE` (like a cloud metadata service's
    `instance-action`), SIGTERM, a seeded grace in which the runner may checkpoint, then SIGKILL. Triggers
    as PK1 (a clock time, or a boundary of the runner)."""

    id = "PK2"
    family = "preemption"
    description = "spot notice: a notice file + SIGTERM, a seeded grace (the runner may checkpoint), then SIGKILL"
    default_grace = (1.0, 3.0)

    def plan(self, task_id: str, rng: random.Random, base: dict):
        lo, hi = base.get("window_s", self.default_grace)
        return self.plan_with(task_id, rng, base, ("window_s",), lambda r: {"grace_s": round(r.uniform(lo, hi), 3)})

    async def strike(self, host, sandbox_id: str, spec: FaultSpec, ctx: FaultContext) -> dict:
        import time

        grace = spec.params["grace_s"]
        notice = {"action": "terminate", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + grace)),
                  "grace_s": grace, "reason": "spot interruption (sandfleet PK2)"}
        wrote = await host.notify.remote(sandbox_id, notice)
        out = await host.kill.remote(sandbox_id, grace, f"{spec.instance}")
        out["notice"] = wrote
        return out

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt:
        """Applied when the notice was written and SIGTERM reached the runner (its own exit in the grace, 0
        included, is its answer to the notice); the detail says which way the attempt ended: by itself within the
        grace, or SIGKILLed at its end."""
        r = super().receipt(spec, injected, cleared)
        if r.status != APPLIED:
            return r
        n, term = injected.get("notice") or {}, injected.get("sigterm_at")
        grace, code = spec.params["grace_s"], injected.get("exit_code")
        ended, sigkill = injected.get("ended_at"), injected.get("sigkill")
        if term is None:  # the kill landed, but no live init took the SIGTERM: no notice reached the runner
            r.status, told = UNKNOWN, "SIGTERM NOT delivered (the sandbox's init was gone)"
        elif not n.get("written"):
            r.status, told = UNKNOWN, f"notice NOT written ({n.get('why', '?')}), SIGTERM delivered"
        else:
            told = "notice written to $SANDFLEET_NOTICE, SIGTERM delivered"
        if sigkill is False and code is not None:
            after = f" {ended - term:.2f} s after the SIGTERM" if ended and term else ""
            how = f"the runner exited {code}{after}, within the grace: no SIGKILL was sent"
        elif sigkill:
            how = "the runner was still running at the end of the grace: SIGKILL to every process of the sandbox"
        else:  # (a host that did not say: an older one)
            how = (f"it ended with exit {code}" if code is not None else "it ended") + " (SIGKILL sent if needed)"
        r.target = dict(r.target, exited_in_grace=sigkill is False and code is not None,
                        exit_code=code, sigkill=sigkill)
        r.detail = f"{told}, {grace} s grace: {how}" + SigkillSandbox._where(self, spec, injected)
        return r


@register
class NodeLoss(SigkillSandbox):
    """PK3: the Ray node running the task's attempt goes away with every sandbox on it. 'abrupt': its host
    process and raylet are killed at once. 'drain': first a Ray drain with reason PREEMPTION and a deadline (as
    `ray drain-node` / a cloud autoscaler does), the notice in every sandbox's `$SANDFLEET_NOTICE` and a
    SIGTERM, then the loss at the deadline. The node comes back a seeded time later as a new Ray node. Triggers
    as PK1. Needs a simulated cluster (`--nodes 3`): the head holds the harness and is never lost."""

    id = "PK3"
    family = "preemption"
    kills_attempt = False  # it takes the node: the tasks it hit are judged by the node's loss
    takes_node = True  # a wave with it runs its reference runs first (a node is never lost under one)
    # the node and its local disk are gone (wipe), or the disk was a network one, re-attached to the next attempt on
    # another node (move: the volume read back before the loss, carried through Ray)
    disk_modes = ("wipe", "move")
    description = ("node loss: the Ray node of the task's attempt dies with every sandbox on it (abrupt, or after "
                   "a PREEMPTION drain with a deadline and a notice), and comes back later")
    default_grace = (1.0, 3.0)
    default_down = (2.0, 6.0)

    def plan(self, task_id: str, rng: random.Random, base: dict):
        lo, hi = base.get("window_s", self.default_grace)
        dlo, dhi = base.get("down_s", self.default_down)
        return self.plan_with(task_id, rng, base, ("window_s", "mode", "down_s"), lambda r: {
            "mode": base.get("mode") or r.choice(["abrupt", "drain"]), "grace_s": round(r.uniform(lo, hi), 3),
            "down_s": round(r.uniform(dlo, dhi), 3)})

    async def strike(self, host, sandbox_id: str, spec: FaultSpec, ctx: FaultContext) -> dict:
        node = await ctx.node_of(spec.task_id)
        if node is None:
            return {"applied": False, "why": "the task had no attempt on a node at the planned time"}
        p = spec.params
        return await run_to_end(ctx.lose_node(node, p["mode"], p["grace_s"], p["down_s"], spec.instance, spec.task_id))

    async def clear(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> dict:
        out = await super().clear(spec, ctx, injected)
        if injected.get("applied") and injected.get("node"):
            out = dict(out, **await ctx.node_back(injected["node"]))  # the node is back before the fault ends
        return out

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt:
        r = super().receipt(spec, injected, cleared)
        if r.status != APPLIED:
            return r
        p, node = spec.params, injected.get("node")
        drain = injected.get("drain") or {}
        how = ("raylet and host killed at once" if p["mode"] == "abrupt" else
               "drained for PREEMPTION ("
               f"{'accepted' if drain.get('accepted') else 'REFUSED: ' + str(drain.get('rejection'))}"
               f" by the GCS), notice + SIGTERM to {injected.get('noticed', 0)} sandbox(es), lost at the "
               f"{p['grace_s']} s deadline")
        back = (f"back as a new Ray node after {cleared['down_s']} s" if cleared.get("back") else
                f"NOT back: {cleared.get('error', 'the wave ended first')}")
        if cleared.get("back") and cleared.get("cut_short"):
            back += f" (of {cleared.get('planned_down_s')} s planned: {cleared['cut_short']})"
        r.target = {"sandbox_id": injected.get("sandbox_id"), "node": node, "sandboxes": injected.get("sandboxes"),
                    "host_pid": injected.get("host_pid")}
        r.detail = (f"node {node} lost ({how}) with {len(injected.get('sandboxes') or [])} sandbox(es) on it "
                    f"({', '.join(injected.get('sandboxes') or [])}); {back}" + self._where(spec, injected))
        if injected.get("moved"):  # disk move: each task's volume read back before the loss, for its next attempt
            r.evidence["moved"] = injected["moved"]
        return r


@register
class FreezeZombie(SigkillSandbox):
    """PK6: freeze the task's sandbox (cgroup freezer) and stop its lease renewals, as if its machine stalled.
    The lease runs out, the driver abandons the attempt (revoking its keys) and a new attempt takes the task
    with a higher fence; then the old sandbox is thawed: a zombie that believes it still holds the task. Every
    write it makes must be refused (revoked key at the store and the services, stale fence in the ledger), and
    it is killed after `observe_s`. Triggers as PK1."""

    id = "PK6"
    family = "preemption"
    kills_attempt = False  # it freezes the attempt; the zombie is then judged by the check it adds
    adds_checks = ("fenced_writes_rejected",)
    disk_modes = ("wipe",)  # its zombie still runs on the old disk
    description = ("freeze the sandbox past its lease expiry, let a new attempt take the task, then thaw the old "
                   "one: every write the zombie makes must be refused")
    default_thaw = (0.3, 1.0)
    observe_s = 4.0

    def plan(self, task_id: str, rng: random.Random, base: dict):
        lo, hi = base.get("window_s", self.default_thaw)
        return self.plan_with(task_id, rng, base, ("window_s",),
                              lambda r: {"thaw_after_s": round(r.uniform(lo, hi), 3)})

    async def strike(self, host, sandbox_id: str, spec: FaultSpec, ctx: FaultContext) -> dict:
        fr = await host.freeze_attempt.remote(sandbox_id)
        if not fr.get("applied"):
            return fr
        # from here on the fault runs to its end even if the task ends first (which cancels its faults): a frozen
        # sandbox is never left behind, and the receipt says what happened (every wait below is bounded)
        return await run_to_end(self._zombie(host, sandbox_id, spec, ctx, fr))

    async def _zombie(self, host, sandbox_id: str, spec: FaultSpec, ctx: FaultContext, fr: dict) -> dict:
        import asyncio
        import time

        await ctx.abandon(spec.task_id, sandbox_id, spec.instance)
        newer = await ctx.newer_attempt(spec.task_id, sandbox_id, timeout_s=120)
        no_newer = None if newer else ctx.no_newer_why(spec.task_id, 120)
        await asyncio.sleep(spec.params["thaw_after_s"] if newer else 0)
        th = await host.thaw_attempt.remote(sandbox_id)
        thawed_at = th.get("at") or time.time()
        deadline = time.monotonic() + self.observe_s
        while time.monotonic() < deadline and await host.is_running.remote(sandbox_id):
            await asyncio.sleep(0.05)
        still = await host.is_running.remote(sandbox_id)
        if still:
            await host.kill.remote(sandbox_id, 0.0, f"{spec.instance} (zombie observed {self.observe_s} s)")
        return {"applied": True, "at": fr["at"], "pid": None, "node": fr.get("node"), "newer": newer,
                "no_newer": no_newer, "thawed": th.get("thawed"), "thawed_at": thawed_at, "zombie_killed": still,
                "activity": ctx.fenced_activity(spec.task_id, sandbox_id, thawed_at)}

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt:
        r = super().receipt(spec, injected, cleared)
        if r.status != APPLIED:
            return r
        act, store, landed, r.evidence = zombie_evidence(injected)
        r.target = dict(r.target, zombie=injected.get("sandbox_id"), newer=injected.get("newer"),
                        thawed_at=injected.get("thawed_at"))
        r.detail = (f"sandbox {injected.get('sandbox_id')} frozen and its lease left to run out; "
                    + (f"attempt {injected.get('newer')} took the task, then " if injected.get("newer") else
                       f"{injected.get('no_newer') or 'NO newer attempt started within 120 s'}; ")
                    + (f"thawed {spec.params['thaw_after_s']} s later" if injected.get("newer") else "thawed at once")
                    + f": the zombie made {len(store)} store request(s) "
                      f"({len(landed)} write(s) landed) and {len(act.get('refused_calls') or [])} model/effects "
                      f"call(s) refused; " + ("killed after " + str(self.observe_s) + " s" if injected.get(
                          "zombie_killed") else "it exited by itself"))
        return r


def zombie_evidence(injected: dict) -> tuple[dict, list, list, dict]:
    """What a zombie (PK6 thawed, NP1 healed) did: (activity, its store requests, the writes of them that landed,
    the receipt's evidence)."""
    act = injected.get("activity") or {}
    store = act.get("store") or []
    landed = [x for x in store if x["method"] in ("PUT", "POST", "DELETE") and 200 <= (x["status"] or 0) < 300]
    return act, store, landed, {"zombie_store_requests": store[:50],
                                "refused_calls": (act.get("refused_calls") or [])[:50]}


_PROGRESS: dict[str, list] = {}  # PK4 instance -> kills so far (kept if the task ends mid-loop)


@register
class CrashLoop:
    """PK4: a crash loop: the task's next K attempts (K seeded 2-4) are each killed a seeded short gap after
    they start, then the task is left alone. A runner must come back every time, and its budget must hold."""

    id = "PK4"
    family = "preemption"
    disk_modes = ("wipe", "keep", "lose-unsynced", "torn")  # each kill ends the attempt's process, as PK1's
    description = "crash loop: the next K attempts are each SIGKILLed a short seeded gap after they start"
    default_gaps = (0.3, 1.2)

    def plan(self, task_id: str, rng: random.Random, base: dict) -> FaultSpec:
        k = int(base.get("kills") or rng.randint(2, 4))
        lo, hi = base.get("window_s", self.default_gaps)
        return FaultSpec(fault_id=self.id, instance=f"{task_id}-{self.id}", task_id=task_id, trigger="attempts",
                         at_s=0.0, seed=rng.randrange(2**31),
                         params={"kills": k, "gaps_s": [round(rng.uniform(lo, hi), 3) for _ in range(k)]})

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict:
        import asyncio
        import time

        kills, seen = _PROGRESS.setdefault(spec.instance, []), set()
        for gap in spec.params["gaps_s"]:
            while True:  # the next attempt (one not killed yet)
                current = await ctx.current_sandbox(spec.task_id)
                if current is not None and current[1] not in seen:
                    break
                await asyncio.sleep(0.01)
            host, sandbox_id = current
            seen.add(sandbox_id)
            await host.started.remote(sandbox_id)  # the gap counts from the runner's start
            await asyncio.sleep(gap)
            out = await host.kill.remote(sandbox_id, 0.0, f"{spec.instance}#{len(kills) + 1}")
            kills.append({"sandbox_id": sandbox_id, "gap_s": gap, "applied": out.get("applied"),
                          "why": out.get("why", ""), "at": out.get("at", time.time())})
        landed = [k for k in kills if k["applied"]]
        return {"applied": bool(landed), "kills": kills, "at": kills[0]["at"] if kills else None,
                "sandbox_id": landed[0]["sandbox_id"] if landed else None,
                "why": "" if landed else "no kill landed (every attempt ended first)"}

    async def settle(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> None:
        return None

    async def clear(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> dict:
        return {}

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt:
        # a task that finished between two kills cancels the loop: the kills that landed still count
        kills = injected.get("kills") or _PROGRESS.pop(spec.instance, [])
        _PROGRESS.pop(spec.instance, None)
        landed = [k for k in kills if k["applied"]]
        applied = injected.get("applied") if "kills" in injected else (bool(landed) if kills else
                                                                      injected.get("applied"))
        status = APPLIED if applied else (NOT_APPLIED if applied is False else UNKNOWN)
        detail = (f"{len(landed)} of {spec.params['kills']} attempts SIGKILLed "
                  f"{', '.join(str(k['gap_s']) + ' s' for k in landed)} after they started, then left alone"
                  if landed else injected.get("why", "the task ended before the crash loop began"))
        return Receipt(fault_id=self.id, instance=spec.instance, task_id=spec.task_id, status=status,
                       target={"sandbox_id": injected.get("sandbox_id"), "kills": spec.params["kills"]},
                       detail=detail, fired_at=injected.get("at"), evidence={"kills": kills})
