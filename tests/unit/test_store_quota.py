"""The store's per-task quota (storage/quota.py) as the proxy keeps it: what is admitted, what is refused with which
S3 error, how holdings move with each write the store answered, and a resumed wave's holdings from the log."""
from __future__ import annotations

import pytest

from storage.proxy import Head, S3Request
from storage.quota import QUOTA_CODE, QUOTA_STATUS, Quota

B = "sf-w"


def head(length: int | None = None, **extra) -> Head:
    lines = ["PUT /x HTTP/1.1", "Host: s3"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in extra.items()]
    return Head(("\r\n".join(lines) + "\r\n\r\n").encode())


def req(method: str, target: str) -> S3Request:
    return S3Request.parse(method, target)


def put(q: Quota, key: str, n: int, status: int = 200, **extra):
    """One PutObject through the quota: admitted and answered `status`, or refused (the refusal)."""
    res, refusal = q.admit(req("PUT", f"/{B}/{key}"), head(n, **extra))
    if refusal is None:
        q.settle(res, status)
    return refusal


def test_objects_past_the_bound_are_refused_403_quota_exceeded_and_only_for_that_task():
    q = Quota(max_objects=3, max_bytes=10**9)
    assert [put(q, f"w/t000/k{i}", 10) for i in range(3)] == [None] * 3
    refused = put(q, "w/t000/k3", 10)
    assert refused[:2] == (QUOTA_STATUS, QUOTA_CODE) == (403, "QuotaExceeded")
    assert "3 objects" in refused[2]
    assert put(q, "w/t000/k0", 99) is None  # an overwrite adds no object
    assert put(q, "w/t001/k0", 10) is None  # another task has its own quota
    assert q.usage(B, "w/t000/x") == {"objects": 3, "max_objects": 3, "bytes": 119, "max_bytes": 10**9,
                                      "refused": 1}


def test_bytes_past_the_bound_are_refused_and_a_delete_frees_them():
    q = Quota(max_objects=100, max_bytes=1000)
    assert put(q, "w/t000/a", 600) is None
    assert put(q, "w/t000/b", 500)[1] == QUOTA_CODE
    assert put(q, "w/t000/a", 900) is None  # replacing a key counts the difference
    res, refusal = q.admit(req("DELETE", f"/{B}/w/t000/a"), head())
    q.settle(res, 204)
    assert put(q, "w/t000/b", 1000) is None
    assert q.usage(B, "w/t000/")["bytes"] == 1000


def test_a_refused_or_unanswered_write_holds_nothing():
    q = Quota(max_objects=1, max_bytes=100)
    assert put(q, "w/t000/a", 50, status=503) is None  # the store refused it: nothing held
    res, _ = q.admit(req("PUT", f"/{B}/w/t000/a"), head(50))
    q.release(res)  # never answered (a reset): its reservation goes
    assert q.usage(B, "w/t000/")["objects"] == 0
    assert put(q, "w/t000/a", 100) is None


def test_writes_in_flight_together_cannot_pass_the_bound_together():
    q = Quota(max_objects=2, max_bytes=10**9)
    held = [q.admit(req("PUT", f"/{B}/w/t000/k{i}"), head(1)) for i in range(3)]
    assert [r is None for r, _ in held] == [False, False, True]
    assert held[2][1][1] == QUOTA_CODE


def test_multipart_parts_count_while_open_and_the_object_at_completion():
    q = Quota(max_objects=1, max_bytes=100)
    target = f"/{B}/w/t000/mp"
    assert q.admit(req("POST", target + "?uploads"), head(0)) == (None, None)
    res, refusal = q.admit(req("PUT", target + "?partNumber=1&uploadId=U"), head(60))
    assert refusal is None
    q.settle(res, 200)
    assert q.admit(req("PUT", target + "?partNumber=2&uploadId=U"), head(60))[1][1] == QUOTA_CODE
    res, _ = q.admit(req("POST", target + "?uploadId=U"), head(100))
    q.settle(res, 200)
    assert q.usage(B, "w/t000/") == {"objects": 1, "max_objects": 1, "bytes": 60, "max_bytes": 100, "refused": 1}
    # the object bound is kept at creation and at completion
    assert q.admit(req("POST", f"/{B}/w/t000/other?uploads"), head(0))[1][1] == QUOTA_CODE


def test_aborted_uploads_and_delete_objects_free_what_they_held():
    q = Quota(max_objects=10, max_bytes=100)
    res, _ = q.admit(req("PUT", f"/{B}/w/t000/mp?partNumber=1&uploadId=U"), head(90))
    q.settle(res, 200)
    res, _ = q.admit(req("DELETE", f"/{B}/w/t000/mp?uploadId=U"), head())
    q.settle(res, 204)
    put(q, "w/t000/a", 40)
    put(q, "w/t000/b&c", 40)
    res, refusal = q.admit(req("POST", f"/{B}?delete"), head(100))
    assert refusal is None
    q.settle(res, 200, b"<Delete><Object><Key>w/t000/a</Key></Object><Object><Key>w/t000/b&amp;c</Key></Object>"
                       b"</Delete>")
    assert q.usage(B, "w/t000/")["bytes"] == 0 and q.usage(B, "w/t000/")["objects"] == 0


