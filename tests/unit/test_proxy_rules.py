import pytest

from storage.proxy import FaultProxy, Rule, S3Request, error_response


def test_parse_path_style_requests():
    r = S3Request.parse("PUT", "/bkt/w1/t000/journal/0001.json?partNumber=3&uploadId=abc")
    assert (r.bucket, r.key, r.part, r.upload_id) == ("bkt", "w1/t000/journal/0001.json", 3, "abc")
    r = S3Request.parse("GET", "/bkt?list-type=2&prefix=x")
    assert (r.bucket, r.key, r.part, r.list_prefix) == ("bkt", "", None, "x")


def test_a_task_rule_matches_listings_of_its_prefix():
    """A runner that lists its journal during an outage must meet the outage (it used to slip through)."""
    rule = Rule(rule_id="r", bucket="bkt", key_prefix="w1/t000/")
    assert rule.matches(S3Request.parse("GET", "/bkt?list-type=2&prefix=w1%2Ft000%2Fjournal%2F"))
    assert not rule.matches(S3Request.parse("GET", "/bkt?list-type=2&prefix=w1%2Ft001%2F"))
    assert not rule.matches(S3Request.parse("GET", "/bkt?list-type=2"))


def test_rule_matches_on_bucket_prefix_method_and_part():
    rule = Rule(rule_id="r", bucket="bkt", key_prefix="w1/t000/", methods=["PUT"])
    assert rule.matches(S3Request.parse("PUT", "/bkt/w1/t000/a"))
    assert not rule.matches(S3Request.parse("GET", "/bkt/w1/t000/a"))
    assert not rule.matches(S3Request.parse("PUT", "/bkt/w1/t001/a"))
    assert not rule.matches(S3Request.parse("PUT", "/other/w1/t000/a"))
    assert Rule(rule_id="p", part=2).matches(S3Request.parse("PUT", "/b/k?partNumber=2&uploadId=u"))


def test_ratio_draw_is_seeded():
    a = Rule(rule_id="a", ratio=0.5, seed=3)
    b = Rule(rule_id="b", ratio=0.5, seed=3)
    assert [a.draw() for _ in range(50)] == [b.draw() for _ in range(50)]
    assert 0 < a.hits < 50


def test_bad_rule_names_field_and_allowed():
    with pytest.raises(ValueError, match="rule.action='explode'"):
        Rule(rule_id="x", action="explode")
    with pytest.raises(ValueError, match="rule.ratio"):
        Rule(rule_id="x", ratio=2)


def test_st1_answer_is_s3_xml_503():
    req = S3Request.parse("PUT", "/bkt/k")
    raw = error_response(Rule(rule_id="r1"), req, close=False).decode()
    head, body = raw.split("\r\n\r\n", 1)
    assert head.startswith("HTTP/1.1 503 Service Unavailable")
    assert f"Content-Length: {len(body)}" in head
    assert "<Code>ServiceUnavailable</Code>" in body and "<Resource>/bkt/k</Resource>" in body


def test_control_api_open_close_and_counts():
    p = FaultProxy("127.0.0.1", 1, None)
    status, rule = p.dispatch("POST", "/rules", b'{"rule_id": "r1", "key_prefix": "a/"}')
    assert status == 201 and rule["rule_id"] == "r1"
    assert p.dispatch("POST", "/rules", b'{"rule_id": "r1"}')[0] == 409
    assert p.match(S3Request.parse("GET", "/b/a/x")) is not None
    assert p.match(S3Request.parse("GET", "/b/z")) is None
    status, closed = p.dispatch("DELETE", "/rules/r1", b"")
    assert status == 200 and closed["hits"] == 1 and closed["matched"] == 1
    assert p.dispatch("DELETE", "/rules/r1", b"")[0] == 404


def test_duration_window_opens_at_first_match_and_expires():
    rule = Rule(rule_id="w", duration_s=0.2)
    assert not rule.expired()
    assert rule.draw() and rule.first_hit_at is not None
    rule.first_hit_at -= 0.5  # the window opened 0.5 s ago
    assert rule.expired() and rule.draw() is False
    assert rule.hits == 1 and rule.matched == 2 and rule.public()["expired"] is True


