"""Request smuggling through the S3 endpoint a runner sees (the compiled relay, then the proxy, then SeaweedFS):
a head the fronts read one way and the store another (an obs-fold line, a bare LF, a name with a space, two
lengths, a transfer coding other than `chunked`) is refused by both fronts with a logged 400 and a closed
connection, and the write hidden behind it never reaches the store.

SeaweedFS (Go's net/http) folds a continuation line into the previous header and ends a head at a bare LF line,
so before this fix a presigned PUT hidden in the "body" of a GET reached the store while the log said GET."""
from __future__ import annotations

import socket
import urllib.parse

import botocore.exceptions
import orjson
import pytest

from storage import relay
from storage.store import s3_client
from tests.storefront import bucket_store, fault_proxy

pytestmark = pytest.mark.integration
B = "sf-smuggle"
FRONTS = [pytest.param("relay", marks=pytest.mark.skipif(relay.binary() is None,
                                                         reason="sandfleet-relay not installed")), "alone"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    yield from bucket_store(tmp_path_factory, "smuggle", B)


def _target(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return parts.path + "?" + parts.query


def _exchange(port: int, data: bytes) -> bytes:
    """Send `data` on one connection, half-close, read until the other side closes (bounded)."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        for _ in range(1000):
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            got += chunk
    return got


def _hostile(kind: str, host: str, get: str, put: str) -> bytes:
    """A GET whose head the store reads differently, followed by a presigned PUT the store would apply."""
    hidden = f"PUT {put} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 6\r\n\r\nhidden".encode()
    n = len(hidden)
    heads = {
        # obs-fold: the fronts read `Content-Length: n` (the hidden PUT as the GET's body), Go folds it into X-A
        "obs_fold": f"GET {get} HTTP/1.1\r\nHost: {host}\r\nX-A: 1\r\n Content-Length: {n}\r\n\r\n",
        # a bare LF ends the head for Go: the fronts read one head, Go reads two requests
        "bare_lf": f"GET {get} HTTP/1.1\r\nHost: {host}\r\n\n",
        "name_space": f"GET {get} HTTP/1.1\r\nHost: {host}\r\nContent-Length : {n}\r\n\r\n",
        "two_lengths": f"GET {get} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nContent-Length: {n}\r\n\r\n",
        "te_not_chunked": f"GET {get} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: xchunked\r\n\r\n",
        "length_and_te": f"GET {get} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {n}\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n",
    }
    return heads[kind].encode() + hidden  # bare_lf: the hidden PUT's own blank line ends the fronts' one head


KINDS = ["obs_fold", "bare_lf", "name_space", "two_lengths", "te_not_chunked", "length_and_te"]


@pytest.mark.parametrize("quota", [None, (100, 1 << 20)], ids=["no_quota", "quota"])
@pytest.mark.parametrize("front", FRONTS)
def test_a_write_hidden_behind_a_head_the_store_reads_otherwise_never_reaches_it(store, front, quota):
    ep, d = store
    tag = f"{front}-{'q' if quota else 'n'}"
    log = d / f"proxy-{tag}.jsonl"
    with fault_proxy(ep, log, relay=front == "relay", quota=quota) as proxy:
        c = s3_client(proxy.url, ep.creds, max_attempts=1)
        c.put_object(Bucket=B, Key=f"w/{tag}/seen", Body=b"v")
        host = f"127.0.0.1:{proxy.port}"
        get = _target(c.generate_presigned_url("get_object", Params={"Bucket": B, "Key": f"w/{tag}/seen"}))
        direct = s3_client(ep.url, ep.creds)
        for kind in KINDS:
            key = f"w/{tag}/{kind}"
            put = _target(c.generate_presigned_url("put_object", Params={"Bucket": B, "Key": key}))
            got = _exchange(proxy.port, _hostile(kind, host, get, put))
            assert got.startswith(b"HTTP/1.1 400 "), (kind, got[:300])
            assert b"<Code>BadRequest</Code>" in got and got.count(b"HTTP/1.1 ") == 1, (kind, got[:600])
            with pytest.raises(botocore.exceptions.ClientError) as e:  # the hidden PUT never reached the store
                direct.head_object(Bucket=B, Key=key)
            assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404, kind
        assert c.get_object(Bucket=B, Key=f"w/{tag}/seen")["Body"].read() == b"v"  # still serving
        proxy.control().flush()
        lines = [orjson.loads(x) for x in log.read_bytes().splitlines()]
        bad = [r for r in lines if r.get("bad_request")]
        assert len(bad) == len(KINDS), [r.get("bad_request") for r in bad]
        assert all(r["status"] == 400 and r["key"] is None for r in bad)
        assert not [r for r in lines if r.get("method") == "PUT" and r.get("key", "").endswith(tuple(KINDS))]
