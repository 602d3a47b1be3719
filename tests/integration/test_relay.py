"""The proxy's compiled front (relay/, storage/relay.py) on real SeaweedFS: it logs exactly what the proxy alone
logs for the same requests, a rule opened through the control API catches the very next request, and the proxy
does not outlive its relay."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import urllib.parse

import orjson
import pytest

from tests import tcpmem

from storage import relay
from storage.proxy import ProxyProcess
from storage.proxy.handler import RELAY_LOST_EXIT
from storage.store import EmbeddedStore, s3_client

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(relay.binary() is None, reason="sandfleet-relay is not installed (no cargo at "
                                                                   "set-up); the proxy serves alone")]

VOLATILE = ("t", "ms")  # the clock and the time taken: the rest of each line must be the same


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("relay")
    store = EmbeddedStore(d / "store")
    ep = store.start()
    s3_client(ep.url, ep.creds).create_bucket(Bucket="sf-relay")
    yield ep, d
    store.stop()


def _log(proxy: ProxyProcess) -> list[dict]:
    proxy.control().flush()
    with open(proxy.log_path, "rb") as f:
        return [orjson.loads(line) for line in f.read().splitlines()]


@contextlib.contextmanager
def _proxy(upstream: str, log: str, **kw):
    """A proxy (with its relay unless `relay=False`), stopped by PID however the test ends."""
    proxy = ProxyProcess(upstream, log, **kw).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def _traffic(c, raw_port: int, tag: str) -> None:
    """What runners do, and what they rarely do: small and large bodies, listings, multipart, keys that need
    quoting, a presigned GET, a missing key, a HEAD, a delete, pipelined and hand-made requests."""
    b = "sf-relay"
    c.put_object(Bucket=b, Key=f"{tag}/a", Body=b"x" * 1000)
    c.put_object(Bucket=b, Key=f"{tag}/sp ace+plus/é?&=", Body=b"odd key")
    c.put_object(Bucket=b, Key=f"{tag}/big", Body=(b"0123456789abcdef" * 65537)[:1024 * 1024 + 7])  # streamed
    c.put_object(Bucket=b, Key=f"{tag}/journal/0001", Body=b"y", IfNoneMatch="*")  # the durable runner's commit
    c.head_object(Bucket=b, Key=f"{tag}/a")
    assert len(c.get_object(Bucket=b, Key=f"{tag}/big")["Body"].read()) == 1024 * 1024 + 7
    c.get_object(Bucket=b, Key=f"{tag}/sp ace+plus/é?&=")["Body"].read()
    c.list_objects_v2(Bucket=b, Prefix=f"{tag}/")
    c.list_objects_v2(Bucket=b, Prefix=f"{tag}/sp ace+")
    up = c.create_multipart_upload(Bucket=b, Key=f"{tag}/mp")
    e = c.upload_part(Bucket=b, Key=f"{tag}/mp", UploadId=up["UploadId"], PartNumber=1, Body=b"p" * 5000)
    c.complete_multipart_upload(Bucket=b, Key=f"{tag}/mp", UploadId=up["UploadId"],
                                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e["ETag"]}]})
    with pytest.raises(c.exceptions.NoSuchKey):
        c.get_object(Bucket=b, Key=f"{tag}/missing")
    c.delete_object(Bucket=b, Key=f"{tag}/a")
    url = c.generate_presigned_url("get_object", Params={"Bucket": b, "Key": f"{tag}/mp"}, ExpiresIn=60)
    target = url.split(f":{urllib.parse.urlsplit(url).port}", 1)[1]
    with socket.create_connection(("127.0.0.1", raw_port), timeout=10) as s:  # two pipelined, then a close
        host = f"127.0.0.1:{raw_port}"
        s.sendall((f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n"
                   f"HEAD {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").encode())
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 200") and got.count(b"HTTP/1.1 ") == 2, got[:300]  # the HEAD: 403 (signed for GET)


def _same(line: dict, tag: str | None = None) -> dict:
    keep = {k: v for k, v in line.items() if k not in VOLATILE}
    for k in ("key", "prefix"):
        if tag and isinstance(keep.get(k), str):
            keep[k] = keep[k].replace(tag, "TAG", 1)
    if keep.get("upload_id") is not None:
        keep["upload_id"] = "an upload id"  # the store's own, new each time
    return keep


def test_the_relay_logs_what_the_proxy_alone_logs(store):
    ep, d = store
    with (_proxy(ep.url, str(d / "alone.jsonl"), relay=False) as alone,
          _proxy(ep.url, str(d / "front.jsonl")) as front):
        assert alone.relay_pid() is None and front.relay_pid() is not None
        for proxy, tag in ((alone, "alone"), (front, "front")):
            _traffic(s3_client(proxy.url, ep.creds), proxy.port, tag)
        a, f = (sorted(_log(p), key=lambda x: x["t"]) for p in (alone, front))  # two writers: in time order
        stats = front.control().stats()
        assert [_same(x, "alone") for x in a] == [_same(x, "front") for x in f]
        assert len(f) >= 16 and stats["requests"] == len(f)
        # the relay relayed all but what it must not: the streamed 1 MiB PUT is the proxy's, and so is every
        # later request on that connection
        assert 0 < stats["relayed"] < len(f) and alone.control().stats()["relayed"] == 0


def test_a_rule_catches_the_next_request_and_the_relay_relays_again_after_it(store):
    ep, d = store
    with _proxy(ep.url, str(d / "rules.jsonl")) as front:
        c = s3_client(front.url, ep.creds, max_attempts=1)
        c.put_object(Bucket="sf-relay", Key="rule/k", Body=b"v")
        ctl = front.control()
        before = ctl.stats()["relayed"]
        ctl.open_rule(rule_id="st1", bucket="sf-relay", key_prefix="rule/", fault="ST1")
        with pytest.raises(c.exceptions.ClientError) as e:
            c.get_object(Bucket="sf-relay", Key="rule/k")  # on the connection the relay served until now
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert ctl.stats()["relayed"] == before
        ctl.close_rule("st1")
        fresh = s3_client(front.url, ep.creds, max_attempts=1)  # a new connection: the relay's again
        assert fresh.get_object(Bucket="sf-relay", Key="rule/k")["Body"].read() == b"v"
        assert ctl.stats()["relayed"] == before + 1
        hits = [x for x in _log(front) if x.get("rule") == "st1"]
        assert hits and all(x["status"] == 503 for x in hits)  # botocore may have sent it twice


def test_a_rule_on_one_tasks_prefix_takes_only_that_tasks_requests_from_the_relay(store):
    """The planner pins a rule to a task's prefix (`wave/task/`): the tasks beside it stay on the relay, and the
    task's own next request, on a connection the relay served until then, meets the rule."""
    ep, d = store
    with _proxy(ep.url, str(d / "slots.jsonl")) as front:
        c = s3_client(front.url, ep.creds, max_attempts=1)
        for task in ("t1", "t2"):
            c.put_object(Bucket="sf-relay", Key=f"w1/{task}/k", Body=b"v")
        ctl = front.control()
        ctl.open_rule(rule_id="st1-t1", bucket="sf-relay", key_prefix="w1/t1/", fault="ST1")
        before = ctl.stats()["relayed"]
        assert c.get_object(Bucket="sf-relay", Key="w1/t2/k")["Body"].read() == b"v"
        c.list_objects_v2(Bucket="sf-relay", Prefix="w1/t2/")
        assert ctl.stats()["relayed"] == before + 2  # the other task's, relayed
        with pytest.raises(c.exceptions.ClientError) as e:
            c.get_object(Bucket="sf-relay", Key="w1/t1/k")
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        with pytest.raises(c.exceptions.ClientError):
            s3_client(front.url, ep.creds, max_attempts=1).list_objects_v2(Bucket="sf-relay", Prefix="w1/t1/")
        assert ctl.stats()["relayed"] == before + 2
        assert ctl.close_rule("st1-t1")["hits"] >= 2


