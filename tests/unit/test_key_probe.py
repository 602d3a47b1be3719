"""The per-attempt key's probe (storage/keys.py `_Probe`) against a stand-in HTTP server: what each answer of the
store means, the signature it sends, a kept-alive connection closed by the store, and a store that is gone. The
real store's answers are proven by tests/integration/test_storage.py (a revoked key is InvalidAccessKeyId)."""
from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from storage.credentials import Credentials
from storage.errors import StoreError
from storage.keys import _Probe

CREDS = Credentials("SFAPROBEKEY0001", "secret-of-the-probe")


class _Store(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept alive, as weed does
    answers: list = []
    seen: list = []

    def do_GET(self):  # noqa: N802 - http.server's spelling
        self.seen.append({"path": self.path, "auth": self.headers.get("Authorization", ""),
                          "sha": self.headers.get("x-amz-content-sha256", "")})
        status, code = self.answers.pop(0) if self.answers else (404, "NoSuchKey")
        body = f"<?xml version='1.0'?><Error><Code>{code}</Code></Error>".encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def store():
    _Store.answers, _Store.seen = [], []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Store)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(5)


def _probe(srv, key="w/t1/.sandfleet-key-probe"):
    return _Probe(f"http://127.0.0.1:{srv.server_address[1]}", "us-east-1", CREDS, "bucket-a", key)


@pytest.mark.parametrize("status,code,want", [
    (404, "NoSuchKey", "ok"),
    (200, "", "ok"),
    (403, "InvalidAccessKeyId", "denied"),
    (403, "SignatureDoesNotMatch", "denied"),
    (403, "AccessDenied", "denied"),
    (500, "InternalError", "unsure"),
    (503, "SlowDown", "unsure"),
])
def test_each_answer_of_the_store_says_whether_it_took_the_key(store, status, code, want):
    _Store.answers = [(status, code)]
    p = _probe(store)
    try:
        assert p() == want
    finally:
        p.close()


def test_the_probe_is_signed_with_the_key_it_probes_and_sent_on_one_connection(store):
    p = _probe(store, key="w/t 1/.probe")
    try:
        assert [p(), p(), p()] == ["ok"] * 3
    finally:
        p.close()
    assert [s["path"] for s in _Store.seen] == ["/bucket-a/w/t%201/.probe"] * 3
    for s in _Store.seen:
        assert s["auth"].startswith(f"AWS4-HMAC-SHA256 Credential={CREDS.access_key}/")
        assert "/us-east-1/s3/aws4_request" in s["auth"] and s["sha"]
        assert CREDS.secret_key not in s["auth"]


def test_a_connection_the_store_closed_is_retried_once_on_a_fresh_one(store):
    p = _probe(store)
    try:
        assert p() == "ok"
        p.conn.sock.shutdown(socket.SHUT_RDWR)  # as a store that dropped an idle kept-alive connection
        _Store.answers = [(403, "InvalidAccessKeyId")]
        assert p() == "denied"
    finally:
        p.close()


def test_a_store_that_is_gone_is_a_store_error_not_an_answer():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    p = _Probe(f"http://127.0.0.1:{port}", "us-east-1", CREDS, "bucket-a", "k")
    with pytest.raises(StoreError, match="did not answer a key probe"):
        p()
    p.close()
