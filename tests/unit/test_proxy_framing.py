"""The proxy refuses every request head (and chunked body) that another HTTP/1.1 reader may frame otherwise
(RFC 9112 5.2, 6.1, 7.1): a real FaultProxy on 127.0.0.1 in front of a tiny upstream that records every byte it
gets. A refused request is answered 400 with S3's XML error, logged with `bad_request` and no key, its
connection closed, and nothing of it reaches the upstream."""
from __future__ import annotations

import asyncio

import orjson
import pytest

from storage import proxy as px
from tests.proxyharness import through_proxy

OK = [
    b"GET /b/k HTTP/1.1\r\nHost: x\r\n\r\n",
    b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",  # the same value twice
    b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET /b/k HTTP/1.1\r\nHost: x\r\nX-Tab:\tv\t\r\nX-Meta: caf\xe9\r\n\r\n",  # HTAB and obs-text in a value
]
BAD = {
    "obs_fold": b"GET /b/k HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n Content-Length: 5\r\n\r\n",
    "obs_fold_tab": b"GET /b/k HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\tContent-Length: 5\r\n\r\n",
    "bare_lf": b"GET /b/k HTTP/1.1\r\nHost: x\r\n\nPUT /b/h HTTP/1.1\r\nContent-Length: 1\r\n\r\n",
    "bare_cr": b"GET /b/k HTTP/1.1\r\nHost: x\rContent-Length: 5\r\n\r\n",
    "name_space": b"GET /b/k HTTP/1.1\r\nContent-Length : 5\r\n\r\n",
    "name_not_token": b"GET /b/k HTTP/1.1\r\nContent(Length): 5\r\n\r\n",
    "no_colon": b"GET /b/k HTTP/1.1\r\nHost x\r\n\r\n",
    "two_lengths": b"GET /b/k HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n",
    "length_list": b"GET /b/k HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
    "length_empty": b"GET /b/k HTTP/1.1\r\nContent-Length:\r\n\r\n",
    "length_and_te": b"PUT /b/k HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    "te_not_chunked": b"PUT /b/k HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n",
    "te_list": b"PUT /b/k HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    "te_twice": b"PUT /b/k HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
    "nul_in_value": b"GET /b/k HTTP/1.1\r\nX-A: a\x00b\r\n\r\n",
    "version": b"GET /b/k HTTP/1.1 extra\r\nHost: x\r\n\r\n",
    "two_spaces": b"GET  /b/k HTTP/1.1\r\nHost: x\r\n\r\n",
}


@pytest.mark.parametrize("raw", OK)
def test_well_formed_heads_pass(raw):
    assert px.framing_problem(raw) is None


@pytest.mark.parametrize("kind", sorted(BAD))
def test_each_head_another_reader_may_frame_otherwise_is_named(kind):
    assert px.framing_problem(BAD[kind]), kind


def test_the_proxy_refuses_logs_and_closes_and_the_upstream_gets_nothing(tmp_path):
    hidden = b"PUT /b/hidden HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx"
    sends = [BAD[k] + hidden for k in sorted(BAD)]
    answers, got, log = asyncio.run(through_proxy(tmp_path, sends))
    for kind, answer in zip(sorted(BAD), answers):
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), (kind, answer[:200])
        assert b"<Code>BadRequest</Code>" in answer and answer.count(b"HTTP/1.1") == 1, (kind, answer)
    assert got == []
    assert len(log) == len(BAD) and all(r["status"] == 400 and r["key"] is None and r["bad_request"] for r in log)


@pytest.mark.parametrize("body", [
    b"0x5\r\nhello\r\n0\r\n\r\n",  # int(..., 16) reads 0x5; Go does not
    b"+5\r\nhello\r\n0\r\n\r\n",
    b"\r\n",  # an empty size line read as 0 (the last chunk)
    b"5\r\nhelloXX0\r\n\r\n",  # the data not followed by CRLF
    b"5\nhello\r\n0\r\n\r\n",  # a bare LF in the size line
    b"0\r\nX: y\n\r\nPUT /b/hidden HTTP/1.1\r\nContent-Length: 1\r\n\r\nx",  # a trailer with a bare LF
    b"0\r\n folded: trailer\r\n\r\n",
])
def test_a_chunked_body_framed_otherwise_ends_the_connection_and_is_logged(tmp_path, body):
    head = b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    answers, got, log = asyncio.run(through_proxy(tmp_path, [head + body]))
    assert b"PUT /b/hidden" not in b"".join(got)
    assert answers[0] == b"" or answers[0].startswith(b"HTTP/1.1 400 "), answers[0][:200]
    assert [r for r in log if r.get("bad_request")], log


def test_a_well_framed_chunked_body_with_a_trailer_still_passes(tmp_path):
    head = b"PUT /b/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"5;ext=1\r\nhello\r\n0\r\nX-Trailer: v\r\n\r\n"
    answers, got, log = asyncio.run(through_proxy(tmp_path, [head + body]))
    assert b"".join(got) == head + body
    assert answers[0].startswith(b"HTTP/1.1 200 ")
    assert log[0]["req_bytes"] == 5 and "bad_request" not in log[0]


def test_a_chunked_body_framed_otherwise_under_an_error_rule_is_logged_too(tmp_path):
    """The error action reads and drops a hit request's body: a bad chunk there is refused and logged as well."""
    async def main():
        proxy = px.FaultProxy("127.0.0.1", 1, str(tmp_path / "log.jsonl"))
        proxy.dispatch("POST", "/rules", b'{"rule_id": "st1", "fault": "ST1"}')
        front = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
        r, w = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
        w.write(b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n")
        await w.drain()
        answer = await asyncio.wait_for(r.read(), 10)
        w.close()
        front.close()
        proxy.flush_log()
        return answer, [orjson.loads(x) for x in (tmp_path / "log.jsonl").read_bytes().splitlines()]

    answer, log = asyncio.run(main())
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert len(log) == 1 and log[0]["bad_request"] and log[0]["key"] is None
