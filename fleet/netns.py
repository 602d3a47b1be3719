"""A sandbox's network namespace, made by the host, with the harness's services inside it.

The host creates an empty network namespace (loopback up, nothing else: no
route to any address), opens listening sockets on 127.0.0.1 *inside* it, then
returns to its own namespace. The sandbox joins that namespace (`nsenter
--net`), so its runner finds the S3 proxy, the model endpoint and the effects
service on fixed loopback ports; the host accepts those connections in its own
event loop and relays them to the services on its own 127.0.0.1. Nothing runs
inside the sandbox for this, there is no start-up race (the sockets exist before
the runner starts), and no address but loopback is used on either side.

The relaying itself is compiled where it can be: one `sandfleet-relay forward`
per host process (relay/src/forward.rs) is handed each sandbox's listeners and
relays their connections the same way, with the same per-service cap; the
host's event loop relays them itself when that binary is not installed, when
SANDFLEET_NETNS_RELAY=python, or when the forwarder is gone.
"""
from __future__ import annotations

import asyncio
import ctypes
import fcntl
import itertools
import os
import resource
import select
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

from fleet.wire import pipe, preface
from storage.process import installed_binary, stop_process

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
# connections one sandbox may hold open to one service at once: one more is closed at once, before anything is
# relayed, so a runner that opens thousands takes at most this many of the service's own (services.MAX_CONNECTIONS)
# from the tasks beside it. An agent holds one or two per service; an HTTP pool keeps at most 10 (boto3) or 20
MAX_CONNECTIONS_PER_SERVICE = 32
LINGER_S = 10.0  # once the service's end of a connection closed, how long the sandbox's end may keep it open
# what one forwarder holds at once over all its sandboxes; past half of it, only a sandbox under its fair share
# (half / the sandboxes it relays) gets a new connection (relay/src/forward.rs)
FORWARDER_MAX_CONNECTIONS = 2048
# the descriptors a forwarder needs: each relayed connection holds 5 (its two sockets and the three copies its
# pumps and its linger watch use: forward.rs `serve`), and each listener one (LISTENER_FDS: the listeners of about
# 1,300 sandboxes of 3 services each). It gets them as its own NOFILE limit, whatever the host's is (1,024 on many
# machines: 200 connections, which one runner opening its allowed 96 per service nearly took alone)
FDS_PER_CONNECTION = 5
LISTENER_FDS = 4096
# each relayed socket's kernel send and receive buffers (SO_SNDBUF / SO_RCVBUF; the kernel doubles it), both modes:
# autotuned, a runner that never reads what it asked for pinned about 5 MiB of TCP memory per connection in the
# relay, charged to no sandbox; with 256 KiB one stream still moves 1.2 GB/s, more than the store serves
CONN_BUF = 256 * 1024
READY_S = 10.0  # the forwarder's `R` within this, or the event loop relays
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


async def _both_ways(up: asyncio.Task, down: asyncio.Task) -> bool:
    """Wait for a connection's two directions (`up`: sandbox -> service, `down`: service -> sandbox); True when
    both ended on EOF. An error in either ends both (False, and the caller aborts both ends); once the service's
    side has ended, the sandbox's side gets LINGER_S to end too (a runner that never closes keeps no slot)."""
    pending: set = {up, down}
    try:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if not all(t.result() for t in done):
            return False
        if pending:
            more, pending = await asyncio.wait(pending, timeout=LINGER_S if down in done else None)
            return not pending and all(t.result() for t in more)
        return True
    finally:
        for t in pending:
            t.cancel()


