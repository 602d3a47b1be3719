"""The backend template: public `start/kill/terminate/freeze/thaw/wait/remove` keep a sandbox's lifecycle and timing,
and each backend does the work in its private `_start/_kill/...` (process, docker, hollow)."""
from __future__ import annotations

import asyncio
import os
import time

from fleet.lifecycle import SANDBOX_TRANSITIONS, Lifecycle, SandboxState
from fleet.sandbox.artifacts import read_tree
from fleet.sandbox.spec import Sandbox, SandboxSpec


class SandboxBackend:
    """Template: public methods keep the lifecycle and timing; `_x` methods do the work."""

    name = "base"

    def __init__(self):
        self.sandboxes: dict[str, Sandbox] = {}  # by SandboxSpec.key

    async def start(self, spec: SandboxSpec) -> Sandbox:
        sb = Sandbox(spec=spec, life=Lifecycle(SANDBOX_TRANSITIONS, SandboxState.CREATED))
        self.sandboxes[spec.key] = sb
        t0 = time.perf_counter()
        try:
            await self._start(sb)
        except Exception as exc:
            sb.life.to(SandboxState.FAILED, f"start failed: {exc}")
            try:
                await self.remove(sb)
            finally:
                self.sandboxes.pop(spec.key, None)
            raise
        sb.start_ms = (time.perf_counter() - t0) * 1000
        sb.started_at = time.time()
        sb.life.to(SandboxState.RUNNING, "started")
        return sb

    async def wait(self, sb: Sandbox) -> int:
        code = await self._wait(sb)
        sb.exit_code = code
        sb.ended_at = sb.ended_at or time.time()
        if sb.state == SandboxState.STOPPING:
            sb.life.to(SandboxState.KILLED, f"exit {code} ({sb.killed_by})")
        elif sb.state in (SandboxState.RUNNING, SandboxState.FROZEN):
            if sb.state == SandboxState.FROZEN:
                sb.life.to(SandboxState.STOPPING, "died while frozen")
                sb.life.to(SandboxState.KILLED, f"exit {code}")
            else:
                sb.life.to(SandboxState.EXITED, f"exit {code}")
        return code

    def relayed_by(self, key: str):
        """The compiled relay (netns.Forwarder) the sandbox's loopback listeners were handed to, if any."""
        net = getattr(self, "_nets", {}).get(key)
        return net.forwarded[0] if net is not None and net.forwarded else None

    async def kill(self, sb: Sandbox, grace_s: float = 0.0, reason: str = "kill") -> bool:
        """SIGTERM, `grace_s`, then SIGKILL of everything; True when it was alive."""
        if sb.state not in (SandboxState.RUNNING, SandboxState.FROZEN):
            return False
        sb.killed_by = reason
        sb.life.to(SandboxState.STOPPING, reason)
        # what the stop was: {"sigterm_at": when SIGTERM reached a live init (None: none sent), "sigkill": whether
        # anything was left to SIGKILL after the grace}
        sb.extra["stop"] = await self._kill(sb, grace_s) or {}
        return True

    async def terminate(self, sb: Sandbox) -> bool:
        """SIGTERM the sandbox's init, as a preemption notice does; True if it was sent."""
        return await self._terminate(sb) if sb.exit_code is None else False

    async def freeze(self, sb: Sandbox) -> bool:
        if sb.state != SandboxState.RUNNING:
            return False
        await self._freeze(sb)
        sb.life.to(SandboxState.FROZEN, "freeze")
        return True

    async def thaw(self, sb: Sandbox) -> bool:
        if sb.state != SandboxState.FROZEN:
            return False
        await self._thaw(sb)
        sb.life.to(SandboxState.RUNNING, "thaw")
        return True

    async def remove(self, sb: Sandbox) -> None:
        await self._cleanup(sb)
        if sb.state != SandboxState.REMOVED:
            sb.life.to(SandboxState.REMOVED, "removed")
        self.sandboxes.pop(sb.spec.key, None)

    def command_problem(self, spec: SandboxSpec) -> str | None:
        """Why the runner command cannot start in this backend, or None (checked before a sandbox is made)."""
        return None

    async def collect(self, sb: Sandbox, subdir: str) -> dict:
        """Read `subdir` of the workspace back after the runner ended: {"files": {path: bytes}, "skipped": [...]}."""
        return await asyncio.to_thread(read_tree, os.path.join(sb.spec.workspace, subdir))

    async def start_many(self, specs: list[SandboxSpec]) -> list[Sandbox]:
        return [await self.start(s) for s in specs]

    # -- per backend ------------------------------------------------------
    async def _start(self, sb: Sandbox) -> None:
        raise NotImplementedError

    async def _wait(self, sb: Sandbox) -> int:
        raise NotImplementedError

    async def _kill(self, sb: Sandbox, grace_s: float) -> None:
        raise NotImplementedError

    async def _terminate(self, sb: Sandbox) -> bool:
        raise NotImplementedError

    async def _freeze(self, sb: Sandbox) -> None:
        raise NotImplementedError

    async def _thaw(self, sb: Sandbox) -> None:
        raise NotImplementedError

    async def _cleanup(self, sb: Sandbox) -> None:
        raise NotImplementedError


async def pidfd_ended(fd: int) -> None:
    """Until the process behind pidfd `fd` has ended (the fd turns readable); the caller owns and closes `fd`."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(fd)
