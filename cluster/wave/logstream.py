"""A remote attempt's runner.log, pulled from its node while the attempt runs.

A sandbox on another machine writes its runner's output on that machine; its host used to send it back only in the
attempt's result, so a harness fault (a lost host, a wave stopped on a lost part) lost every running attempt's log.
Here the driver asks each node's host, once a second and in one Ray call per node, for what the logs of that node's
running attempts gained since the last pull, and appends it to the attempt's `runner.log` in the results. The
attempt's own result (the host's read at its end) still replaces the file when it comes, so the kept log is the
whole of it; without a result, at most the last pull's worth is lost. Bounded as the log is (16 MiB and a line).
A local attempt's log is written into the results by its host directly: it is never pulled.
"""
from __future__ import annotations

import asyncio

from fleet.host import LOG_CAP
from fleet.refs import awaitable
from fleet.sandbox import sandbox_key

PULL_EVERY_S = 1.0
PULL_TIMEOUT_S = 10.0  # a pull that takes longer is given up (the next one starts from the same offsets)


class LogStream:
    def __init__(self, wave_id: str, out, every_s: float = PULL_EVERY_S):
        self.wave_id, self.out, self.every_s = wave_id, out, every_s
        self.live: dict[str, tuple[str, object]] = {}  # sandbox id -> (its node, its host)
        self.have: dict[str, int] = {}  # sandbox id -> bytes of its log written to the results
        self.busy: set[str] = set()  # nodes whose pull is in flight (one at a time per node)
        self.pulls = 0
        self._task: asyncio.Task | None = None

    def watch(self, sandbox_id: str, node: str, host) -> None:
        """The attempt is sent to `host` on `node`: its log is pulled from now on (an empty file until it says
        something, so every attempt that started has its log)."""
        path = self.out.runner_log(sandbox_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        self.live[sandbox_id], self.have[sandbox_id] = (node, host), 0
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def finish(self, sandbox_id: str, log: bytes | None) -> None:
        """The attempt ended: no more pulls; its whole log, when its result carried one, replaces what was pulled."""
        self.live.pop(sandbox_id, None)
        self.have.pop(sandbox_id, None)
        if log is not None:
            path = self.out.runner_log(sandbox_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(log)

    async def last(self, sandbox_id: str, timeout_s: float = 3.0) -> None:
        """One more pull of this attempt's log (the wave stops under it: its host still has what came since)."""
        if sandbox_id in self.live:
            await self.pull([sandbox_id], timeout_s, wait_busy=False)
        self.live.pop(sandbox_id, None)
        self.have.pop(sandbox_id, None)

    async def _run(self) -> None:
        while self.live:
            await asyncio.sleep(self.every_s)
            await self.pull(list(self.live), PULL_TIMEOUT_S)

    async def pull(self, sandbox_ids: list[str], timeout_s: float, wait_busy: bool = True) -> None:
        by_node: dict[str, list[str]] = {}
        for sid in sandbox_ids:
            if sid in self.live and self.have.get(sid, LOG_CAP) < LOG_CAP:
                by_node.setdefault(self.live[sid][0], []).append(sid)
        if wait_busy:  # a node still answering the last pull is not asked again
            by_node = {n: s for n, s in by_node.items() if n not in self.busy}
        await asyncio.gather(*(self._pull_node(node, sids, timeout_s) for node, sids in by_node.items()))

    async def _pull_node(self, node: str, sids: list[str], timeout_s: float) -> None:
        host = self.live[sids[0]][1]
        sent = {sid: self.have[sid] for sid in sids}
        self.busy.add(node)
        try:
            got = await asyncio.wait_for(awaitable(getattr(host, "actor", host).logs_since.remote(
                {sandbox_key(self.wave_id, sid): n for sid, n in sent.items()})), timeout_s)
        except Exception:  # noqa: BLE001 - a lost or slow host: the attempt's own result says so
            return
        finally:
            self.busy.discard(node)
        self.pulls += 1
        for sid, n in sent.items():
            data = (got or {}).get(sandbox_key(self.wave_id, sid))
            # appended only onto what it was read after (a result or another pull may have written since)
            if data and sid in self.have and self.have[sid] == n:
                with open(self.out.runner_log(sid), "ab") as f:
                    f.write(data[: LOG_CAP - n])
                self.have[sid] = n + min(len(data), LOG_CAP - n)