def _signed_put(url: str, creds, key: str, body: bytes) -> bytes:
    """The raw bytes of a SigV4-signed PUT of `body` to `key`, to send by hand."""
    import hashlib

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as Signing

    req = AWSRequest(method="PUT", url=f"{url}/sf-relay/{key}", data=body,
                     headers={"x-amz-content-sha256": hashlib.sha256(body).hexdigest()})
    S3SigV4Auth(Signing(creds.access_key, creds.secret_key), "s3", "us-east-1").add_auth(req)
    p = req.prepare()
    head = f"PUT {urllib.parse.urlsplit(p.url).path} HTTP/1.1\r\nHost: {urllib.parse.urlsplit(url).netloc}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in p.headers.items() if k.lower() != "content-length")
    head += f"Content-Length: {len(body)}\r\n\r\n"  # once: a field the proxy reads, given twice, is refused
    return head.encode() + body


def test_a_write_the_store_applied_is_logged_even_when_its_client_vanished(store):
    """A client that resets its connection right after its PUT: whether or not the store got it, a PUT the
    store holds has its line in the log (the audit attributes every object to a logged write)."""
    import struct

    ep, d = store
    with _proxy(ep.url, str(d / "rst.jsonl")) as front:
        keys = [f"rst/{i}" for i in range(8)]
        s3_client(front.url, ep.creds).put_object(Bucket="sf-relay", Key="warm/k", Body=b"the store's first write")
        for key in keys:
            s = socket.create_connection(("127.0.0.1", front.port), timeout=10)
            s.sendall(_signed_put(front.url, ep.creds, key, b"z" * 5000))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()  # a reset, at once
        direct = s3_client(ep.url, ep.creds)
        deadline = time.monotonic() + 30  # a PUT still in flight is waited for; a line never written fails
        while True:
            stored = {o["Key"] for o in direct.list_objects_v2(Bucket="sf-relay", Prefix="rst/").get("Contents", [])}
            logged = {x["key"] for x in _log(front) if x["method"] == "PUT" and 200 <= x["status"] < 300}
            if stored <= logged or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert stored <= logged, (stored, logged)


