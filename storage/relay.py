"""The fault proxy's compiled front (`relay/`, the `sandfleet-relay` binary from the wheel built there).

The relay owns the proxy's port. While no rule is open it relays every plain request to the store itself and
logs it as the proxy would (the same JSON line, appended to the same log). Anything else, and every request
whose head it reads while a rule is open, it hands over: the client's socket (SCM_RIGHTS) and every byte read
from it, over a SOCK_SEQPACKET pair; the proxy then serves that connection for the rest of its life, as if it
had accepted it. Before a rule opens the proxy tells the relay to hand over every request and waits for its
answer, so no request whose head is read after `POST /rules` returns escapes the rule; once the rule is in, it
narrows that to the slots (bucket and a task's prefix) its open rules are pinned to (RuleSet.route), so the
tasks with no fault open stay on the relay.

Without the binary (`SANDFLEET_PROXY_RELAY=off`, or a machine with no cargo when the project was set up) the
proxy listens itself and serves everything: the same behaviour, its own cost.
"""
from __future__ import annotations

import asyncio
import os
import select
import socket
import subprocess
import sys

from storage.process import installed_binary, stop_process

BINARY = "sandfleet-relay"
PACKET_MAX = 256 * 1024  # a handed-over head (at most 64 KiB) and what was read after it (at most 64 KiB)


def binary() -> str | None:
    """The relay to start, or None: the proxy serves alone (`SANDFLEET_PROXY_RELAY=off` asks for that)."""
    if os.environ.get("SANDFLEET_PROXY_RELAY", "").lower() in ("off", "0", "no"):
        return None
    return installed_binary(BINARY)


class Relay:
    """The relay process, started by the proxy and ended with it (its control socket closing ends it too)."""

    def __init__(self, path: str, upstream: tuple[str, int], log_path: str | None):
        self.path, self.upstream, self.log_path = path, upstream, log_path
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.route = b"0"  # what the relay was last told to hand over (RuleSet.route)
        self.relayed = 0  # requests the relay relayed itself, as of its last answer
        self._answer: asyncio.Future | None = None
        self._lock: asyncio.Lock | None = None
        self.lost = asyncio.Event()

    def start(self, port: int = 0, timeout_s: float = 10.0) -> int:
        """Start the relay listening on 127.0.0.1:`port`; its port."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [self.path, "--upstream", "%s:%d" % self.upstream, "--control-fd", str(theirs.fileno()),
                "--port", str(port)]
        if self.log_path:
            argv += ["--log", self.log_path]
        try:
            self.proc = subprocess.Popen(argv, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.sock = ours
        ready, _, _ = select.select([ours], [], [], timeout_s)
        first = ours.recv(64) if ready else b""
        if not first.startswith(b"R") or not first[1:].isdigit():
            self.stop()
            raise RuntimeError(f"{self.path} did not start (said {first!r} in {timeout_s}s)")
        ours.setblocking(False)
        return int(first[1:])

    def attach(self, adopt) -> None:
        """Read the relay's packets on the running loop: `adopt(fd, data)` for each handed-over connection."""
        loop = asyncio.get_running_loop()
        self._lock = asyncio.Lock()
        self._adopt = adopt
        loop.add_reader(self.sock.fileno(), self._readable)

    def _readable(self) -> None:
        while True:
            try:
                msg, fds, flags, _ = socket.recv_fds(self.sock, PACKET_MAX, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                msg, fds, flags = b"", [], 0
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):  # never (the relay sends at most 64 KiB + 1):
                # a connection whose bytes did not all arrive is not served as if they had
                print(f"the relay's packet was truncated ({len(msg)} bytes); its connection is closed",
                      file=sys.stderr, flush=True)
                for fd in fds:
                    os.close(fd)
                continue
            if not msg:
                asyncio.get_running_loop().remove_reader(self.sock.fileno())
                self.lost.set()
                if self._answer is not None and not self._answer.done():
                    self._answer.set_exception(ConnectionError("the relay exited"))
                return
            kind = msg[:1]
            if kind == b"C" and fds:
                self._adopt(fds[0], msg[1:])
                fds = fds[1:]
            elif kind == b"A" and self._answer is not None and not self._answer.done():
                self._answer.set_result(int(msg[1:] or b"0"))
            for fd in fds:  # nothing else carries a socket
                os.close(fd)

    async def sync(self, route) -> int:
        """Tell the relay which requests to hand over and have it write its log; the requests it has relayed so
        far. `route()` (RuleSet.route) is read once this sync has the socket, never before: a control call that
        waited behind a rule's opening must not send the route from before it."""
        async with self._lock:
            route = route()
            self._answer = asyncio.get_running_loop().create_future()
            try:
                self.sock.send(b"M" + route)
            except OSError:  # a packet too large for the socket: everything, the safe side
                route = b"1"
                self.sock.send(b"M1")
            self.relayed = await asyncio.wait_for(self._answer, 10)
            self.route = route
            return self.relayed

    def stop(self, grace_s: float = 5.0) -> None:
        """Close its control socket (it writes its log and exits), then end it by PID if it has not."""
        if self.sock is not None:
            try:
                asyncio.get_running_loop().remove_reader(self.sock.fileno())
            except (RuntimeError, ValueError, OSError):
                pass
            self.sock.close()
            self.sock = None
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                stop_process(proc, 0)


async def adopt_socket(fd: int, data: bytes, limit: int):
    """Streams on a socket accepted elsewhere, with `data` (already read from it) first in the reader."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(fileno=fd)
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    if data:
        reader.feed_data(data)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)