def test_the_rule_index_finds_exactly_what_a_scan_finds_and_skips_other_prefixes():
    import random

    from storage.proxy import RuleSet

    rnd = random.Random(5)
    rs, plain = RuleSet(), []
    prefixes = [None, "", "w", "w/", "w/t1", "w/t1/", "w/t1/snap", "w/t2/", "x/t1/", "w/t1/journal/"]
    for i in range(300):
        r = Rule(rule_id=f"r{i}", bucket=rnd.choice([None, "b", "c"]), key_prefix=rnd.choice(prefixes),
                 methods=rnd.choice([None, ["PUT"], ["GET"]]))
        rs[r.rule_id] = r
        plain.append(r)
    for rid in [f"r{i}" for i in range(0, 300, 7)]:  # closing keeps the index true
        rs.pop(rid)
        plain = [r for r in plain if r.rule_id != rid]
    for _ in range(500):
        req = S3Request.parse(rnd.choice(["GET", "PUT"]), rnd.choice(
            ["/b/w/t1/journal/0001", "/b/w/t2/a", "/c/w/t1/snap.tar", "/b/x/t1/k", "/b?list-type=2&prefix=w%2Ft1%2F",
             "/b?list-type=2&prefix=w%2F", "/b/w", "/b"]))
        assert [r.rule_id for r in rs.candidates(req) if r.matches(req)] == \
            [r.rule_id for r in plain if r.matches(req)]
    # 1,000 rules on other tasks' prefixes: a request meets none of them
    big = RuleSet()
    for i in range(1000):
        big[f"o{i}"] = Rule(rule_id=f"o{i}", bucket="b", key_prefix=f"w/t{i:04d}/")
    assert [r.rule_id for r in big.candidates(S3Request.parse("GET", "/b/w/t0007/journal/1"))] == ["o7"]
    assert big.candidates(S3Request.parse("GET", "/b/w/zzz/k")) == []


# ---------------------------------------------------------------- fuzz: parser and rule API (hypothesis)
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                     max_leaves=10)
_targets = st.one_of(st.text(max_size=80), st.builds(
    lambda b, k, q: f"/{b}/{k}?{q}", st.text(max_size=10), st.text(max_size=30),
    st.sampled_from(["", "uploads", "uploadId=u&partNumber=3", "partNumber=²", "list-type=2&prefix=w%2F", "delete",
                     "uploadId=", "partNumber=99999999999999999999"])))


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["GET", "PUT", "POST", "DELETE", "HEAD", "PATCH", "", "G ET"]), _targets)
def test_the_request_parser_never_raises_anything_but_value_error(method, target):
    try:
        req = S3Request.parse(method, target)
    except ValueError:
        return
    assert isinstance(req.op, str) and isinstance(req.target_key, str)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(["rule_id", "action", "status", "code", "methods", "ops", "bucket",
                                        "key_prefix", "part", "ratio", "seed", "duration_s", "max_hits", "codes",
                                        "latency_ms", "bandwidth_bps", "reset_after", "lag_s", "nth", "variant",
                                        "hold_s", "fault", "bogus"]), _json, max_size=8),
       st.sampled_from(["GET", "PUT", "POST"]), _targets)
def test_a_rule_the_api_accepts_never_crashes_the_relay(spec, method, target):
    """Through the control API: any JSON body is either refused (4xx, named) or a rule that matching, drawing
    and answering can use on any request without raising."""
    import orjson

    p = FaultProxy("127.0.0.1", 1, None)
    spec.setdefault("rule_id", "r")
    try:
        body = orjson.dumps(spec)
    except TypeError:
        return
    try:
        status, out = p.dispatch("POST", "/rules", body)
    except (ValueError, TypeError) as exc:  # the control handler answers these as 400 with the message
        assert str(exc)
        return
    assert status == 201, out
    try:
        req = S3Request.parse(method, target)
    except ValueError:
        return
    for rule in p.rules.candidates(req):
        if rule.matches(req) and rule.draw():
            rule.answer_code()
            rule.delay_s()
            error_response(rule, req, close=False)
        rule.public()


