"""Host side of the sandbox network: unix sockets relayed to the harness's loopback services.

A sandbox has its own, empty network namespace. Inside it, socat listens on
127.0.0.1 and connects to a unix socket bound in from the host; here, one
listener per service accepts on that socket and relays the bytes both ways to
the service's TCP port on 127.0.0.1. No address but loopback is ever used, and
a sandbox can reach exactly the services that have a relay.
"""
from __future__ import annotations

import asyncio
import os
import socket
import threading
from pathlib import Path

CHUNK = 256 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            pass


class Relays:
    """Unix-socket listeners relaying to 127.0.0.1 ports, served by one thread with its own loop."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sandbox-relays", daemon=True)
        self.servers: dict[str, asyncio.AbstractServer] = {}
        self.paths: dict[str, str] = {}
        self.conns: set[asyncio.Task] = set()
        self.thread.start()

    def add(self, name: str, port: int) -> str:
        """Relay `<dir>/<name>.sock` to 127.0.0.1:port; returns the socket path."""
        path = str(self.dir / f"{name}.sock")

        async def handle(creader, cwriter):
            task = asyncio.current_task()
            self.conns.add(task)
            try:
                ureader, uwriter = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                cwriter.close()
                self.conns.discard(task)
                return
            sock = uwriter.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                await asyncio.gather(_pipe(creader, uwriter), _pipe(ureader, cwriter))
            finally:
                for w in (uwriter, cwriter):
                    w.close()
                self.conns.discard(task)

        async def start():
            return await asyncio.start_unix_server(handle, path=path)

        self.servers[name] = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        os.chmod(path, 0o666)  # the sandbox user connects through a read-only bind of this file
        self.paths[name] = path
        return path

    def close(self) -> None:
        async def stop():
            for srv in self.servers.values():
                srv.close()
            for t in list(self.conns):
                t.cancel()
            await asyncio.sleep(0)

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
        for p in self.paths.values():
            try:
                os.unlink(p)
            except OSError:
                pass
