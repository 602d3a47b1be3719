"""What the wave lets a fault touch (`faults.base.FaultContext`), built from the wave's rooms."""
from __future__ import annotations

import asyncio
import time

from cluster import results
from fleet.lifecycle import TASK_ENDED


class WaveContext:
    def __init__(self, wave_id: str, runs: dict, parts, access, nodes, health, out: results.ResultsDir):
        self.wave_id = wave_id
        self.runs = runs
        self.parts = parts
        self.access = access
        self.nodes = nodes
        self.health = health
        self.out = out
        self.stopping = lambda: None  # why the wave is stopping (a signal, a harness fault), or None while it runs

    @property
    def bucket(self) -> str:
        return self.parts.bucket

    def task_prefix(self, task_id: str) -> str:
        return results.task_prefix(self.wave_id, task_id)

    async def current_sandbox(self, task_id: str):
        return self.runs[task_id].current

    async def armed_outcome(self, task_id: str, instance: str) -> dict:
        return await self.runs[task_id].arms[instance]["future"]

    async def runner_started(self, task_id: str) -> None:
        """Until the task's current attempt has its runner running (cancelled with the task)."""
        while True:
            cur = self.runs[task_id].current
            if cur is not None:
                try:
                    if await cur[0].started.remote(cur[1], 0.5):
                        return
                except Exception:  # noqa: BLE001 - a lost host: the fault finds no sandbox later
                    return
            await asyncio.sleep(0.02)

    async def wait_model_answers(self, task_id: str, n: int) -> bool:
        """Polls the endpoint's per-task count of delivered answers (cancelled when the task ends)."""
        while self.parts.model.delivered(task_id) < n:
            await asyncio.sleep(0.002)
        return True

    async def wait_effects(self, task_id: str, n: int) -> bool:
        """Polls the effects service's per-task count of answered effects (cancelled when the task ends)."""
        while self.parts.effects.answered(task_id) < n:
            await asyncio.sleep(0.002)
        return True

    async def rotate_credentials(self, task_id: str, delay_s: float) -> dict:
        """CR1: rotate the current attempt's key at the store, then publish the new key to its credential
        source only `delay_s` later (until then credential_process still prints the dead key)."""
        run = self.runs[task_id]
        sid = run.running_sandbox()
        publish = None
        # a remote attempt's credentials are on its node: its host publishes the new key
        if sid is not None and getattr(self.parts.fleet, "remote", False):
            host = run.current[0]

            async def publish(new, host=host, sid=sid):
                return await host.publish_credentials.remote(self.wave_id, sid, new.access_key, new.secret_key)
        return await self.access.rotate(task_id, sid, lambda: run.running_sandbox() == sid, delay_s, publish)

    def store_requests(self, akids: set, t0: float, t1: float) -> list[dict]:
        """The proxy's log lines of requests signed by these key ids between t0 and t1."""
        out = []
        try:
            self.proxy().flush()
        except (RuntimeError, OSError):
            pass
        try:
            for r in results.read_jsonl(self.out.proxy_requests, skip_bad=True):  # the proxy writes on
                if r.get("akid") in akids and t0 <= r["t"] <= t1:
                    out.append(r)
        except OSError:
            pass
        return out

    async def node_of(self, task_id: str) -> str | None:
        run = self.runs[task_id]
        return run.node if run.current is not None else None

    async def lose_node(self, node: str, mode: str, grace_s: float, down_s: float, instance: str,
                        task_id: str) -> dict:
        """PK3: the node goes away with every sandbox on it (after a drain notice when mode is 'drain'), and
        comes back `down_s` later as a new Ray node (an autoscaler replacing a spot VM)."""
        return await self.nodes.lose(node, mode, grace_s, down_s, instance, task_id)

    async def node_back(self, node: str) -> dict:
        """Wait until a lost node is back (the fault's clear)."""
        return await self.nodes.back(node)

    async def partition(self, node: str, cut_s: float, instance: str, task_id: str, fencing: bool) -> dict:
        """NP1: the node's link to the head is cut for `cut_s`, its attempts given up (and fenced), then healed."""
        return await self.nodes.partition(node, cut_s, instance, task_id, fencing)

    async def degrade_link(self, node: str, window_s: float, instance: str, **knobs) -> dict:
        """NP2: the node's link carries less for `window_s`."""
        return await self.nodes.degrade(node, window_s, instance, **knobs)

    async def abandon(self, task_id: str, sandbox_id: str, instance: str) -> None:
        """PK6: the driver gives up on a frozen attempt (its lease will run out) and starts the next one; the
        attempt's keys are revoked now. The frozen sandbox lives on as a zombie until the fault ends it."""
        run = self.runs[task_id]
        if run.current is not None and run.current[1] == sandbox_id and run.abandon_ev is not None:
            run.abandon = {"instance": instance, "at": time.time()}
            run.abandon_ev.set()

    async def newer_attempt(self, task_id: str, sandbox_id: str, timeout_s: float) -> str | None:
        """The sandbox id of a newer attempt of the task once one runs (None after `timeout_s`, or once the task
        ends or the wave stops: `no_newer_why` says which)."""
        run, att = self.runs[task_id], results.attempt_of(sandbox_id)[1]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and run.life.state not in TASK_ENDED and self.stopping() is None:
            if run.attempts > att:
                return results.sandbox_id(task_id, att + 1)
            await asyncio.sleep(0.02)
        return results.sandbox_id(task_id, att + 1) if run.attempts > att else None

    def no_newer_why(self, task_id: str, timeout_s: float) -> str:
        """Why `newer_attempt` gave None."""
        stop = self.stopping()
        if stop is not None:
            return f"the wave stopped ({stop}) before a newer attempt started"
        if self.runs[task_id].life.state in TASK_ENDED:
            return f"the task ended ({self.runs[task_id].life.state.value}) before a newer attempt started"
        return f"NO newer attempt started within {timeout_s:.0f} s"

    def fenced_activity(self, task_id: str, sandbox_id: str, since: float) -> dict:
        """What a zombie attempt did from `since`: its store requests (by its key id) and what each got, and the
        model/effects calls the services refused because its key was revoked."""
        akids = {a for a in [self.access.akids.get(sandbox_id)] if a}
        reqs = self.store_requests(akids, since, time.time() + 1)
        attempt = results.attempt_of(sandbox_id)[1]
        refused = [r for r in list(self.parts.fenced_log.records) if r["task"] == task_id
                   and r["attempt"] == attempt and r["t"] >= since]
        return {"store": [{"method": r.get("method"), "key": r.get("key"), "status": r.get("status")} for r in reqs],
                "refused_calls": [{"service": r["service"], "path": r["path"]} for r in refused]}

    def proxy(self):
        if self.health.lost("fault proxy"):
            raise RuntimeError("the fault proxy is lost (harness fault)")
        return self.parts.proxy.control()
