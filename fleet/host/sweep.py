"""A host's part of the sweep: its node's sandboxes of a wave that no active lease covers are reaped (with a
handle when it has one, by their markers when not), and the sweep actor's scan and reap of this node."""
from __future__ import annotations

import asyncio
import time

from fleet import cgroups
from fleet.backends import reap_leftover
from fleet.sandbox import sandbox_key


class NodeSweep:
    """The sweep on a host's node (hollow backends answer from their own table)."""

    def __init__(self, host):
        self.host = host

    async def sweep(self, wave_id: str, live_sandbox_ids: list[str]) -> dict:
        """Kill and remove every sandbox of `wave_id` on this node that no active lease covers."""
        live = set(live_sandbox_ids)
        hollow = getattr(self.host.backend, "hollow", False)  # (the scale bench's: fleet/hollow.py)
        backend = self.host.backend
        found = [(wave_id, s) for s in backend.listing(wave_id)] if hollow else cgroups.list_sandboxes(wave_id)
        reaped = []
        for wid, sid in found:
            if sid in live:
                continue
            key = sandbox_key(wid, sid)
            sb = self.host.backend.sandboxes.get(key)
            if sb is not None:
                await self.host.backend.kill(sb, 0.0, reason="sweep: no active lease")
                deadline = time.monotonic() + 10  # the attempt's own run waits for it and removes it
                while key in self.host.backend.sandboxes and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                if key in self.host.backend.sandboxes and sb.exit_code is not None:
                    await self.host.backend.remove(sb)
                reaped.append({"wave_id": wid, "sandbox_id": sid, "pids": [sb.pid], "emptied": True,
                               "removed": True, "had_handle": True})
            elif hollow:
                reaped.append({"wave_id": wid, "sandbox_id": sid, "pids": [], "emptied": True, "removed": True,
                               "had_handle": False})
            else:
                rep = await asyncio.to_thread(reap_leftover, wid, sid)
                rep["had_handle"] = False
                reaped.append(rep)
        # (a fleet's host outlives waves)
        self.host.ended = {k for k in self.host.ended if not k.startswith(wave_id + "/")}
        live_tasks = {sid.rpartition("-a")[0] for sid in live}  # (a sandbox id is <task>-a<attempt>)
        volumes = await asyncio.to_thread(self.host.volumes.drop_but, wave_id, live_tasks)
        return {"node": self.host.node_id, "found": [s for _, s in found], "live": sorted(live & {s for _, s in found}),
                "reaped": reaped, "volumes_dropped": volumes}

    async def scan_markers(self, wave_ids: list[str], engine_lost: str | None = None) -> dict:
        """The sweep actor's look at this node (its own /proc, mounts and cgroups): what carries the waves'
        markers here (fleet/sweeper.py `scan_here`)."""
        from fleet.sweeper import scan_here

        if getattr(self.host.backend, "hollow", False):  # the scale bench's hollow sandboxes answer from their table
            return dict(self.host.backend.scan(wave_ids), node=self.host.node_id)
        return dict(await asyncio.to_thread(scan_here, wave_ids, engine_lost), node=self.host.node_id)

    async def reap_marked(self, wave_id: str, sandbox_id: str) -> dict:
        """The sweep actor found this node's sandbox leaked: reap it here, by its markers (pids are this node's)."""
        from fleet.sweeper import reap_here

        if getattr(self.host.backend, "hollow", False):
            sb = self.host.backend.sandboxes.get(sandbox_key(wave_id, sandbox_id))
            killed = sb is not None and await self.host.backend.kill(sb, 0.0, reason="sweep: leaked")
            return {"wave_id": wave_id, "sandbox_id": sandbox_id, "pids": [], "emptied": True, "removed": True,
                    "killed": bool(killed)}
        return await asyncio.to_thread(reap_here, wave_id, sandbox_id)
