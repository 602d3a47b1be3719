"""The head's gate for sandboxes on other nodes: one TCP listener on the head's cluster address that relays a
connection to one of the harness's services (the fault proxy, the model endpoint, the effects service) only when
it opens with the wave's relay token.

A sandbox host relays its sandboxes' loopback connections (fleet/netns.py) here, each prefixed with one line,
`SFGW1 <token> <service>\\n`; the gate checks the token (constant time), connects to the service on the head's
loopback and then passes bytes both ways, untouched (the services see what a local relay would give them).
Anything else (no line within 5 s, a wrong token, an unknown service) is closed without a byte of answer. The
store itself and the proxy's control API are never behind it. The token travels only in Ray calls to the hosts;
a runner never sees it.
"""
from __future__ import annotations

import asyncio
import hmac
import socket
import threading

from fleet.wire import MAGIC, pipe

MAX_LINE = 256
LINE_TIMEOUT_S = 5.0


class Gateway:
    def __init__(self, host: str, token: str, targets: dict[str, tuple[str, int]], port: int = 0):
        self.host, self.port = host, port
        self.token = token.encode()
        self.targets = dict(targets)  # service name -> (host, port) on the head's loopback
        self.stats = {"relayed": 0, "refused": 0}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[asyncio.Task] = set()

    def start(self) -> "Gateway":
        ready = threading.Event()
        failed: list[BaseException] = []

        def run():
            self._loop = asyncio.new_event_loop()
            try:
                self._server = self._loop.run_until_complete(
                    asyncio.start_server(self._handle, self.host, self.port, reuse_address=True))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # noqa: BLE001 - reported to start()
                failed.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True, name="sf-gateway")
        self._thread.start()
        ready.wait(10)
        if failed:
            raise failed[0]
        return self

    def target(self, service: str) -> str:
        """What a host relays a sandbox's port to: `host:port/service`."""
        return f"{self.host}:{self.port}/{service}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._conns.add(task)
        upstream = None
        try:
            try:
                line = await asyncio.wait_for(reader.readuntil(b"\n"), LINE_TIMEOUT_S)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
                self.stats["refused"] += 1
                return
            parts = line[:MAX_LINE].strip().split(b" ")
            ok = len(parts) == 3 and parts[0] == MAGIC and hmac.compare_digest(parts[1], self.token)
            target = self.targets.get(parts[2].decode(errors="replace")) if ok else None
            if target is None:
                self.stats["refused"] += 1
                return
            try:
                ureader, upstream = await asyncio.open_connection(*target)
            except OSError:
                return
            self.stats["relayed"] += 1
            for w in (upstream, writer):
                s = w.get_extra_info("socket")
                if s is not None:
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.gather(pipe(reader, upstream), pipe(ureader, writer))
        except asyncio.CancelledError:  # the gate is stopping: this connection ends here (asyncio's stream
            return  # callback would print a cancelled handler's traceback to stderr)
        finally:
            for w in (upstream, writer):
                if w is not None:
                    w.close()
            self._conns.discard(task)

    def stop(self) -> None:
        if self._loop is None:
            return

        async def close():
            if self._server is not None:
                self._server.close()
            for t in list(self._conns):
                t.cancel()

        try:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        except Exception:  # noqa: BLE001
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._loop = None
