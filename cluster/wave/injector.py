"""The injector: each planned fault runs as its own asyncio task beside its task's attempts. It waits for the
fault's time or boundary, draws its probability once, injects, waits until the effect is over, and always clears
it (on cancellation too), then keeps the fault's receipt. A crashed injection is `unknown`, never a pass."""
from __future__ import annotations

import asyncio
from typing import Callable

from cluster.wave.timeline import Event
from faults.base import CATALOG, UNKNOWN, FaultSpec, Receipt
from faults.planner import drawn
from fleet.records import Injected


def node_taken(spec: FaultSpec, ctx, exc: BaseException) -> str | None:
    """Why a fault could not act when a node loss (PK3) took its task's node, and with it the host the fault
    called; None for any other failure (which stays a crashed injection, `unknown`)."""
    from ray.exceptions import RayActorError

    nodes = getattr(ctx, "nodes", None)
    run = (getattr(ctx, "runs", None) or {}).get(spec.task_id)
    node = getattr(run, "node", None)
    if not isinstance(exc, RayActorError) or nodes is None or node is None or node not in nodes.lost:
        return None
    return (f"its node {node} went with {nodes.faults.get(node) or 'a node loss'} before this fault could act "
            f"(the host it called was lost with the node)")


class Injector:
    def __init__(self, timeline, stopping: Callable[[], str | None]):
        """`stopping()`: why the wave is stopping (a signal, a harness fault), or None while it runs."""
        self.timeline = timeline
        self.stopping = stopping
        self.receipts: list[Receipt] = []
        self._evidence: dict[str, dict] = {}  # instance -> evidence noted for it, merged into its receipt when kept

    def add_evidence(self, instance: str, key: str, value: dict) -> None:
        """More evidence for a fault's receipt (what became of a task's disk after it): merged now if its receipt is
        kept, else when it is (the next attempt can start before the fault's clear has run)."""
        noted = self._evidence.setdefault(instance, {})
        noted[key] = dict(noted.get(key) or {}, **value)
        for r in self.receipts:
            if r.instance == instance:
                self._merge(r)

    def _merge(self, receipt: Receipt) -> None:
        for key, value in self._evidence.get(receipt.instance, {}).items():
            receipt.evidence[key] = dict(receipt.evidence.get(key) or {}, **value)

    async def fire(self, spec: FaultSpec, ctx) -> None:
        fault = CATALOG[spec.fault_id]
        injected = Injected(_keys=())  # nothing yet
        cleared: dict = {}
        tl = self.timeline
        try:
            if spec.trigger == "time" and ctx is not None and getattr(fault, "times_from_runner_start", False):
                # a seeded time after the task's runner started, not after its lease was taken (a container can
                # take a second or two to start; the kill would land before the runner did anything)
                await ctx.runner_started(spec.task_id)
            await asyncio.sleep(spec.at_s)
            if not drawn(spec):
                injected = Injected(why=f"probability draw ({spec.probability}) said no")
                return
            injected = Injected.of(await fault.inject(spec, ctx))
            tl(Event.FAULT_INJECT, task=spec.task_id, fault=spec.fault_id, instance=spec.instance,
               applied=injected.applied, why=injected.why)
            if injected.applied:
                await fault.settle(spec, ctx, injected.to_dict())
        except asyncio.CancelledError:
            if not injected._keys:
                stop = self.stopping()
                why = "the task ended" if stop is None else f"the wave stopped ({stop})"
                injected = Injected(why=f"{why} before the planned time")
        except Exception as exc:  # noqa: BLE001 - a crashed injection is `unknown`, never a pass
            gone = node_taken(spec, ctx, exc)
            injected = Injected(why=gone) if gone and not injected.applied else \
                injected.crashed(f"{type(exc).__name__}: {exc}")
        finally:
            try:
                cleared = await fault.clear(spec, ctx, injected.to_dict())
            except Exception as exc:  # noqa: BLE001
                cleared = {"error": f"clear failed: {exc}"}
            receipt = fault.receipt(spec, injected.to_dict(), cleared)
            if injected.error is not None:
                receipt.status, receipt.detail = UNKNOWN, f"injection crashed: {injected.error}"
            self._merge(receipt)
            self.receipts.append(receipt)
            # when it fired and at what: a resumed wave rebuilds the receipt from this event (cluster/wave/resume.py)
            tl(Event.FAULT_CLEAR, task=spec.task_id, fault=spec.fault_id, instance=spec.instance,
               status=receipt.status, detail=receipt.detail, fired_at=receipt.fired_at, target=receipt.target)

    @staticmethod
    def settle_arms(run, sandbox_id: str, watches: dict) -> bool:
        """What the attempt's watches saw: a fired one hands its kill to its fault; the others carry the rest
        of their count to the next attempt. True if one fired."""
        fired = False
        for reason, w in watches.items():
            entry = run.arms.get(reason)
            if entry is None or entry["future"].done():
                continue
            if w.get("error"):
                entry["future"].set_result({"applied": None, "error": f"the watch crashed: {w['error']}",
                                            "sandbox_id": sandbox_id})
                fired = True
            elif w.get("fired"):
                entry["future"].set_result(dict(w, sandbox_id=sandbox_id))
                fired = True
            else:
                entry["arm"]["nth"] -= int(w.get("seen", 0))
        return fired
