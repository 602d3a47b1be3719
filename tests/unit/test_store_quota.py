"""The store's per-task quota (storage/quota.py) as the proxy keeps it: what is admitted, what is refused with which
S3 error, how holdings move with each write the store answered, and a resumed wave's holdings from the log."""
from __future__ import annotations

import pytest

from storage.proxy import Head, S3Request
from storage.quota import QUOTA_CODE, QUOTA_STATUS, Quota, delete_keys

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
    q.settle(res, 200, delete_keys(b"<Delete><Object><Key>w/t000/a</Key></Object><Object><Key>w/t000/b&amp;c</Key>"
                                   b"</Object></Delete>"))
    assert q.usage(B, "w/t000/")["bytes"] == 0 and q.usage(B, "w/t000/")["objects"] == 0


@pytest.mark.parametrize("method,target,hdr,status,code", [
    ("POST", f"/{B}", {}, 501, "NotImplemented"),  # a form upload: its key is in its body
    ("PUT", f"/{B}/w/t000/x", {"transfer_encoding": "chunked"}, 411, "MissingContentLength"),
])
def test_writes_the_quota_cannot_count_are_refused_with_the_s3_error(method, target, hdr, status, code):
    q = Quota(max_objects=10, max_bytes=100)
    _, refusal = q.admit(req(method, target), head(None, **hdr))
    assert refusal[:2] == (status, code)


def test_a_put_counts_the_bytes_it_sends_never_a_decoded_length_it_claims():
    """Finding 2c: SeaweedFS ignores x-amz-decoded-content-length; a runner that claimed 7 bytes for a 70-byte body
    was counted 7."""
    q = Quota(max_objects=10, max_bytes=100)
    assert put(q, "w/t000/a", 70, x_amz_decoded_content_length=7) is None
    assert q.usage(B, "w/t000/")["bytes"] == 70
    assert put(q, "w/t000/b", 70, x_amz_decoded_content_length=7, content_encoding="aws-chunked")[1] == QUOTA_CODE
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
                answer = b"<DeleteResult/>" if head.start.startswith("POST /b?delete") else b""
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
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


def test_a_copy_counts_its_source_or_its_range_within_it_never_zero_nor_the_ranges_claim():
    """Finding 2a: a copy from another task's key counted 0 bytes, a part copy the range header's claim."""
    q = Quota(max_objects=10, max_bytes=1000)
    assert put(q, "w/t001/src", 300) is None
    assert put(q, "w/t000/c1", 0, x_amz_copy_source=f"{B}/w/t001/src") is None  # another task's source: 300
    assert q.usage(B, "w/t000/")["bytes"] == 300
    part = req("PUT", f"/{B}/w/t000/mp?partNumber=1&uploadId=U")
    res, refusal = q.admit(part, head(0, x_amz_copy_source=f"/{B}/w/t001/src",
                                      x_amz_copy_source_range="bytes=100-99999999"))
    assert refusal is None and res.length == 200  # the range within the source, not the claim
    q.settle(res, 200)
    # CopyObject ignores a range at SeaweedFS: the whole source
    assert q.admit(req("PUT", f"/{B}/w/t000/c2"), head(0, x_amz_copy_source=f"{B}/w/t001/src",
                                                         x_amz_copy_source_range="bytes=0-0"))[0].length == 300
    _, refusal = q.admit(req("PUT", f"/{B}/w/t000/c3"), head(0, x_amz_copy_source=f"{B}/w/t001/never"))
    assert refusal[:2] == (501, "NotImplemented") and "has not seen" in refusal[2]
    _, refusal = q.admit(part, head(0, x_amz_copy_source=f"{B}/w/t001/src", x_amz_copy_source_range="bytes=9-1"))
    assert refusal[:2] == (400, "InvalidArgument")


@pytest.mark.parametrize("src", [f"/{B}//w/t001/src", f"{B}/w//t001/src", f"{B}/w/t001/src?versionId=null",
                                 f"{B}/w/./t001/src", f"{B}/w/../w/t001/src", f"{B}/w/t001/src%zz",
                                 f"{B}/w/t001/%00src", f"{B}/w%2F%2Ft001/src", f"/{B}/", f"{B}", "/"])