def test_keys_are_matched_and_logged_as_the_store_holds_them(store):
    """SeaweedFS stores `w2//t1/k` as `w2/t1/k` and `/w2/t1/k` as `w2/t1/k`: a rule on `w2/t1/` meets both, and
    the log names the key the store holds (the audit finds the write of every object)."""
    ep, d = store
    with _proxy(ep.url, str(d / "slashes.jsonl"), merge_slashes=True) as front:
        def put(key: str) -> bytes:
            with socket.create_connection(("127.0.0.1", front.port), timeout=10) as s:
                s.sendall(_signed_put(front.url, ep.creds, key, b"doubled").replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\n"
                                                                                     b"Connection: close\r\n", 1))
                return s.recv(12)

        ctl = front.control()
        ctl.open_rule(rule_id="st1", bucket="sf-relay", key_prefix="w2/t1/", fault="ST1")
        assert put("w2//t1/dbl") == b"HTTP/1.1 503" and put("/w2/t1/lead") == b"HTTP/1.1 503"
        ctl.close_rule("st1")
        assert put("w2//t1/dbl") == b"HTTP/1.1 200"
        held = [o["Key"] for o in s3_client(ep.url, ep.creds).list_objects_v2(Bucket="sf-relay", Prefix="w2/t1/")
                .get("Contents", [])]
        assert held == ["w2/t1/dbl"]
        assert [x["key"] for x in _log(front)] == ["w2/t1/dbl", "w2/t1/lead", "w2/t1/dbl"]


def test_more_connections_than_the_relay_serves_go_to_the_proxy_and_nothing_dies(store):
    ep, d = store
    held = []
    with _proxy(ep.url, str(d / "many.jsonl")) as front, contextlib.ExitStack() as closing:
        relay_pid = front.relay_pid()
        for _ in range(700):  # idle, each half a head: more than the relay's 512 threads
            s = socket.create_connection(("127.0.0.1", front.port), timeout=10)
            s.sendall(b"GET /sf-relay/x HTTP/1.1\r\nHo")
            held.append(closing.enter_context(s))
        c = s3_client(front.url, ep.creds, max_attempts=1)
        c.put_object(Bucket="sf-relay", Key="many/k", Body=b"fine")
        assert c.get_object(Bucket="sf-relay", Key="many/k")["Body"].read() == b"fine"
        held[-1].sendall(b"st: x\r\nConnection: close\r\n\r\n")  # one the proxy took: it answers
        assert held[-1].recv(12) == b"HTTP/1.1 403"
        assert front.proc.poll() is None and front.relay_pid() == relay_pid


