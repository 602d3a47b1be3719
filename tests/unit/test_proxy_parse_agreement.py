"""The proxy must read a request as the store (SeaweedFS: Go's net/http, url.ParseQuery, gorilla/mux) reads it, or
refuse it: each test is a hostile review's way past the store quota, through a real FaultProxy with a quota on a
real socket, where the proxy logged one operation and the store would have run another."""
from __future__ import annotations

import asyncio

import pytest

from storage import proxy as px
from storage.quota import Quota
from tests.proxyharness import head_then_eof_if_closed, through_proxy

HIDDEN = b"PUT /b/w/t000/hidden HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx"


def _ready(proxy: px.FaultProxy) -> None:
    proxy.quota.use.setdefault(("b", "w", "t000"), proxy.quota._use(("b", "w", "t000")))
    proxy.quota.use[("b", "w", "t000")].objects["w/t000/big"] = 600  # as if written (600 B) earlier
    proxy.quota.use[("b", "w", "t000")].objects["w/t000/small"] = 1


def _through_quota_proxy(tmp_path, sends: list[bytes]):
    """Each of `sends` on its own connection to a real FaultProxy with a quota; (answers, upstream bytes, log)."""
    return through_proxy(tmp_path, sends, Quota(max_objects=5, max_bytes=1000), _ready, head_then_eof_if_closed)


def _refused(tmp_path, head: bytes, code: bytes) -> None:
    answers, got, log = asyncio.run(_through_quota_proxy(tmp_path, [head + HIDDEN]))
    assert answers[0].startswith(b"HTTP/1.1 400 "), answers[0][:300]
    assert b"<Code>" + code + b"</Code>" in answers[0] and answers[0].count(b"HTTP/1.1") == 1, answers[0]
    assert got == []  # neither the request nor what followed it reached the store
    assert len(log) == 1 and log[0]["status"] == 400 and log[0]["bad_request"], log


@pytest.mark.parametrize("value", ["%D9%A1", "%EF%BC%91", "1%C2%B2", "+1", "-1", "", "1x", "0x1", "1234567890"])
def test_a_part_number_that_is_not_ascii_digits_is_refused_invalid_argument(tmp_path, value):
    """Finding a: `partNumber=%D9%A1` (U+0661) was UploadPart 1 here (int() takes it) and a whole PutObject in the
    store (its route needs [0-9]+): logged as a part, freed by the abort."""
    head = (f"PUT /b/w/t000/evade1?partNumber={value}&uploadId=U HTTP/1.1\r\nHost: x\r\n"
            "Content-Length: 1\r\n\r\nx").encode()
    _refused(tmp_path, head, b"InvalidArgument")


@pytest.mark.parametrize("query", ["tagging=%zz", "tagging=%", "tagging&x=%4", "tagging;x=1", "tagging=1;x",
                                   "tagging&%zz",
                                   "tagging&prefix=%ff"])
def test_a_query_go_would_read_otherwise_is_refused(tmp_path, query):
    """Finding b: `?tagging=%zz` kept the tagging flag in parse_qs (uncounted) while Go's ParseQuery drops the pair
    (a plain PutObject in the store)."""
    head = f"PUT /b/w/t000/tagq?{query} HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx".encode()
    _refused(tmp_path, head, b"BadRequest")


def test_a_fragment_mark_in_the_target_is_refused(tmp_path):
    """Python's urlsplit cuts `#...`; Go's request-URI parse keeps it (`?tagging#` is no tagging there)."""
    _refused(tmp_path, b"PUT /b/w/t000/x?tagging# HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx", b"BadRequest")


@pytest.mark.parametrize("fields", [
    "X-Amz-Copy-Source: /b/w/t000/small\r\nX-Amz-Copy-Source: /b/w/t000/big",
    "x-amz-copy-source: /b/w/t000/big\r\nx-amz-copy-source-range: bytes=0-0\r\nx-amz-copy-source-range: bytes=0-999",
    "X-Amz-Content-Sha256: UNSIGNED-PAYLOAD\r\nx-amz-content-sha256: STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    "Expect: 100-continue\r\nexpect: x",
])
def test_a_header_the_quota_reads_given_twice_is_refused(tmp_path, fields):
    """Finding c: the proxy's Head kept the last X-Amz-Copy-Source, Go's Header.Get reads the first: a copy of a
    600,000 B object was counted as the small one."""
    head = f"PUT /b/w/t000/c?partNumber=1&uploadId=U HTTP/1.1\r\nHost: x\r\n{fields}\r\nContent-Length: 0\r\n\r\n"
    _refused(tmp_path, head.encode(), b"BadRequest")


def test_a_duplicate_content_length_of_the_same_value_is_refused(tmp_path):
    _refused(tmp_path, b"PUT /b/w/t000/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
             b"BadRequest")


def test_well_formed_numbers_queries_and_repeated_unread_headers_still_pass(tmp_path):
    sends = [b"PUT /b/w/t000/p?partNumber=0001&uploadId=U HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",
             b"PUT /b/w/t000/t?tagging= HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",
             b"GET /b?list-type=2&prefix=w%2Ft000%2F&max-keys=10 HTTP/1.1\r\nHost: x\r\n\r\n",
             b"PUT /b/w/t000/k%2Bv?x-id=PutObject HTTP/1.1\r\nHost: x\r\nX-Foo: 1\r\nX-Foo: 2\r\n"
             b"Content-Length: 1\r\n\r\nx"]
    answers, got, log = asyncio.run(_through_quota_proxy(tmp_path, sends))
    assert len(got) == 4 and all(not r.get("bad_request") for r in log), log
    assert [r["key"] for r in log] == ["w/t000/p", "w/t000/t", "", "w/t000/k+v"]
    assert log[0]["part"] == 1 and log[2]["prefix"] == "w/t000/"


def test_a_head_past_64_kib_is_answered_431_and_logged(tmp_path):
    """A 70,000-byte header line got no answer and no log line (the connection just closed)."""
    big = b"PUT /b/w/t000/x HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 70_000 + b"\r\nContent-Length: 1\r\n\r\nx"
    answers, got, log = asyncio.run(_through_quota_proxy(tmp_path, [big]))
    assert answers[0].startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), answers[0][:200]
    assert answers[0].endswith(b"\r\n\r\nrequest head over 64 KiB: refused\r\n")
    assert got == [] and len(log) == 1 and log[0]["status"] == 431 and "65536" in log[0]["bad_request"], log
