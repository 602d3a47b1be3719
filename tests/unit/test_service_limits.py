"""The harness services against a hostile client on real sockets: a body length that is not a plain number is
refused without reading the body (a negative Content-Length made the old reader read to EOF, so a runner could
stream gigabytes into the driver's heap), idle connections are closed, and the number of open connections is
capped (each one is a thread in the driver), and so is the rate of requests per key."""
from __future__ import annotations

import socket
import time

import pytest

from fleet.services import base as services
from fleet.effects import EffectsService
from fleet.services import TaskRegistry, body_length


@pytest.fixture
def effects(tmp_path):
    reg = TaskRegistry()
    key = reg.register("t1", 1, 4, "patch-repo")
    reg.set_attempt("t1", 1)
    fx = EffectsService(reg, log_path=tmp_path / "fx.jsonl").start()
    yield fx, key
    fx.stop()


def _connect(svc) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", svc.server.server_address[1]), timeout=10)
    s.settimeout(10)
    return s


def _status_and_rest(s: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return (int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0), data


@pytest.mark.parametrize("length", ["-1", "+5", " -3", "1_000", "0x10", "٣"])
def test_a_length_that_is_not_a_plain_number_is_refused_before_any_body_is_read(effects, length):
    fx, key = effects
    s = _connect(fx)
    try:
        # the headers and no end of the stream: the old reader (rfile.read(-1)) waited for EOF here, so no answer
        # came until the client hung up (the recv below then times out after 10 s and the test fails). No body
        # byte is sent: one left unread would make the service's close a reset that can drop its answer.
        s.sendall(f"POST /v1/effects HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode("utf-8"))
        status, head = _status_and_rest(s)
    finally:
        s.close()
    assert status == 400, head[:300]


def test_two_different_lengths_are_refused(effects):
    fx, key = effects
    s = _connect(fx)
    try:
        s.sendall(f"POST /v1/effects HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                  "Content-Length: 2\r\nContent-Length: 900000000\r\n\r\n{}".encode())
        status, head = _status_and_rest(s)
    finally:
        s.close()
    assert status == 400, head[:300]


def test_body_length_reads_only_plain_decimal_numbers():
    from email.message import Message

    def h(*values):
        m = Message()
        for v in values:
            m["Content-Length"] = v
        return m

    assert body_length(h()) == 0
    assert body_length(h("12")) == 12 and body_length(h(" 12 ")) == 12 and body_length(h("7", "7")) == 7
    for bad in ("-1", "+1", "1_0", "1e3", "", "12a", "9" * 19):
        assert body_length(h(bad)) is None, bad
    assert body_length(h("1", "2")) is None


def test_an_idle_connection_is_closed(effects, monkeypatch):
    fx, key = effects
    handler = fx.server.RequestHandlerClass
    assert handler.timeout == services.IDLE_TIMEOUT_S  # every service's connections have one (None: wait forever)
    monkeypatch.setattr(handler, "timeout", 0.5)
    s = _connect(fx)
    try:
        t0 = time.monotonic()
        got = s.recv(1)  # nothing sent: the service hangs up once the idle timeout passes (recv waits up to 10 s)
        assert got == b"", got
        assert time.monotonic() - t0 < 9  # closed by the service, not by this socket's own 10 s timeout
    finally:
        s.close()


def test_connections_past_the_cap_are_closed_and_the_others_still_served(effects, monkeypatch):
    fx, key = effects
    monkeypatch.setattr(fx.server, "max_connections", 4)
    held = [_connect(fx) for _ in range(4)]
    try:
        deadline = time.monotonic() + 10  # the accept loop counts them as it takes them
        while fx.server._open < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fx.server._open == 4
        extra = _connect(fx)
        assert extra.recv(1) == b""  # closed at once
        extra.close()
        assert fx.server.refused == 1
        # a held connection still gets answered: an honest runner beside the flood is served
        held[0].sendall(f"GET /v1/effects HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode())
        status, _ = _status_and_rest(held[0])
        assert status in (200, 404, 405), status
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 10
    while fx.server._open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fx.server._open == 0
    assert services.MAX_CONNECTIONS >= 256  # the default leaves room for every attempt of a large wave


def test_a_connection_per_call_reuses_the_threads_and_stop_ends_them(tmp_path):
    """A runner that opens a connection per call (urllib) gets a thread that served an earlier connection, not a
    new one per call; and stop() ends every one of them."""
    import threading
    import urllib.request

    reg = TaskRegistry()
    key = reg.register("t1", 1, 4, "patch-repo")
    reg.set_attempt("t1", 1)
    before = set(threading.enumerate())
    fx = EffectsService(reg, log_path=tmp_path / "fx.jsonl").start()
    try:
        deadline = time.monotonic() + 30
        for _ in range(40):  # one after another, each once the last one's thread is idle: one thread serves them all
            while fx.server._idle != fx.server._workers and time.monotonic() < deadline:
                time.sleep(0.005)
            req = urllib.request.Request(fx.url + "/v1/effects", headers={"Authorization": f"Bearer {key}"})
            try:
                urllib.request.urlopen(req, timeout=10).read()
            except urllib.error.HTTPError as exc:
                assert exc.code in (404, 405), exc.code
        while fx.server._open and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fx.server._open == 0
        assert fx.server._workers == 1, fx.server._workers
        held = [_connect(fx) for _ in range(3)]  # three open at once: each has its own thread
        try:
            while fx.server._open < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert fx.server._workers == 3, fx.server._workers
        finally:
            for s in held:
                s.close()
    finally:
        fx.stop()
    deadline = time.monotonic() + 10
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not set(threading.enumerate()) - before, set(threading.enumerate()) - before


def test_a_key_that_floods_is_rate_limited_and_another_key_is_not(tmp_path, monkeypatch):
    """A runner looping on a service gets 429 past its key's burst, a second later it has RATE_PER_KEY more, and
    another task's key beside it is served. The service's clock is held still, so no refill depends on how fast
    this machine answers."""
    import urllib.error
    import urllib.request

    clock = [1000.0]
    monkeypatch.setattr(services.time, "monotonic", lambda: clock[0])
    reg = TaskRegistry()
    flood, honest = reg.register("t1", 1, 4, "patch-repo"), reg.register("t2", 2, 4, "patch-repo")
    fx = EffectsService(reg, log_path=tmp_path / "fx.jsonl").start()
    url = f"{fx.url}/v1/effects/none"

    def get(key: str) -> int:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    try:
        burst, rate = int(services.BURST_PER_KEY), int(services.RATE_PER_KEY)
        codes = [get(flood) for _ in range(burst + 5)]
        assert codes[:burst] == [404] * burst and codes[burst:] == [429] * 5, codes  # (404: no such route)
        assert get(honest) == 404
        clock[0] += 1.0
        codes = [get(flood) for _ in range(rate + 3)]
        assert codes[:rate] == [404] * rate and codes[rate:] == [429] * 3, codes
    finally:
        fx.stop()


def _post_effect(svc, key: str, body: bytes) -> int:
    s = _connect(svc)
    try:
        s.sendall(f"POST /v1/effects HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        return _status_and_rest(s)[0]
    finally:
        s.close()


def test_large_bodies_share_a_bounded_budget_and_small_ones_never_wait_for_it(tmp_path, monkeypatch):
    """Bodies over LARGE_BODY are read only while the service's pool has room: with the pool held by bodies a
    flooding key is still sending, another large body is 429 without being read (so the heap the flood takes is
    bounded by the pool, whatever the number of keys), a small one from another key is answered, and once the flood's
    bodies are gone the pool is whole again."""
    monkeypatch.setattr(services, "LARGE_BODY", 1024)
    monkeypatch.setattr(services, "LARGE_BODY_POOL", 3 * 4096)
    reg = TaskRegistry()
    flood, honest = reg.register("t1", 1, 4, "patch-repo"), reg.register("t2", 2, 4, "patch-repo")
    reg.set_attempt("t1", 1)
    reg.set_attempt("t2", 1)
    fx = EffectsService(reg, log_path=tmp_path / "fx.jsonl").start()
    held = []
    try:
        for _ in range(3):  # three 4 KiB bodies, headers sent, body not: each holds its share while it is read
            s = _connect(fx)
            s.sendall(f"POST /v1/effects HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {flood}\r\n"
                      "Content-Length: 4096\r\n\r\n".encode())
            held.append(s)
        deadline = time.monotonic() + 10
        while fx._pool_used < 3 * 4096 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fx._pool_used == 3 * 4096
        big = b'{"effect_id": "e1", "pad": "' + b"x" * 2048 + b'"}'
        assert _post_effect(fx, honest, big) == 429 and fx.pool_refused == 1
        assert _post_effect(fx, honest, b'{"effect_id": "e1"}') == 200
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 10
    while fx._pool_used and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert fx._pool_used == 0
        assert _post_effect(fx, honest, big) == 200
    finally:
        fx.stop()
