"""A fake sandbox backend (no processes) and a local ledger adapter, for harness tests of
the real host and ledger code."""
from __future__ import annotations

import asyncio
import time

from fleet.sandbox import Sandbox, SandboxBackend


class FakeBackend(SandboxBackend):
    name = "fake"

    def __init__(self):
        super().__init__()
        self.exits: dict[str, asyncio.Future] = {}  # by sandbox key
        self._fail_next = 0

    def fail_next(self, n: int = 1) -> None:
        self._fail_next += n

    def preempt(self, key: str) -> None:
        """The machine went away: the sandbox (by its key, `<wave>/<sandbox>`) dies with SIGKILL's exit code."""
        fut = self.exits.get(key)
        if fut and not fut.done():
            self.sandboxes[key].killed_by = "preempt"
            fut.set_result(-9)

    def finish(self, key: str, code: int = 0) -> None:
        fut = self.exits.get(key)
        if fut and not fut.done():
            fut.set_result(code)

    async def _start(self, sb: Sandbox) -> None:
        if self._fail_next:
            self._fail_next -= 1
            raise RuntimeError("fake start failure")
        self.exits[sb.spec.key] = asyncio.get_running_loop().create_future()
        sb.pid = 4242

    async def _wait(self, sb: Sandbox) -> int:
        return await self.exits[sb.spec.key]

    async def _kill(self, sb: Sandbox, grace_s: float) -> None:
        self.finish(sb.spec.key, -15 if grace_s else -9)

    async def _freeze(self, sb):
        pass

    async def _thaw(self, sb):
        pass

    async def _cleanup(self, sb):
        pass


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *a):
        async def call():
            return self.fn(*a)
        return call()


class LocalLedger:
    """Gives a plain LeaseLedger the `.method.remote()` shape the host uses."""

    def __init__(self, ledger):
        self.inner = ledger
        for name in ("acquire", "renew", "renew_many", "release", "revoke", "active", "dump", "ping"):
            setattr(self, name, _Method(getattr(ledger, name)))


async def wait_for(pred, description: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for: {description}")
        await asyncio.sleep(0.01)
