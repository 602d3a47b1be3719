"""The host's watches that kill a sandbox at a planned point: at the runner's Nth disk write, fsync or rename held
by the lazy file system (the disk-boundary arm), or right after its Nth named kill window (PK5)."""
from __future__ import annotations

import asyncio
import math
import os
import signal

from fleet import cgroups
from fleet.host.workspace_io import CheckpointReader


class Watches:
    """A host's watches; each ends with its sandbox and says what it saw."""

    def __init__(self, host):
        self.host = host

    async def disk(self, key: str, op: str, nth: int, reason: str) -> dict:
        """Kill the sandbox while its runner's `nth` disk `op` (write, fsync, rename; counted over the volume's life)
        is held by the lazy file system, then let the held call go: a kill in the middle of a journal append, on
        every run (DCP-2.0's SENTINEL_WRITE). {"fired": True, ...kill, "disk_path"}, or {"fired": False, "seen": 0}
        when the sandbox ended first (the count is the volume's: the next attempt goes on from it)."""
        from fleet.sandbox import lazy_of

        await self.host.started(key)
        sb = self.host.backend.sandboxes.get(key)
        lazy = lazy_of(sb.spec.workspace) if sb is not None else None
        if lazy is None:
            return {"fired": False, "seen": 0, "error": "no lazy volume to watch (not a crash-mode disk)"}
        while sb.exit_code is None and sb.state.value in ("starting", "running", "frozen", "created"):
            reached = await asyncio.to_thread(lazy.wait, op, nth, 0.25)
            if reached:
                # SIGKILL every process of the sandbox while the call is held, and only then let the call go: the
                # runner never gets past it (the backend's kill, which follows, may first try to freeze them)
                if sb.spec.backend == "process":
                    for pid in cgroups.SandboxCgroup(sb.spec.wave_id, sb.spec.sandbox_id).pids():
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                kill = asyncio.create_task(self.host.kill(key, 0.0, reason))
                await asyncio.sleep(0.02)
                await asyncio.to_thread(lazy.release, op, nth)
                out = await kill
                return {"fired": True, **out, "disk_path": str(reached.get("path"))[:300], "disk_op": op}
        return {"fired": False, "seen": 0}

    async def checkpoints(self, key: str, nth: int, window: str, reason: str,
                                poll_s: float = 0.002) -> dict:
        """Kill the sandbox right after its runner announced its `nth` named window (a JSON line in the file
        `$SANDFLEET_CHECKPOINT` whose `name` starts with `window`). Returns {"fired": True, ...kill} or, when
        the sandbox ended first, {"fired": False, "seen": how many matching windows it announced}."""
        await self.host.started(key)  # armed before the attempt reached this host: wait for it
        sb = self.host.backend.sandboxes.get(key)
        if sb is None:
            return {"fired": False, "seen": 0}
        reader = CheckpointReader(sb.spec.workspace)
        seen = 0
        while sb.exit_code is None and sb.state.value in ("starting", "running", "frozen", "created"):
            for rec in reader.new_lines():
                name = rec.get("name") if isinstance(rec, dict) else None
                if isinstance(name, str) and name.startswith(window):
                    seen += 1
                    if seen >= nth:
                        out = await self.host.kill(key, 0.0, reason)
                        t_ann = rec.get("t")
                        ok = isinstance(t_ann, (int, float)) and not isinstance(t_ann, bool) and math.isfinite(t_ann) \
                            and abs(out["at"] - t_ann) < 3600
                        lag = round((out["at"] - t_ann) * 1000, 1) if ok else None
                        return {"fired": True, **out, "window_name": name[:200], "lag_ms": lag}
            await asyncio.sleep(poll_s)
        # what it announced between the last read and its end counts for the next attempt's N
        seen += sum(1 for rec in reader.new_lines()
                    if isinstance(rec, dict) and isinstance(rec.get("name"), str) and rec["name"].startswith(window))
        return {"fired": False, "seen": seen}
