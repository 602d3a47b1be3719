"""The model endpoint and the effects service fuzzed on real sockets (hypothesis), as the proxy's parser is: any
request line, headers (lengths negative, doubled, huge, chunked), encodings and bodies a runner could send get an
answer that is a 2xx, a 4xx, the standard library's 501/505 (a method or version it does not speak), or a closed
connection (never a 500: an exception of the service), and the service
still answers an honest request right after. A body is never read past the service's cap, whatever it claims."""
from __future__ import annotations

import json
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.effects import EffectsService
from fleet.model_endpoint import ModelEndpoint
from fleet.services import TaskRegistry


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    reg = TaskRegistry()
    key = reg.register("t1", 1, 4, "patch-repo")
    reg.set_attempt("t1", 1)
    model = ModelEndpoint(reg, log_path=d / "calls.jsonl").start()
    fx = EffectsService(reg, log_path=d / "fx.jsonl").start()
    yield {"model": model, "effects": fx}, key
    model.stop()
    fx.stop()


def _exchange(port: int, raw: bytes) -> int:
    """Send raw bytes, half-close, and read the status of the answer (0: closed without one)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.settimeout(10)
        try:
            s.sendall(raw)
            s.shutdown(socket.SHUT_WR)
        except OSError:  # the service closed on us mid-send (it refused the request already)
            pass
        data = b""
        try:
            while True:
                while data.startswith(b"HTTP/1.1 100") and b"\r\n\r\n" in data:  # `Expect: 100-continue`
                    data = data.split(b"\r\n\r\n", 1)[1]
                if b"\r\n" in data and not data.startswith(b"HTTP/1.1 100"):
                    break
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (ConnectionResetError, socket.timeout):
            return 0
        if not data.startswith(b"HTTP/1."):
            return 0
        return int(data.split(b" ", 2)[1])
    finally:
        s.close()


def _honest(port: int, path: str, key: str, body: dict) -> int:
    raw = json.dumps(body).encode()
    return _exchange(port, (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
                            "Connection: close\r\n\r\n").encode() + raw)


_lengths = st.one_of(st.none(), st.sampled_from(["-1", "0", "5", "+5", " 7", "1_0", "99999999999999999999",
                                                 "2147483648", "0x10", "٣", "", "5, 6"]),
                     st.integers(min_value=0, max_value=10 ** 12).map(str))
_bodies = st.one_of(st.binary(max_size=300), st.text(max_size=200).map(lambda t: t.encode("utf-8", "replace")),
                    st.sampled_from([b'{"messages": []}', b'{"messages": "x"}', b'{"model": 1}', b"[]", b"null",
                                     b'{"effect_id": 5}', b'{"effect_id": "' + b"A" * 200 + b'"}',
                                     b'{"messages": [{"role": "user", "content": {"x": 1}}]}',
                                     b'{"tools": [{"type": "function"}], "messages": [{"role": "user"}]}',
                                     b"\xff\xfe{}"]))
_heads = st.lists(st.sampled_from(["Transfer-Encoding: chunked", "Content-Type: text/plain", "Expect: 100-continue",
                                   "Authorization: Bearer ", "Authorization: Basic eA==", "Connection: keep-alive",
                                   "Content-Encoding: gzip", "X: " + "y" * 5000, "Host:", ": empty"]), max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["model", "effects"]),
       method=st.sampled_from(["POST", "GET", "PUT", "HEAD", "DELETE", "OPTIONS", "BREW", "post", ""]),
       path=st.sampled_from(["/v1/chat/completions", "/v1/effects", "/", "/v1/models", "//v1/effects", "/%00",
                             "/v1/chat/completions?x=" + "a" * 3000, "*"]),
       version=st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9", ""]),
       auth=st.booleans(), length=_lengths, heads=_heads, body=_bodies)
def test_any_request_gets_a_4xx_or_2xx_or_a_close_and_the_service_lives_on(services, which, method, path, version,
                                                                            auth, length, heads, body):
    svcs, key = services
    svc = svcs[which]
    port = svc.server.server_address[1]
    lines = [f"{method} {path} {version}".strip(), "Host: x"]
    if auth:
        lines.append(f"Authorization: Bearer {key}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines += heads
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "replace") + body
    status = _exchange(port, raw)
    # 501/505: the standard library's answer to a method or HTTP version it does not speak; a 500 would be an
    # exception of the service
    assert status == 0 or 200 <= status < 500 or status in (501, 505), (status, raw[:300])
    if which == "model":
        ok = _honest(port, "/v1/chat/completions", key, {"model": "m", "messages": [{"role": "user", "content": "go"}]})
    else:
        ok = _honest(port, "/v1/effects", key, {"effect_id": "fuzz-probe"})
    assert 0 < ok < 500, ok  # an honest request right after is answered (served, or refused politely: 4xx)


def test_after_the_fuzz_an_honest_call_is_served_in_full(services):
    """(Runs after the fuzz, on the same services.) The key's rate budget refills; then an honest call is a 200."""
    import time

    svcs, key = services
    port = svcs["model"].server.server_address[1]
    for _ in range(20):  # bounded: the per-key bucket refills within a few seconds
        status = _honest(port, "/v1/chat/completions", key, {"model": "m",
                                                             "messages": [{"role": "user", "content": "go"}]})
        if status != 429:
            break
        time.sleep(0.5)
    assert status == 200, status