def test_the_proxy_ends_when_its_relay_dies_and_leaves_nothing(store):
    ep, d = store
    with _proxy(ep.url, str(d / "dies.jsonl")) as front:
        kid = front.relay_pid()
        os.kill(kid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while front.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert front.proc.returncode == RELAY_LOST_EXIT  # the health watch names the relay by it
        assert b"relay exited" in front.proc.stderr.read()
    with _proxy(ep.url, str(d / "stop.jsonl")) as stopped:
        kid = stopped.relay_pid()

    def gone() -> bool:
        try:
            return open(f"/proc/{kid}/stat").read().split()[2] == "Z"
        except OSError:
            return True

    deadline = time.monotonic() + 30  # (the relay ends on its own once its proxy is gone: waited for, on a loaded
    while not gone() and time.monotonic() < deadline:  # machine that can take a moment, never assumed at once)
        time.sleep(0.05)
    assert gone(), f"the relay {kid} outlived its stopped proxy"


ODD = ["/sf-relay/k", "//sf-relay/k", "/sf-relay/k#frag", "/sf-relay/%ZZ%4", "/sf-relay/%C3%A9t%C3%A9", "/sf-relay/%FF",
       "/sf-relay/a%2Fb/c", "/%2Fsf-relay/k", "/sf-relay?list-type=2&prefix=a+b%2Bc&prefix=second",
       "/sf-relay?prefix=&delimiter=%2F", "/sf-relay/k?partNumber=0012&uploadId=u%20v", "/sf-relay/k?partNumber=1234567890",
       "/sf-relay/k?partNumber=-1&uploadId=&uploadId=x", "/sf-relay/k?uploads", "/sf-relay/k?&&=&x",
       "/sf-relay/k?X-Amz-Credential=AKIDAKIDAKID%2F2026&X-Amz-Signature=0", "/sf-relay/k?a=1&X-Amz-Credential=SHORT%2F",
       "/", "/sf-relay/\u00e9", "/sf-relay?list-type=2&max-keys=%D9%A1", "/sf-relay/k?tagging;x=1",
       "/sf-relay/k?uploadId=x&partNumber=1&partNumber=%2B1"]
HEADS = ["", "Authorization: AWS4-HMAC-SHA256 Credential=AKIDAKIDAKIDAKID/2026/us-east-1/s3/aws4_request\r\n",
         "Authorization: x Credential=" + "A" * 130 + "/ Credential=GOODGOODGOOD/\r\n",
         "X-Amz-Content-Sha256: " + "ab" * 32 + "\r\nX-Amz-Content-Sha256: short\r\n",
         "Content-Length:   0  \r\nExpect: 100-continue\r\n", "X-Odd:\tvalue with\ttabs \r\n",
         "Content-Length: 0\r\nContent-Length: 0\r\n", "X-Amz-Copy-Source: a/b\r\nX-Amz-Copy-Source: a/c\r\n"]


def _send(port: int, method: str, target: str, extra: str) -> bytes:
    head = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}Connection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode())
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return got


def test_odd_targets_and_heads_are_logged_as_the_proxy_alone_logs_them(store):
    """Hand-made requests (unsigned: the store refuses most) whose targets and heads the two parsers could read
    differently: each logs the same line through the relay as through the proxy alone, or is handed over."""
    ep, d = store
    with (_proxy(ep.url, str(d / "odd-alone.jsonl"), relay=False) as alone,
          _proxy(ep.url, str(d / "odd-front.jsonl")) as front):
        cases = [(m, t, h) for t in ODD for h in HEADS[:2] for m in ("GET", "HEAD")]
        cases += [("PUT", "/sf-relay/odd/k", h) for h in HEADS] + [("DELETE", t, HEADS[2]) for t in ODD[:6]]
        for method, target, extra in cases:
            answers = [_send(p.port, method, target, extra)[:12] for p in (alone, front)]
            assert answers[0] == answers[1], (method, target, extra, answers)
        a, f = (sorted(_log(p), key=lambda x: x["t"]) for p in (alone, front))
        assert len(a) == len(cases) and [_same(x) for x in a] == [_same(x) for x in f]
        assert front.control().stats()["relayed"] > len(cases) // 2  # most were the relay's own



def _padded(total: int) -> bytes:
    """An unsigned GET whose head, blank line included, is `total` bytes (one long header line)."""
    start, end = b"GET /sf-relay/big-head HTTP/1.1\r\nHost: x\r\nX-Pad: ", b"\r\nConnection: close\r\n\r\n"
    return start + b"a" * (total - len(start) - len(end)) + end