class Forwarder:
    """This process's `sandfleet-relay forward`: it relays the listeners it is given until they are closed, and
    exits when this process's end of its control socket closes (this process ended, however it died)."""

    def __init__(self, binary: str):
        self.nofile = _fd_limit(FORWARDER_MAX_CONNECTIONS)
        # as many connections as its descriptors hold, listeners kept room for: a forwarder out of descriptors
        # would lose a new sandbox's listener unseen (the fd of an `L` message is dropped) and accept nothing
        room = (self.nofile[0] - LISTENER_FDS - 64) // FDS_PER_CONNECTION
        if room < 2 * MAX_CONNECTIONS_PER_SERVICE:  # (a limit this low cannot hold one sandbox's share: the event
            raise OSError(f"{binary} forward: a descriptor limit of {self.nofile[0]} leaves room for {room} "
                          "connections")  # loop relays instead)
        self.max_conns = min(FORWARDER_MAX_CONNECTIONS, room)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([binary, "forward", "--control-fd", str(theirs.fileno()), "--max-conns",
                                          str(self.max_conns), "--linger-ms", str(int(LINGER_S * 1000)),
                                          "--conn-buf", str(CONN_BUF)],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            resource.prlimit(self.proc.pid, resource.RLIMIT_NOFILE, self.nofile)  # (before its first listener)
        except (OSError, ValueError) as exc:
            ours.close()
            stop_process(self.proc, grace_s=0)
            raise OSError(f"{binary} forward: its descriptor limit could not be set to {self.nofile}: {exc}") from exc
        self.ctl = ours
        self._names = itertools.count(1)
        self._pings = itertools.count(1)
        ours.settimeout(READY_S)
        try:
            ready = ours.recv(16) == b"R"  # (a binary with no forward mode exits, and this reads its EOF)
        except OSError:
            ready = False
        ours.settimeout(None)
        if not ready:
            self.ctl.close()
            stop_process(self.proc, grace_s=0)
            raise OSError(f"{binary} forward did not start")

    def name(self) -> str:
        return f"s{next(self._names)}"

    def listen(self, group: str, sock: socket.socket, target: str, preface: bytes = b"") -> None:
        msg = b"L%s\t%d\t%s\t%s" % (group.encode(), MAX_CONNECTIONS_PER_SERVICE, target.encode(), preface)
        socket.send_fds(self.ctl, [msg], [sock.fileno()])

    def close(self, group: str) -> None:
        self.ctl.send(b"X" + group.encode())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ping(self, timeout_s: float) -> bool:
        """Whether it answers a ping within `timeout_s` (a stopped or hung relay is alive and never answers)."""
        nonce = b"P%d" % next(self._pings)
        deadline = time.monotonic() + timeout_s
        try:
            self.ctl.send(nonce)
            while (left := deadline - time.monotonic()) > 0:
                if not select.select([self.ctl], [], [], left)[0]:
                    return False
                got = self.ctl.recv(64)
                if got == nonce:
                    return True
                if not got:
                    return False  # (its end closed: it exited)
        except OSError:
            return False
        return False

    def stop(self, timeout_s: float = 2.0) -> None:
        """Close the control socket (the relay exits on its EOF) and reap it; killed if it has not gone."""
        self.ctl.close()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            stop_process(self.proc, grace_s=0)


def _fd_limit(max_conns: int) -> tuple[int, int]:
    """(soft, hard) NOFILE for a forwarder of `max_conns` connections: what it needs, raised past this process's
    hard limit when it may (root, up to the kernel's fs.nr_open), else as much of it as the hard limit allows."""
    need = max_conns * FDS_PER_CONNECTION + LISTENER_FDS + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard >= need:
        return max(soft, need), hard
    if os.geteuid() == 0:
        try:
            ceiling = int(Path("/proc/sys/fs/nr_open").read_text())
        except (OSError, ValueError):
            ceiling = hard
        top = max(hard, min(need, ceiling))
        return top, top
    return hard, hard


_forwarder: Forwarder | None = None
_forwarder_lock = threading.Lock()
_stopped = False  # stop_forwarder(final=True) was called: this process starts no forwarder again


def forwarder() -> Forwarder | None:
    """This process's forwarder, started on first use; None when the relaying stays in the event loop."""
    global _forwarder
    if os.environ.get("SANDFLEET_NETNS_RELAY") == "python":
        return None
    with _forwarder_lock:
        if _stopped:
            return None  # (the host is leaving: a sandbox still starting is relayed in its event loop)
        if _forwarder is None or not _forwarder.alive():
            binary = installed_binary("sandfleet-relay")
            try:
                _forwarder = Forwarder(binary) if binary else None
            except OSError:
                _forwarder = None
        return _forwarder


def forwarder_lost(answer_s: float) -> tuple[Forwarder, str] | None:
    """(the forwarder, why) when this process's forwarder has exited or did not answer a ping within `answer_s`;
    a hung one is killed. Either way it is forgotten: the next sandbox gets a new one. None while it serves."""
    global _forwarder
    fwd = _forwarder
    if fwd is None:
        return None
    if not fwd.alive():
        why = f"sandfleet-relay forward (pid {fwd.proc.pid}) exited with {fwd.proc.returncode}"
    elif not fwd.ping(answer_s):
        why = f"sandfleet-relay forward (pid {fwd.proc.pid}) did not answer within {answer_s:g} s (hung)"
        fwd.stop(timeout_s=0.0)
    else:
        return None
    with _forwarder_lock:
        if _forwarder is fwd:
            _forwarder = None
    try:
        fwd.ctl.close()
    except OSError:
        pass
    return fwd, why


def stop_forwarder(final: bool = False) -> None:
    """End this process's forwarder, if it started one: a host that leaves its harness cgroup while its relay
    child stays there cannot remove the cgroup (a host outlives its GCS: ray.kill cannot reach it). `final`: none
    is started again in this process (a sandbox start still in flight past the host's shutdown would start one)."""
    global _forwarder, _stopped
    with _forwarder_lock:
        fwd, _forwarder = _forwarder, None
        _stopped = _stopped or final
    if fwd is not None:
        fwd.stop()


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
        self.forwarded: tuple[Forwarder, str] | None = None  # (the forwarder, this sandbox's name there)

    async def open(self, join_pid: int | None = None) -> "SandboxNet":
        ports = sorted(self.relays)
        self.nsfd, socks = await asyncio.to_thread(make, ports, join_pid)
        fwd = None
        if os.environ.get("SANDFLEET_NETNS_RELAY") != "python":
            fwd = _forwarder if _forwarder is not None and _forwarder.alive() else await asyncio.to_thread(forwarder)
        if fwd is not None:
            name = fwd.name()
            try:
                for port, sock in zip(ports, socks):
                    addr, _, service = self.relays[port].partition("/")
                    fwd.listen(name, sock, addr, preface(self.token or "", service) if service else b"")
                self.forwarded = (fwd, name)
            except OSError:  # the forwarder is gone: this sandbox is relayed here (what it was given is closed)
                try:
                    fwd.close(name)
                except OSError:
                    pass
        for port, sock in zip(ports, socks):
            if self.forwarded is not None:
                sock.close()  # the forwarder holds its own copy
                continue
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
            uwriter, clean = None, False
            try:
                ureader, uwriter = await asyncio.open_connection(host, port)
                if service is not None:
                    uwriter.write(preface(self.token or "", service))
                for w in (uwriter, cwriter):
                    s = w.get_extra_info("socket")
                    if s is not None:
                        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF) if CONN_BUF > 0 else ():
                            s.setsockopt(socket.SOL_SOCKET, opt, CONN_BUF)
                clean = await _both_ways(asyncio.ensure_future(pipe(creader, uwriter)),
                                         asyncio.ensure_future(pipe(ureader, cwriter)))
            except (OSError, asyncio.CancelledError):  # (cancelled: the sandbox's relays are closing)
                pass
            finally:
                for w in (uwriter, cwriter):  # an unclean end is aborted: a close would wait on a peer that never reads
                    if w is not None:
                        w.close() if clean else w.transport.abort()
                self.conns.discard(task)
                self.open_per_port[inside] -= 1
        return handle

    @property
    def path(self) -> str:
        return f"/proc/{os.getpid()}/fd/{self.nsfd}"

    async def close(self) -> None:
        if self.forwarded is not None:
            fwd, name = self.forwarded
            self.forwarded = None
            try:
                fwd.close(name)
            except OSError:  # the forwarder is gone, and its relays with it
                pass
        for srv in self.servers:
            srv.close()
        for t in list(self.conns):
            t.cancel()
        self.servers = []
        if self.nsfd is not None:
            os.close(self.nsfd)
            self.nsfd = None