def test_a_copy_source_the_store_may_read_as_another_key_is_refused(src):
    """Finding 2b: `/bucket//key`, escapes and `?versionId=` were read one way by the quota, another by SeaweedFS."""
    q = Quota(max_objects=10, max_bytes=1000)
    put(q, "w/t001/src", 300)
    _, refusal = q.admit(req("PUT", f"/{B}/w/t000/c"), head(0, x_amz_copy_source=src))
    assert refusal is not None and refusal[:2] == (400, "InvalidArgument"), (src, refusal)
    assert "x-amz-copy-source" in refusal[2]


@pytest.mark.parametrize("src,key", [(f"{B}/w/t001/a%2Bb", "w/t001/a+b"), (f"/{B}/w/t001/a+b", "w/t001/a+b"),
                                     (f"{B}/w%2Ft001%2Fsp%20ace", "w/t001/sp ace")])
def test_a_copy_source_is_unescaped_as_seaweedfs_unescapes_it(src, key):
    from storage.quota import copy_source

    assert copy_source(src) == (B, key)


@pytest.mark.parametrize("body,keys", [
    (b"<Delete><Object><Key>w/t000/a<!-- x -->b</Key></Object></Delete>", ["w/t000/ab"]),
    (b"<Delete><Object><Key><![CDATA[w/t000/<a>]]></Key></Object></Delete>", ["w/t000/<a>"]),
    (b'<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Quiet>true</Quiet><Object><Key>&#119;/t000/a&amp;b'
     b"</Key><VersionId>v</VersionId></Object><Object><Key></Key></Object></Delete>", ["w/t000/a&b"]),
])
def test_delete_objects_names_the_keys_the_store_deletes(body, keys):
    """Finding 2d: a regex named `w/t000/a<!-- x -->b` where Go's XML decoder reads `w/t000/ab`."""
    assert delete_keys(body) == keys


@pytest.mark.parametrize("body", [
    b"<Delete><Object><Key>w/t000/a</Key><Key>w/t000/b</Key></Object></Delete>",  # Go keeps the last Key
    b'<!DOCTYPE d [<!ENTITY x "w/t000/a">]><Delete><Object><Key>&x;</Key></Object></Delete>',
    b"<Delete><Object><Key>&x;</Key></Object></Delete>",
    b"<Delete><Object><Key>w/t000/<b>a</b></Key></Object></Delete>",
    b"<Delete><Key>w/t000/a</Key><Object><Key>w/t000/b</Key></Object></Delete>",
    b"<Delete><Object><Key>w/t000/a</Key></Object></Delete><Delete><Object><Key>x</Key></Object></Delete>",
    b'<?xml version="1.0" encoding="UTF-16"?><Delete/>',
    b"<Delete><Object><Key>w/t000//a</Key></Object></Delete>",
    b"<Other><Object><Key>w/t000/a</Key></Object></Other>",
    b"<Delete>" + b"<Object><Key>k</Key></Object>" * 1001 + b"</Delete>",
])
def test_a_delete_objects_body_the_store_could_read_otherwise_is_refused(body):
    with pytest.raises(ValueError, match="DeleteObjects body"):
        delete_keys(body)