def test_windows_hits_and_lags_run_on_one_injectable_clock(monkeypatch):
    """A window opened by a request and a read-after-write lag, stepped with a fake clock (no sleeping)."""
    import storage.proxy.rules as px

    now = [1000.0]
    monkeypatch.setattr(px, "clock", lambda: now[0])
    rule = Rule(rule_id="w", key_prefix="a/", duration_s=2.0)
    assert rule.first_hit_at is None and rule.draw() and rule.first_hit_at == 1000.0  # opened by the request
    now[0] += 1.9
    assert rule.draw() and not rule.expired()
    now[0] += 0.2
    assert rule.expired() and not rule.draw() and rule.hits == 2 and rule.matched == 3
    p = FaultProxy("127.0.0.1", 1, None)
    p.dispatch("POST", "/rules", b'{"rule_id": "lag", "action": "lag", "lag_s": 1.5, "bucket": "b"}')
    p._lag_note(S3Request.parse("PUT", "/b/a/k"), 200)
    assert p._lagging(S3Request.parse("GET", "/b/a/k")) is not None
    now[0] += 1.6
    assert p._lagging(S3Request.parse("GET", "/b/a/k")) is None


def test_actions_are_a_registry_the_relay_dispatches_to(monkeypatch, tmp_path):
    """Each action is a class in ACTIONS: a new one answers hits with no change to the relay. Through a real proxy on
    127.0.0.1 in front of a tiny upstream: an `error` hit answers 503 and the kept-alive connection serves the next
    request (NEXT), which the upstream answers; a `delay` hit is still relayed and logged with its delay; a class
    registered here (`teapot`) answers its hits, and its rule is accepted only once it is registered."""
    import asyncio

    import orjson

    from storage import proxy as px

    class Teapot(px.Action):
        name = "teapot"

        async def hit(self, h):
            h.cwriter.write(b"HTTP/1.1 418 I'm a teapot\r\nContent-Length: 0\r\n\r\n")
            await h.cwriter.drain()
            h.proxy.record(**h.base, status=418, rule=h.rule.rule_id, fault=None)
            return px.NEXT

    with pytest.raises(ValueError, match="rule.action='teapot'"):
        Rule(rule_id="t", action="teapot")
    monkeypatch.setitem(px.ACTIONS, "teapot", Teapot())
    assert {a.name for a in px.ACTIONS.values()} >= {"error", "cut_body", "reset", "hold", "delay", "lag",
                                                      "boundary", "teapot"}
    assert [n for n, a in px.ACTIONS.items() if not a.drawn] == ["boundary", "lag"]

    async def main():
        seen = []

        async def upstream(r, w):
            while True:
                head = await px.read_head(r)
                if head is None:
                    break
                seen.append(head.start)
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await w.drain()
            w.close()

        up = await asyncio.start_server(upstream, "127.0.0.1", 0)
        proxy = FaultProxy("127.0.0.1", up.sockets[0].getsockname()[1], str(tmp_path / "log.jsonl"))
        front = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
        proxy.rules["e"] = Rule(rule_id="e", key_prefix="err/", max_hits=1)
        proxy.rules["d"] = Rule(rule_id="d", action="delay", key_prefix="slow/", latency_ms=[5, 5])
        proxy.rules["t"] = Rule(rule_id="t", action="teapot", key_prefix="tea/")
        r, w = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
        answers = []
        for key in ("err/a", "err/a", "slow/b", "tea/c", "plain/d"):
            w.write(f"GET /bkt/{key} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await w.drain()
            head = await px.read_head(r)
            await r.readexactly(head.length or 0)
            answers.append(int(head.start.split()[1]))
        w.close()
        front.close()
        up.close()
        proxy.flush_log()
        return answers, seen

    answers, seen = asyncio.run(main())
    assert answers == [503, 200, 200, 418, 200]  # one connection throughout: each hit went on to the next request
    assert [s.split()[1] for s in seen] == ["/bkt/err/a", "/bkt/slow/b", "/bkt/plain/d"]  # hits never forwarded
    log = [orjson.loads(x) for x in (tmp_path / "log.jsonl").read_bytes().splitlines()]
    slow = next(e for e in log if e["key"] == "slow/b")
    assert slow["rule"] == "d" and slow["status"] == 200 and slow["delay_ms"] == 5.0
