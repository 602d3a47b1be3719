"""The leases a host holds, renewed together: every tick one batched `renew_many` for all of them (so renewals do
not wait for a sandbox to start nor grow with load); a refused renewal means the attempt was fenced, and its sandbox
is killed."""
from __future__ import annotations

import asyncio
import time

from fleet.refs import awaitable
from fleet.records import Lease


class LeaseRenewer:
    """A host's held leases (sandbox key -> the lease it runs under) and the task that renews them. It reads the
    host's ledger and backend when it renews (a test may give the host another ledger)."""

    def __init__(self, host):
        self.host = host
        self.held: dict[str, dict] = {}
        self.task: asyncio.Task | None = None
        self.stats = {"ticks": 0, "renewed": 0, "refused": 0, "errors": 0, "late_max_s": 0.0}

    async def run(self) -> None:
        """Every tick (a quarter of the shortest TTL held), renew all held leases in one ledger call."""
        while self.held:
            tick = min(h["ttl"] for h in self.held.values()) / 4
            due = time.monotonic() + tick
            await asyncio.sleep(tick)
            self.stats["late_max_s"] = max(self.stats["late_max_s"], round(time.monotonic() - due, 3))
            batch = list(self.held.items())
            if not batch:
                continue
            self.stats["ticks"] += 1
            try:
                res = await asyncio.wait_for(awaitable(self.host.ledger.renew_many.remote(
                    [(h["task_id"], h["fence"], h["version"], h["ttl"], h["holder"]) for _, h in batch])),
                    max(1.0, tick * 2))
            except Exception:  # noqa: BLE001 - slow or lost ledger: leases run on until expiry; retry next tick.
                # The ledger may still apply this batch after we stopped waiting: the next one names the holder,
                # so the ledger renews a lease whose version moved on by our own renewal instead of fencing it.
                self.stats["errors"] += 1
                continue
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
        self.task = None

    def hold(self, key: str, lease: Lease, ttl_s: float) -> dict:
        h = {"task_id": lease.task_id, "fence": lease.fence, "version": lease.version, "ttl": ttl_s,
             "holder": lease.holder, "sb": None, "refused": False}
        self.held[key] = h
        if self.task is None:
            self.task = asyncio.create_task(self.run())
        return h