def _live_then_preload(tmp_path):
    """A sequence of writes through a real FaultProxy (quota on) in front of a tiny store that keeps objects and
    answers DeleteObjects as S3 does (an Error for a key it may not delete); then a fresh Quota preloaded from
    the proxy's log."""
    import asyncio

    import orjson

    from storage import proxy as px

    async def main():
        held: dict[str, int] = {}

        async def upstream(r, w):
            while True:
                head = await px.read_head(r)
                if head is None:
                    break
                body = await r.readexactly(head.length or 0)
                method, target = head.start.split(" ")[:2]
                answer = b""
                if target.endswith("?delete"):
                    errors = b""
                    for k in delete_keys(body):
                        if "denied" in k:
                            errors += b"<Error><Code>AccessDenied</Code><Key>%s</Key></Error>" % k.encode()
                        else:
                            held.pop(k, None)
                    answer = b"<DeleteResult>" + errors + b"</DeleteResult>"
                elif method == "PUT" and "?" not in target:
                    src = head.get("x-amz-copy-source")
                    held[target.split("/", 2)[2]] = held[src.split("/", 1)[1]] if src else len(body)
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
                await w.drain()
            w.close()

        up = await asyncio.start_server(upstream, "127.0.0.1", 0)
        quota = Quota(max_objects=100, max_bytes=10**6)
        proxy = px.FaultProxy("127.0.0.1", up.sockets[0].getsockname()[1], str(tmp_path / "log.jsonl"), quota)
        front = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
        r, w = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])

        def delete(*keys, extra=b""):
            return b"<Delete>" + b"".join(b"<Object><Key>%s</Key></Object>" % k.encode() for k in keys) + extra \
                + b"</Delete>"

        steps = [("PUT", "/b/w/t000/a", {}, b"1" * 10), ("PUT", "/b/w/t000/b", {}, b"2" * 20),
                 ("PUT", "/b/w/t001/denied", {}, b"3" * 30), ("PUT", "/b/w/t000/c", {}, b"4" * 40),
                 ("PUT", "/b/w/t000/cp", {"x-amz-copy-source": "b/w/t001/denied"}, b""),
                 ("PUT", "/b/w/t000/a?tagging", {}, b"<Tagging/>"),
                 ("PUT", "/b/w/t000/d", {"x-amz-decoded-content-length": "1"}, b"5" * 50),
                 # a key named twice, one that never existed, another task's it may not delete, one twice over
                 ("POST", "/b?delete", {}, delete("w/t000/a", "w/t000/a", "w/t000/never", "w/t001/denied",
                                                  "w/t000/b")),
                 ("POST", "/b?delete", {}, delete("w/t000/c<!-- -->")),  # a comment: the store deletes w/t000/c
                 ("POST", "/b?delete", {}, delete("w/t000/cp", "w/t000/d", extra=b"<Object><Key>w/t000/d</Key>"
                                                  b"<Key>w/t000/cp</Key></Object>")),  # refused: two Keys
                 ("DELETE", "/b/w/t000/never", {}, b""), ("PUT", "/b/w/t000/b", {}, b"6" * 60)]
        for method, target, hdrs, body in steps:
            extra = "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
            w.write(f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
                    + body)
            await w.drain()
            head = await px.read_head(r)
            await r.readexactly(head.length or 0)
        w.close()
        front.close()
        up.close()
        proxy.flush_log()
        log = [orjson.loads(x) for x in (tmp_path / "log.jsonl").read_bytes().splitlines()]
        return quota, log, held

    live, log, held = asyncio.run(main())
    again = Quota(max_objects=100, max_bytes=10**6)
    again.preload(log)
    return live, again, log, held


def test_a_resumed_wave_preloads_the_totals_the_live_count_reached(tmp_path):
    """Finding 3: preload left out every DeleteObjects (a bucket-level POST has no key), so a resumed wave counted
    deleted objects again; it must reach the same totals as the live count, which must match the store."""
    live, again, log, held = _live_then_preload(tmp_path)

    def totals(q):
        return {slot: (dict(u.objects), u.bytes, u.part_bytes) for slot, u in q.use.items() if u.objects or u.bytes}

    assert totals(again) == totals(live)
    store = {}
    for k, n in held.items():
        store.setdefault(("b",) + tuple(k.split("/")[:2]), {})[k] = n
    assert {slot: objs for slot, (objs, _, _) in totals(live).items()} == store  # what the store holds
    deletes = [r for r in log if r.get("quota_op") == "DeleteObjects" and r["status"] == 200]
    assert deletes[0]["keys"] == ["w/t000/a", "w/t000/a", "w/t000/never", "w/t001/denied", "w/t000/b"]
    assert deletes[0]["not_deleted"] == ["w/t001/denied"] and deletes[1]["keys"] == ["w/t000/c"]
    assert [r["code"] for r in log if r.get("status") == 400] == ["MalformedXML"]


def test_a_log_from_before_quota_op_still_frees_what_its_delete_objects_named():
    """A wave whose first run logged no `quota_op` (an older proxy) resumes with its DeleteObjects applied too."""
    q = Quota(max_objects=10, max_bytes=10**6)
    log = [{"t": 1, "method": "PUT", "bucket": B, "key": "w/t000/a", "status": 200, "req_bytes": 5},
           {"t": 2, "method": "PUT", "bucket": B, "key": "w/t000/b", "status": 200, "req_bytes": 7},
           {"t": 3, "method": "POST", "bucket": B, "key": "", "keys": ["w/t000/b", "w/t000/none"], "status": 200},
           {"t": 4, "method": "POST", "bucket": B, "key": "", "status": 200}]  # a POST that names no key
    assert q.preload(log) == 3
    assert q.usage(B, "w/t000/")["objects"] == 1 and q.usage(B, "w/t000/")["bytes"] == 5
