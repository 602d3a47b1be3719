"""A sandbox's network namespace, made by the host, with the harness's services inside it.

The host creates an empty network namespace (loopback up, nothing else: no
route to any address), opens listening sockets on 127.0.0.1 *inside* it, then
returns to its own namespace. The sandbox joins that namespace (`nsenter
--net`), so its runner finds the S3 proxy, the model endpoint and the effects
service on fixed loopback ports; the host accepts those connections in its own
event loop and relays them to the services on its own 127.0.0.1. Nothing runs
inside the sandbox for this, there is no start-up race (the sockets exist before
the runner starts), and no address but loopback is used on either side.
"""
from __future__ import annotations

import asyncio
import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
CHUNK = 256 * 1024
# connections one sandbox may hold open to one service at once: one more is closed at once, before anything is
# relayed, so a runner that opens thousands takes at most this many of the service's own (services.MAX_CONNECTIONS)
# from the tasks beside it. An agent holds one or two per service; an HTTP pool keeps at most 10 (boto3) or 20
MAX_CONNECTIONS_PER_SERVICE = 32
_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def make(ports: list[int], join_pid: int | None = None) -> tuple[int, list[socket.socket]]:
    """A new network namespace with loopback up and a listener on 127.0.0.1:port for each port; with
    `join_pid`, the (empty) namespace of that process instead (a docker container's, `network_mode="none"`).

    Runs in a thread of its own (namespaces are per thread); the thread returns to its namespace.
    Returns (an fd of the namespace, the listening sockets)."""
    orig = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    socks: list[socket.socket] = []
    try:
        if join_pid is None:
            _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        else:
            target = os.open(f"/proc/{join_pid}/ns/net", os.O_RDONLY)
            try:
                _check(_libc.setns(target, CLONE_NEWNET), f"setns into the network namespace of pid {join_pid}")
            finally:
                os.close(target)
        try:
            nsfd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                ifr = struct.pack("16sH14x", b"lo", 0)
                flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, ifr))[1]
                fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
            for port in ports:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                s.listen(128)
                s.setblocking(False)
                socks.append(s)
        finally:
            _check(_libc.setns(orig, CLONE_NEWNET), "setns back to the host namespace")
    except BaseException:
        for s in socks:
            s.close()
        raise
    finally:
        os.close(orig)
    return nsfd, socks


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


class SandboxNet:
    """The namespace of one sandbox and the host-side relays of its listeners."""

    def __init__(self, relays: dict[int, str], token: str | None = None):
        # port inside -> "host:port" of the service on the host, or "host:port/service" of the head's gate on
        # another node (fleet/gateway.py), opened with `token`
        self.relays = relays
        self.token = token
        self.nsfd: int | None = None
        self.servers: list[asyncio.AbstractServer] = []
        self.conns: set[asyncio.Task] = set()
        self.open_per_port: dict[int, int] = {}

    async def open(self, join_pid: int | None = None) -> "SandboxNet":
        ports = sorted(self.relays)
        self.nsfd, socks = await asyncio.to_thread(make, ports, join_pid)
        for port, sock in zip(ports, socks):
            addr, _, service = self.relays[port].partition("/")
            host, _, tport = addr.rpartition(":")
            self.servers.append(await asyncio.start_server(
                self._handler(host, int(tport), service or None, port), sock=sock))
        return self

    def _handler(self, host: str, port: int, service: str | None = None, inside: int = 0):
        async def handle(creader, cwriter):
            if self.open_per_port.get(inside, 0) >= MAX_CONNECTIONS_PER_SERVICE:
                cwriter.close()
                return
            self.open_per_port[inside] = self.open_per_port.get(inside, 0) + 1
            task = asyncio.current_task()
            self.conns.add(task)
            uwriter = None
            try:
                ureader, uwriter = await asyncio.open_connection(host, port)
                if service is not None:
                    from fleet.gateway import preface

                    uwriter.write(preface(self.token or "", service))
                for w in (uwriter, cwriter):
                    s = w.get_extra_info("socket")
                    if s is not None:
                        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await asyncio.gather(_pipe(creader, uwriter), _pipe(ureader, cwriter))
            except (OSError, asyncio.CancelledError):  # (cancelled: the sandbox's relays are closing)
                pass
            finally:
                for w in (uwriter, cwriter):
                    if w is not None:
                        w.close()
                self.conns.discard(task)
                self.open_per_port[inside] -= 1
        return handle

    @property
    def path(self) -> str:
        return f"/proc/{os.getpid()}/fd/{self.nsfd}"

    async def close(self) -> None:
        for srv in self.servers:
            srv.close()
        for t in list(self.conns):
            t.cancel()
        self.servers = []
        if self.nsfd is not None:
            os.close(self.nsfd)
            self.nsfd = None