def _exchange(port: int, data: bytes, first: bytes = b"") -> tuple[bytes, bytes]:
    """(the answer to `first`, sent and read alone on the connection, or b""; every byte answered to `data`, sent
    next on the same connection, until the server closes it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        before = b""
        if first:
            s.sendall(first)
            while b"\r\n\r\n" not in before:
                before += s.recv(65536)
            head = before.split(b"\r\n\r\n", 1)[0].lower()
            length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
            while len(before) < len(head) + 4 + length:  # its body, so what follows is the next answer's
                before += s.recv(65536)
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return before, got


def test_a_head_past_64_kib_is_answered_431_and_logged_through_the_relay_as_by_the_proxy_alone(store):
    """The relay reads a head up to MAX_HEAD (64 KiB, the proxy's own limit) and hands a longer one to the proxy,
    which answers 431 and logs it. Through the relay, the answer and the log line are the proxy alone's: for one
    head past it, on a fresh connection and after a request the relay served on the same one, and at the edges
    (asyncio's limit counts to the blank line's start, so heads of up to 64 KiB + 4 bytes pass the proxy)."""
    ep, d = store
    big = b"PUT /sf-relay/big-head HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 70_000 + b"\r\nContent-Length: 1\r\n\r\nx"
    small = b"GET /sf-relay/small HTTP/1.1\r\nHost: x\r\n\r\n"
    cases = [(b"", big), (small, big)] + [(b"", _padded(n)) for n in (65536, 65537, 65540, 65541)]
    with (_proxy(ep.url, str(d / "431-alone.jsonl"), relay=False) as alone,
          _proxy(ep.url, str(d / "431-front.jsonl")) as front):
        answered = []
        for first, data in cases:
            (b0, a0), (b1, a1) = (_exchange(p.port, data, first) for p in (alone, front))
            assert b0[:12] == b1[:12], (len(data), b0[:200], b1[:200])
            if a0.startswith(b"HTTP/1.1 431"):
                assert a0 == a1, (len(data), a0[:300], a1[:300])  # the proxy's own answer, every byte
            else:
                assert a0[:12] == a1[:12], (len(data), a0[:200], a1[:200])
            answered.append(a1[:12])
        assert answered[:2] == [b"HTTP/1.1 431"] * 2 and answered[-1] == b"HTTP/1.1 431", answered
        assert b"HTTP/1.1 431" not in answered[2:5], answered  # up to 64 KiB + 4: forwarded (the store refuses)
        a, f = (sorted(_log(p), key=lambda x: x["t"]) for p in (alone, front))
        assert len(a) == len(cases) + 1 and [_same(x) for x in a] == [_same(x) for x in f], (a, f)
        too_large = [x for x in f if x["status"] == 431]
        assert len(too_large) == 3 and all(x["key"] is None and "65536" in x["bad_request"] for x in too_large), f
        assert front.control().stats()["relayed"] >= 2  # the relay served the small GET and the 64 KiB head


def test_a_client_that_never_reads_a_large_get_pins_little_kernel_memory_in_the_relay(store):
    """Regression (hostile review): the relay's sockets autotuned their buffers, so a client asking for a large
    object and never reading it pinned about 16 MiB of TCP memory per connection (63 MiB for the 4 here), charged
    to no sandbox. With its client and store sockets' buffers set, 4 pin about 17 MiB, most of it the store's own
    send buffers (4 MiB each, not ours to set)."""
    ep, d = store
    c = s3_client(ep.url, ep.creds)
    c.put_object(Bucket="sf-relay", Key="unread/big", Body=os.urandom(64 << 20))
    url = urllib.parse.urlsplit(c.generate_presigned_url("get_object", Params={"Bucket": "sf-relay",
                                                                                "Key": "unread/big"}, ExpiresIn=120))
    held = []
    with _proxy(ep.url, str(d / "unread.jsonl")) as proxy:
        try:
            before = tcpmem.pages()
            for _ in range(4):
                s = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # (so what is pinned is the relay's)
                s.sendall(f"GET {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n\r\n".encode())
                held.append(s)
            pinned_mib = tcpmem.pinned_mib(before)  # (once the buffers are full)
            assert pinned_mib < 32, f"4 never-read 64 MiB GETs pin {pinned_mib:.1f} MiB of TCP memory"
        finally:
            for s in held:
                s.close()
    c.delete_object(Bucket="sf-relay", Key="unread/big")
