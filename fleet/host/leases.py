"""The leases a host holds, renewed together: every tick one batched `renew_many` for all of them (so renewals do
not wait for a sandbox to start nor grow with load); a refused renewal means the attempt was fenced, and its sandbox
is killed.

A lease reaches its host some time after the driver acquired it (under load, the attempt's store key alone can take
seconds to issue), so a lease just held is renewed within `FRESH_S` of its arrival, in a batch of the leases that
arrived meanwhile, not a whole tick later: at 4,000 sandboxes on 50 hollow nodes leases arrived 27 s into a 30 s TTL
and expired before their first tick (issue 45)."""
from __future__ import annotations

import asyncio
import time

from fleet.refs import awaitable
from fleet.records import Lease

FRESH_S = 1.0  # a lease just held is renewed at most this long after it arrived (or half a tick, if shorter)


class LeaseRenewer:
    """A host's held leases (sandbox key -> the lease it runs under) and the task that renews them. It reads the
    host's ledger and backend when it renews (a test may give the host another ledger)."""

    def __init__(self, host):
        self.host = host
        self.held: dict[str, dict] = {}
        self.fresh: dict[str, float] = {}  # sandbox key -> when its lease arrived, until its first renewal
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.stats = {"ticks": 0, "renewed": 0, "refused": 0, "errors": 0, "late_max_s": 0.0, "fresh_batches": 0}

    async def run(self) -> None:
        """Every tick (a quarter of the shortest TTL held), renew all held leases in one ledger call; between ticks,
        the leases that just arrived, within `FRESH_S` of the first of them."""
        due = time.monotonic() + self._tick()
        while self.held:
            tick = self._tick()
            due = min(due, time.monotonic() + tick)
            fresh_due = min(self.fresh.values()) + min(FRESH_S, tick / 2) if self.fresh else None
            until = min(due, fresh_due) if fresh_due is not None else due
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), max(0.0, until - time.monotonic()))
                continue  # a lease arrived: its own deadline may be sooner
            except asyncio.TimeoutError:
                pass
            now = time.monotonic()
            if now >= due:
                self.stats["late_max_s"] = max(self.stats["late_max_s"], round(now - due, 3))
                batch = list(self.held.items())
                due = now + tick
                self.stats["ticks"] += 1
            else:
                batch = [(k, self.held[k]) for k in self.fresh if k in self.held]
                self.stats["fresh_batches"] += 1
            self.fresh.clear()
            if batch:
                await self._renew(batch, tick)
        self.task = None

    def _tick(self) -> float:
        return min((h["ttl"] for h in self.held.values()), default=4.0) / 4

    async def _renew(self, batch: list[tuple[str, dict]], tick: float) -> None:
        try:
            res = await asyncio.wait_for(awaitable(self.host.ledger.renew_many.remote(
                [(h["task_id"], h["fence"], h["version"], h["ttl"], h["holder"]) for _, h in batch])),
                max(1.0, tick * 2))
        except Exception:  # noqa: BLE001 - slow or lost ledger: leases run on until expiry; retry next tick.
            # The ledger may still apply this batch after we stopped waiting: the next one names the holder,
            # so the ledger renews a lease whose version moved on by our own renewal instead of fencing it.
            self.stats["errors"] += 1
            return
        for (sid, h), (ok, version) in zip(batch, res):
            if self.held.get(sid) is not h:
                continue  # the attempt ended meanwhile
            if ok:
                h["version"] = version
                self.stats["renewed"] += 1
                continue
            self.stats["refused"] += 1
            h["refused"] = True
            self.held.pop(sid, None)
            if h["sb"] is not None:
                asyncio.create_task(self.host.backend.kill(h["sb"], 0.0, reason="fenced: lease renewal refused"))

    def hold(self, key: str, lease: Lease, ttl_s: float) -> dict:
        h = {"task_id": lease.task_id, "fence": lease.fence, "version": lease.version, "ttl": ttl_s,
             "holder": lease.holder, "sb": None, "refused": False}
        self.held[key] = h
        self.fresh[key] = time.monotonic()
        self.wake.set()
        if self.task is None:
            self.task = asyncio.create_task(self.run())
        return h