@pytest.mark.parametrize("method,target,hdr,status,code", [
    ("POST", f"/{B}", {}, 501, "NotImplemented"),  # a form upload: its key is in its body
    ("PUT", f"/{B}/w/t000/x", {"transfer_encoding": "chunked"}, 411, "MissingContentLength"),
])
def test_writes_the_quota_cannot_count_are_refused_with_the_s3_error(method, target, hdr, status, code):
    q = Quota(max_objects=10, max_bytes=100)
    _, refusal = q.admit(req(method, target), head(None, **hdr))
    assert refusal[:2] == (status, code)


def test_aws_chunked_counts_the_decoded_length_and_a_copy_its_source():
    q = Quota(max_objects=10, max_bytes=100)
    assert put(q, "w/t000/a", 10_000, x_amz_decoded_content_length=70) is None
    assert q.usage(B, "w/t000/")["bytes"] == 70
    assert put(q, "w/t000/b", 0, x_amz_copy_source=f"/{B}/w/t000/a")[1] == QUOTA_CODE  # 70 + 70 > 100
    assert put(q, "w/t000/a", 0, **{"x-amz-tagging-ignored": "1"}) is None  # (a header it does not read)


def test_reads_and_tagging_pass_uncounted():
    q = Quota(max_objects=1, max_bytes=1)
    for method, target in (("GET", f"/{B}/w/t000/a"), ("HEAD", f"/{B}/w/t000/a"), ("GET", f"/{B}?list-type=2"),
                           ("PUT", f"/{B}/w/t000/a?tagging")):
        assert q.admit(req(method, target), head(500)) == (None, None)


def test_a_resumed_wave_starts_from_what_its_log_says_the_store_holds():
    q = Quota(max_objects=2, max_bytes=10**6)
    log = [{"t": 1, "method": "PUT", "bucket": B, "key": "w/t000/a", "status": 200, "req_bytes": 5},
           {"t": 2, "method": "PUT", "bucket": B, "key": "w/t000/b", "status": 200, "req_bytes": 7},
           {"t": 3, "method": "PUT", "bucket": B, "key": "w/t000/c", "status": 403, "req_bytes": 7,
            "quota": {}},
           {"t": 4, "method": "PUT", "bucket": B, "key": "w/t000/m", "part": 1, "upload_id": "U", "status": 200,
            "req_bytes": 9},
           {"t": 5, "method": "DELETE", "bucket": B, "key": "w/t000/m", "upload_id": "U", "status": 204},
           "not a record", {"t": "x"}]
    assert q.preload(log) == 4
    assert q.usage(B, "w/t000/") == {"objects": 2, "max_objects": 2, "bytes": 12, "max_bytes": 10**6,
                                     "refused": 0}
    assert put(q, "w/t000/c", 1)[1] == QUOTA_CODE


def test_bounds_must_be_positive():
    with pytest.raises(ValueError, match="quota bounds"):
        Quota(0, 10)


def test_the_proxy_answers_a_write_past_the_quota_itself_and_counts_what_the_store_applied(tmp_path):
    """Through a real FaultProxy on 127.0.0.1 in front of a tiny upstream: writes within the quota reach the store,
    the one past it is answered 403 QuotaExceeded by the proxy (its body read and dropped, the kept-alive connection
    going on) and never forwarded, a DeleteObjects the store answered frees room, and the refusal is logged with
    `quota`."""
    import asyncio

    import orjson

    from storage import proxy as px

    async def main():
        seen = []

        async def upstream(r, w):
            while True:
                head = await px.read_head(r)
                if head is None:
                    break
                await r.readexactly(head.length or 0)
                seen.append(head.start)
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await w.drain()
            w.close()

        up = await asyncio.start_server(upstream, "127.0.0.1", 0)
        proxy = px.FaultProxy("127.0.0.1", up.sockets[0].getsockname()[1], str(tmp_path / "log.jsonl"),
                              Quota(max_objects=2, max_bytes=10**6))
        front = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
        r, w = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
        answers = []
        delete = b"<Delete><Object><Key>w/t000/a</Key></Object></Delete>"
        for method, target, body in (("PUT", "/b/w/t000/a", b"1"), ("PUT", "/b/w/t000/b", b"22"),
                                     ("PUT", "/b/w/t000/c", b"333"), ("POST", "/b?delete", delete),
                                     ("PUT", "/b/w/t000/c", b"333")):
            w.write(f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            await w.drain()
            head = await px.read_head(r)
            got = await r.readexactly(head.length or 0)
            answers.append((int(head.start.split()[1]), got))
        w.close()
        front.close()
        up.close()
        proxy.flush_log()
        return answers, seen

    answers, seen = asyncio.run(main())
    assert [a for a, _ in answers] == [200, 200, 403, 200, 200]
    assert b"<Code>QuotaExceeded</Code>" in answers[2][1] and b"2 objects" in answers[2][1]
    assert seen == ["PUT /b/w/t000/a HTTP/1.1", "PUT /b/w/t000/b HTTP/1.1", "POST /b?delete HTTP/1.1",
                    "PUT /b/w/t000/c HTTP/1.1"]  # the refused write never reached the store
    log = [orjson.loads(x) for x in (tmp_path / "log.jsonl").read_bytes().splitlines()]
    refused = [e for e in log if e.get("quota")]
    assert len(refused) == 1 and refused[0]["key"] == "w/t000/c" and refused[0]["code"] == "QuotaExceeded"
    assert refused[0]["quota"]["objects"] == 2 and refused[0]["req_bytes"] == 3
