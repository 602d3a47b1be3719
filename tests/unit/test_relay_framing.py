"""The compiled relay (relay/src/main.rs) never relays a head another HTTP/1.1 reader may frame otherwise: it hands
the connection to the proxy (which refuses it, 400, logged). The real `sandfleet-relay` binary on 127.0.0.1, this
test as its proxy (the control socket) and as its store (a socket that records every byte it gets)."""
from __future__ import annotations

import select
import socket
import subprocess
import threading

import pytest

from storage import relay

pytestmark = pytest.mark.skipif(relay.binary() is None, reason="sandfleet-relay is not installed")

HIDDEN = b"PUT /b/hidden HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx"
N = len(HIDDEN)
BAD = {
    "obs_fold": b"GET /b/k HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n Content-Length: %d\r\n\r\n" % N,
    "obs_fold_tab": b"GET /b/k HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\tContent-Length: %d\r\n\r\n" % N,
    "name_space": b"GET /b/k HTTP/1.1\r\nHost: x\r\nContent-Length : %d\r\n\r\n" % N,
    "name_not_token": b"GET /b/k HTTP/1.1\r\nHost: x\r\nContent(Length): %d\r\n\r\n" % N,
    "no_colon": b"GET /b/k HTTP/1.1\r\nHost x\r\nContent-Length: %d\r\n\r\n" % N,
    "two_lengths": b"GET /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: %d\r\n\r\n" % N,
    "same_length_twice": b"GET /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
    "copy_source_twice": b"PUT /b/k HTTP/1.1\r\nHost: x\r\nX-Amz-Copy-Source: b/s\r\nX-Amz-Copy-Source: b/t\r\n\r\n",
    "length_empty": b"GET /b/k HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n",
    "te_not_chunked": b"GET /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n",
    "te_and_length": b"GET /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\nContent-Length: %d\r\n\r\n" % N,
    "bare_lf": b"GET /b/k HTTP/1.1\r\nHost: x\r\n\n",
    "version": b"GET /b/k HTTP/1.1 x\r\nHost: x\r\n\r\n",
    "two_spaces": b"GET  /b/k HTTP/1.1\r\nHost: x\r\n\r\n",
}


class Store:
    """A store that records every byte it gets and answers each read with an empty 200."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.got: list[bytes] = []
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn):
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            self.got.append(data)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        except OSError:
            pass
        self.sock.close()
        for c in self.conns:
            c.close()
        self.thread.join(5)


@pytest.fixture
def front():
    store = Store()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([relay.binary(), "--upstream", f"127.0.0.1:{store.port}", "--control-fd",
                             str(theirs.fileno()), "--port", "0"], pass_fds=[theirs.fileno()],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    theirs.close()
    try:
        assert select.select([ours], [], [], 10)[0], "the relay did not start"
        first = ours.recv(64)
        assert first.startswith(b"R"), first
        yield int(first[1:]), ours, store
    finally:
        ours.close()  # the relay exits when the proxy's end closes
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        store.close()


def test_a_well_formed_read_is_relayed(front):
    port, ctl, store = front
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(b"GET /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nX-A: 1\r\nX-A: 2\r\n\r\n")
        assert c.recv(4096).startswith(b"HTTP/1.1 200 OK")  # (a field the proxy never reads may repeat)
    assert store.got and store.got[0].startswith(b"GET /b/k HTTP/1.1\r\n")
    assert not select.select([ctl], [], [], 0)[0]  # nothing handed over


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_head_framed_otherwise_is_handed_to_the_proxy_never_relayed(front, kind):
    port, ctl, store = front
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(BAD[kind] + HIDDEN)
        assert select.select([ctl], [], [], 10)[0], f"{kind}: not handed over"
        data, fds, _, _ = socket.recv_fds(ctl, 1 << 18, 1)
        for fd in fds:
            socket.socket(fileno=fd).close()
    assert data.startswith(b"C" + BAD[kind]) and len(fds) == 1, (kind, data[:200])
    assert store.got == [], (kind, store.got)


def _padded(total: int, target: bytes = b"/b/k", pad: bytes = b"a") -> bytes:
    start, end = b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nX-Pad: ", b"\r\n\r\n"
    return start + pad * (total - len(start) - len(end)) + end


def test_a_head_of_64_kib_is_relayed_and_a_longer_one_handed_to_the_proxy(front):
    """MAX_HEAD is the proxy's limit: a head past it is the proxy's to answer (431, logged: tests/integration/
    test_relay.py), never sent on to the store."""
    port, ctl, store = front
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(_padded(65536))
        assert c.recv(4096).startswith(b"HTTP/1.1 200 OK")
    assert store.got and store.got[0].startswith(b"GET /b/k HTTP/1.1\r\n") and not select.select([ctl], [], [], 0)[0]
    big = _padded(70_000, b"/b/big", b"z") + HIDDEN
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(big)
        assert select.select([ctl], [], [], 10)[0], "not handed over"
        data, fds, _, _ = socket.recv_fds(ctl, 1 << 18, 1)
        for fd in fds:
            socket.socket(fileno=fd).close()
    assert data[:1] == b"C" and len(data) > 65536 and big.startswith(data[1:]) and len(fds) == 1, data[:200]
    assert not [g for g in store.got if b"/b/big" in g or b"zz" in g or b"hidden" in g], "relayed to the store"
