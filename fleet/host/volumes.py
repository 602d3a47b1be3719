"""A task's kept volume on a node (`sandbox.disk`: keep, move, the crash modes): where it is mounted, its drop
when the task ends, its read-back for `move`, and what the lazy layer counted on it."""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from fleet import cgroups
from fleet.sandbox import sandbox_key


class VolumeKeeper:
    """The volumes of a host's node, under its own dir (`<home>/<wave>/vol/<task>`)."""

    def __init__(self, host):
        self.host = host

    def dir(self, wave_id: str, task_id: str) -> Path:
        """Where a task's kept volume is mounted on this node (made with its parents, root's only)."""
        if "/" in task_id or task_id in ("", ".", "..") or "/" in wave_id:
            raise ValueError(f"not a task id: {task_id!r}")
        d = self.host.home(wave_id) / "vol"
        for x in (self.host.home(), self.host.home(wave_id), d):
            x.mkdir(mode=0o711, exist_ok=True)
        return d / task_id

    def drop(self, wave_id: str | None = None, task_id: str | None = None) -> list[str]:
        """Unmount and remove kept volumes (one task's, a wave's, or every one on this node); returns their tasks."""
        from fleet.sandbox import release_volume

        dropped = []
        waves = [self.host.home(wave_id)] if wave_id else [d for d in self.host.home().glob("*") if d.is_dir()]
        for w in waves:
            vol = w / "vol"
            for d in sorted(vol.glob(task_id or "*")) if vol.is_dir() else []:
                if d.name.endswith(".disk"):  # a lazy volume's tmpfs: released with its mount point
                    continue
                release_volume(str(d))
                dropped.append(d.name)
        return dropped

    def drop_but(self, wave_id: str, keep: set[str]) -> list[str]:
        vol = self.host.home(wave_id) / "vol"
        return [t for d in sorted(vol.glob("*")) if vol.is_dir() and d.name not in keep
                and not d.name.endswith(".disk") for t in self.drop(wave_id, d.name)]

    async def detach(self, wave_id: str, sandbox_id: str, task_id: str) -> dict:
        """`move` (PK3): this node is about to be lost, and the task's volume is a network disk that outlives it. The
        sandbox is frozen (its runner writes nothing more; the node's loss then ends it), and the volume is read
        back as a tar that crosses to the driver through Ray, for the task's next attempt on another node:
        {"image", "files", "bytes", "stopped"}. SIGSTOP, not the cgroup freezer: the node's loss SIGKILLs them next,
        and a SIGKILL ends a stopped process where a frozen one would linger until thawed."""
        from fleet.sandbox import pack_volume

        sb = self.host.backend.sandboxes.get(sandbox_key(wave_id, sandbox_id))
        stopped: set[int] = set()
        if sb is not None and sb.spec.backend == "process":
            cg = cgroups.SandboxCgroup(wave_id, sandbox_id)
            for _ in range(3):  # (a child forked meanwhile is stopped on the next round)
                for pid in set(cg.pids()) - stopped:
                    try:
                        os.kill(pid, signal.SIGSTOP)
                        stopped.add(pid)
                    except ProcessLookupError:
                        pass
        path = self.dir(wave_id, task_id)
        if not os.path.ismount(path):
            return {"image": None, "why": f"no volume of task {task_id} is mounted on {self.host.node_id}",
                    "stopped": len(stopped)}
        image, got = await asyncio.to_thread(pack_volume, str(path))
        return {"image": image, **got, "stopped": len(stopped), "node": self.host.node_id}

    @staticmethod
    def disk_ops(workspace: str) -> dict | None:
        from fleet.sandbox import lazy_of

        lazy = lazy_of(workspace)
        try:
            return dict(lazy.stats()["boundaries"]) if lazy is not None else None
        except Exception:  # noqa: BLE001 - a lost layer is found by its own check (alive); no count then
            return None
