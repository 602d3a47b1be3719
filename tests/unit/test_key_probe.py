"""The per-attempt key's probe (storage/keys.py `_Probe`) against a stand-in HTTP server: what each answer of the
store means, the signature it sends, a kept-alive connection closed by the store, and a store that is gone. The
real store's answers are proven by tests/integration/test_storage.py (a revoked key is InvalidAccessKeyId)."""
from __future__ import annotations

import hashlib
import hmac
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
                          "sha": self.headers.get("x-amz-content-sha256", ""), "peer": self.client_address,
                          "headers": {k.lower(): v for k, v in self.headers.items()}})
        status, code = self.answers.pop(0) if self.answers else (404, "NoSuchKey")
        body = code if isinstance(code, bytes) else (
            f"<?xml version='1.0'?><Error><Code>{code}</Code></Error>".encode() if code else b"")
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
    (200, "<Error><Code>InvalidAccessKeyId</Code></Error>", "ok"),  # the runner's own object at the probe's key
    (403, "InvalidAccessKeyId", "unknown"),  # the one answer a revoked key must get
    (403, "SignatureDoesNotMatch", "denied"),
    (403, "AccessDenied", "denied"),
    # neither taken nor gone: an issue or a revoke taken on any of these would be a lie
    (404, "NoSuchBucket", "unsure"),
    (403, "RequestTimeTooSkewed", "unsure"),
    (403, "", "unsure"),
    (400, "InvalidAccessKeyId", "unsure"),
    (301, "PermanentRedirect", "unsure"),
    (429, "SlowDown", "unsure"),
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


def _sigv4_ok(seen: dict, secret: str) -> bool:
    """Recompute the request's SigV4 signature from what the server received (the spec's steps, not botocore)."""
    auth = seen["auth"][len("AWS4-HMAC-SHA256 "):]
    fields = dict(x.strip().split("=", 1) for x in auth.split(","))
    akid, date, region, service, term = fields["Credential"].split("/")
    signed = fields["SignedHeaders"].split(";")
    h = seen["headers"]
    canonical = "\n".join(["GET", seen["path"], "", *(f"{n}:{h[n].strip()}" for n in signed), "",
                           fields["SignedHeaders"], h["x-amz-content-sha256"]])
    to_sign = "\n".join(["AWS4-HMAC-SHA256", h["x-amz-date"], f"{date}/{region}/{service}/{term}",
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, term):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.compare_digest(hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest(), fields["Signature"])


def test_the_probe_is_signed_with_the_key_it_probes_and_sent_on_one_connection(store):
    p = _probe(store, key="w/t 1/ü.probe")
    try:
        assert [p(), p(), p()] == ["ok"] * 3
    finally:
        p.close()
    assert [s["path"] for s in _Store.seen] == ["/bucket-a/w/t%201/%C3%BC.probe"] * 3
    assert len({s["peer"] for s in _Store.seen}) == 1  # one connection, kept alive
    for s in _Store.seen:
        assert s["auth"].startswith(f"AWS4-HMAC-SHA256 Credential={CREDS.access_key}/")
        assert "/us-east-1/s3/aws4_request" in s["auth"] and "host" in s["auth"]
        assert s["sha"] == hashlib.sha256(b"").hexdigest()
        assert CREDS.secret_key not in s["auth"]
        assert _sigv4_ok(s, CREDS.secret_key)
        assert not _sigv4_ok(s, CREDS.secret_key + "x")  # the check itself can fail


def test_an_answer_longer_than_the_probe_reads_is_never_taken_for_the_next_one(store):
    """A runner can write the probe's key (it is under its own prefix): a long body ending in a fake refusal must
    not be read as the store's next answer."""
    fake = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 46\r\n\r\n<Error><Code>InvalidAccessKeyId</Code></Error>"
    _Store.answers = [(200, b"x" * (_Probe.BODY_MAX + 10) + fake), (404, "NoSuchKey")]
    p = _probe(store)
    try:
        assert [p(), p()] == ["ok", "ok"]
    finally:
        p.close()
    assert len(_Store.seen) == 2


def test_a_connection_the_store_closed_is_retried_once_on_a_fresh_one(store):
    p = _probe(store)
    try:
        assert p() == "ok"
        p.conn.sock.shutdown(socket.SHUT_RDWR)  # as a store that dropped an idle kept-alive connection
        _Store.answers = [(403, "InvalidAccessKeyId")]
        assert p() == "unknown"
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
