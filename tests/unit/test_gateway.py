"""The head's gate (fleet/gateway.py): a connection that opens with the wave's token and a known service is relayed
to it byte for byte; a wrong token, an unknown service, a line that never comes or a bare HTTP request gets nothing
and is closed; and the host-side relay (fleet/netns.py) opens its upstream connections with that line."""
from __future__ import annotations

import socket
import socketserver
import threading

import pytest

from fleet.gateway import LINE_TIMEOUT_S, Gateway
from fleet.wire import preface


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):  # all of it, then one answer
        data = b""
        while True:
            chunk = self.request.recv(65536)
            if not chunk:
                break
            data += chunk
        self.request.sendall(b"echo:" + data)


@pytest.fixture
def gate():
    echo = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    gw = Gateway("127.0.0.1", "t0ken", {"echo": ("127.0.0.1", echo.server_address[1])}).start()
    yield gw
    gw.stop()
    echo.shutdown()
    echo.server_close()


def _talk(gw: Gateway, first: bytes, then: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", gw.port), timeout=LINE_TIMEOUT_S + 5) as s:
        s.sendall(first + then)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


def test_the_token_and_a_known_service_get_the_service_byte_for_byte(gate):
    body = bytes(range(256)) * 64
    assert _talk(gate, preface("t0ken", "echo"), body) == b"echo:" + body
    assert gate.stats["relayed"] >= 1 and gate.stats["refused"] == 0


@pytest.mark.parametrize("first", [preface("wrong", "echo"), preface("t0ken", "store"), b"GET / HTTP/1.1\r\n\r\n",
                                   b"SFGW1 t0ken\n", b"x" * 300 + b"\n"])
def test_anything_else_gets_nothing_and_is_closed(gate, first):
    assert _talk(gate, first, b"payload") == b""
    assert gate.stats["refused"] == 1 and gate.stats["relayed"] == 0


def test_the_host_relay_opens_its_upstream_with_the_token_line():
    """SandboxNet's handler for a `host:port/service` target writes the line before the sandbox's bytes."""
    import asyncio

    from fleet.netns import SandboxNet

    got = []

    async def main():
        async def upstream(reader, writer):
            got.append(await reader.read(100))
            writer.close()
        srv = await asyncio.start_server(upstream, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        net = SandboxNet({1: f"127.0.0.1:{port}/model"}, token="abc")
        relay = await asyncio.start_server(net._handler("127.0.0.1", port, "model"), "127.0.0.1", 0)
        r, w = await asyncio.open_connection("127.0.0.1", relay.sockets[0].getsockname()[1])
        w.write(b"hello")
        await w.drain()
        await asyncio.sleep(0.2)
        w.close()
        relay.close()
        srv.close()
    asyncio.run(main())
    assert got and got[0].startswith(b"SFGW1 abc model\n")


def test_a_nodes_probe_of_the_head_goes_through_the_gate_end_to_end():
    """`SandboxHost.probe_head` (the per-node health probe): answered through the gate with the token; a wrong
    token is closed unanswered and named; a gate that is not there is named."""
    import asyncio
    import http.server

    from fleet.host import SandboxHost

    class _Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    gw = Gateway("127.0.0.1", "t0ken", {"model": ("127.0.0.1", web.server_address[1])}).start()
    try:
        host = SandboxHost.__new__(SandboxHost)
        targets = {"model": gw.target("model")}
        assert asyncio.run(host.probe_head(targets, "t0ken", 5.0)) == {"model": None}
        bad = asyncio.run(host.probe_head(targets, "wrong", 5.0))["model"]
        assert "closed the model connection without an answer" in bad, bad
        port = gw.port
    finally:
        gw.stop()
        web.shutdown()
        web.server_close()
    gone = asyncio.run(SandboxHost.probe_head(host, {"model": f"127.0.0.1:{port}/model"}, "t0ken", 2.0))["model"]
    assert "no connection to the gate" in gone, gone
