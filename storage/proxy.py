"""S3 fault proxy: a head-only HTTP/1.1 relay on 127.0.0.1 in front of the store.

Request and response bodies are streamed in bounded chunks in both directions
(never buffered whole), the request head is forwarded byte for byte (Host
unchanged, so SigV4 signatures stay valid), and the upstream's 1xx answers are
relayed (botocore sends `Expect: 100-continue` on PUT). Every request is
recorded as one JSON line. Fault windows are *rules* opened and closed through a
small JSON control API on a second port; a rule matches requests by method,
bucket, key prefix and part number, and applies its action: one `Action` class each
(`error`, `cut_body`, `reset`, `hold`, `delay`, `lag`, `boundary`), registered in `ACTIONS`;
a new one is a class, not a branch of the relay.

Run as `python -m storage.proxy --upstream 127.0.0.1:PORT --log FILE`; it prints
one line `READY <port> <control_port>` when both listeners are up. Where the
compiled relay is installed (`relay/`, storage/relay.py) the relay owns the port:
it relays plain requests itself while no rule is open, logging them as this
proxy would, and hands every other connection's socket here.
"""
from __future__ import annotations

import argparse
import asyncio
import hmac
import math
import os
import secrets
import random
import re
import select
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field

import orjson

from storage import relay
from storage.process import stop_process
from storage.quota import Quota, delete_keys, not_deleted

MAX_LOGGED_KEYS = 1000  # a DeleteObjects names at most 1,000 keys (the S3 API's own bound)
CHUNK = 256 * 1024
# The proxy's one clock: rule windows (time-triggered or opened by a request), hits and lags all read it, and
# every timestamp it logs comes from it. Tests inject their own (`proxy.clock = fake`) to step windows.
clock = time.time
MAX_HEAD = 64 * 1024
# The embedded store (SeaweedFS) stores `a//b` as `a/b` and `/a` as `a`: with this set (`--merge-slashes`, the
# harness sets it for the embedded store) a key is matched and logged as the store will hold it, so a rule on
# `wave/task/` meets `wave//task/x` and the audit finds the logged write of every object. Other stores keep keys.
MERGE_SLASHES = False
LOG_FLUSH_S = 0.01  # the request log is written in batches this often
SMALL_BODY = 64 * 1024  # responses up to this size are sent with their head in one write
HOLD_MAX = 1024 * 1024  # request bodies up to this size are held whole before the store sees the request
ROUTE_MAX = 150 * 1024  # the relay is told at most this many bytes of slots (one SOCK_SEQPACKET packet), else all


# --------------------------------------------------------------------------- rules
@dataclass
class S3Request:
    """What a rule can match on, parsed from a path-style request head."""

    method: str
    bucket: str
    key: str
    part: int | None
    upload_id: str | None
    list_prefix: str | None = None  # `prefix` of a bucket-level listing (ListObjectsV2, ListMultipartUploads)
    flags: frozenset = frozenset()  # query parameter names (uploads, delete, list-type, ...)

    @property
    def op(self) -> str:
        """The S3 operation name (what a rule's `ops` matches), from the method, path and query."""
        m, f = self.method, self.flags
        if not self.key:
            if m == "GET":
                return ("ListMultipartUploads" if "uploads" in f else "ListObjectsV2" if "list-type" in f
                        else "ListObjects")
            if m == "POST" and "delete" in f:
                return "DeleteObjects"
            return {"HEAD": "HeadBucket", "PUT": "CreateBucket", "DELETE": "DeleteBucket"}.get(m, m)
        if m == "PUT":
            return "UploadPart" if self.part is not None and self.upload_id else "PutObject"
        if m == "POST":
            return ("CreateMultipartUpload" if "uploads" in f else "CompleteMultipartUpload" if self.upload_id
                    else "PostObject")
        if m == "DELETE":
            return "AbortMultipartUpload" if self.upload_id else "DeleteObject"
        if m == "GET":
            return "ListParts" if self.upload_id else "GetObject"
        return {"HEAD": "HeadObject"}.get(m, m)

    @property
    def target_key(self) -> str:
        """The key a rule's key_prefix is matched against: the object key, or a listing's prefix."""
        return self.key if self.key else (self.list_prefix or "")

    @classmethod
    def parse(cls, method: str, target: str) -> "S3Request":
        parts = urllib.parse.urlsplit(target)
        path = urllib.parse.unquote(parts.path)
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
        segs = path.lstrip("/").split("/", 1)
        bucket = segs[0] if segs and segs[0] else ""
        key = segs[1] if len(segs) > 1 else ""
        if MERGE_SLASHES and "/" in key:
            key = re.sub("/{2,}", "/", key).lstrip("/")
        part = query.get("partNumber", [None])[0]
        return cls(method=method, bucket=bucket, key=key,
                   part=int(part) if part and part.isdecimal() and len(part) < 10 else None,
                   upload_id=query.get("uploadId", [None])[0],
                   list_prefix=query.get("prefix", [None])[0] if not key else None, flags=frozenset(query))


@dataclass
class Rule:
    """One open fault window in the proxy. `ratio` is the share of matching requests hit."""

    rule_id: str
    action: str = "error"
    status: int = 503
    code: str = "ServiceUnavailable"
    message: str = "Service is unavailable (sandfleet fault window)"
    methods: list[str] | None = None
    bucket: str | None = None
    key_prefix: str | None = None
    part: int | None = None
    ratio: float = 1.0
    seed: int = 0
    duration_s: float | None = None  # window opens at the first matching request and lasts this long
    max_hits: int | None = None  # the rule stops hitting after this many hits
    hold_s: float = 0.5  # cut_body: how long the store's connection stays open with the head only
    nth: int = 1  # boundary: the Nth write the store answered 2xx is the boundary
    variant: str = "after"  # boundary: "ambiguous" holds that answer from the client; "after" delivers it
    counted: int = 0  # boundary: 2xx writes seen so far
    ops: list[str] | None = None  # S3 operation names (S3Request.op), e.g. ["UploadPart"]
    codes: list | None = None  # error: [[status, code], ...] drawn (seeded) per hit instead of status/code
    latency_ms: list | None = None  # delay: [lo, hi] added before the store sees the request (seeded jitter)
    bandwidth_bps: int | None = None  # delay: bytes/s shared by every request in the window, each direction
    reset_after: int = 0  # reset: body bytes forwarded to the store before both connections are reset
    lag_s: float = 1.0  # lag: how long an object written in the window reads as missing after its write
    fault: str | None = None
    opened_at: float = field(default_factory=lambda: clock())
    matched: int = 0
    hits: int = 0
    first_hit_at: float | None = None
    last_hit_at: float | None = None
    hit_keys: list = field(default_factory=list)

    _TYPES = {"rule_id": (str,), "action": (str,), "status": (int,), "code": (str,), "message": (str,),
              "bucket": (str, type(None)), "key_prefix": (str, type(None)), "part": (int, type(None)),
              "ratio": (int, float), "seed": (int,), "duration_s": (int, float, type(None)),
              "max_hits": (int, type(None)), "hold_s": (int, float), "nth": (int,), "variant": (str,),
              "reset_after": (int,), "lag_s": (int, float), "bandwidth_bps": (int, type(None)),
              "fault": (str, type(None))}

    def __post_init__(self):
        """Every field is checked here: a rule that is accepted can never crash the relay's hot path."""
        for name, types in self._TYPES.items():
            v = getattr(self, name)
            if not isinstance(v, types) or isinstance(v, bool) or (isinstance(v, float) and not math.isfinite(v)):
                raise ValueError(f"rule.{name}={v!r} must be {' or '.join(t.__name__ for t in types)}")
        for name in ("methods", "ops"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
                raise ValueError(f"rule.{name}={v!r} must be a list of strings or null")
        if not self.rule_id or len(self.rule_id) > 200:
            raise ValueError("rule.rule_id must be 1-200 characters")
        if not 100 <= self.status <= 599:
            raise ValueError(f"rule.status={self.status!r} must be an HTTP status (100-599)")
        if self.nth < 1 or (self.max_hits is not None and self.max_hits < 0) or self.hold_s < 0:
            raise ValueError("rule.nth must be >= 1, rule.max_hits and rule.hold_s >= 0")
        if self.latency_ms is not None and not (isinstance(self.latency_ms, list) and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                for x in self.latency_ms)):
            raise ValueError(f"rule.latency_ms={self.latency_ms!r} must be [lo, hi] ms")
        if self.action not in ACTIONS:
            raise ValueError(f"rule.action={self.action!r} is not one of {sorted(ACTIONS)}")
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"rule.ratio={self.ratio!r} must be within [0, 1]")
        if self.variant not in ("after", "ambiguous"):
            raise ValueError(f"rule.variant={self.variant!r} must be 'after' or 'ambiguous'")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"rule.duration_s={self.duration_s!r} must be > 0 or null")
        if self.codes is not None and not (self.codes and all(
                isinstance(c, (list, tuple)) and len(c) == 2 and isinstance(c[0], int) and 400 <= c[0] <= 599
                and isinstance(c[1], str) for c in self.codes)):
            raise ValueError(f"rule.codes={self.codes!r} must be a non-empty list of [status 4xx/5xx, code]")
        if self.latency_ms is not None and not (len(self.latency_ms) == 2 and
                                                0 <= self.latency_ms[0] <= self.latency_ms[1] <= 600000):
            raise ValueError(f"rule.latency_ms={self.latency_ms!r} must be [lo, hi] ms with 0 <= lo <= hi")
        if self.bandwidth_bps is not None and self.bandwidth_bps < 1024:
            raise ValueError(f"rule.bandwidth_bps={self.bandwidth_bps!r} must be >= 1024 or null")
        if self.lag_s < 0 or self.reset_after < 0:
            raise ValueError("rule.lag_s and rule.reset_after must be >= 0")
        self._rng = random.Random(self.seed)
        self._buckets: tuple | None = None
        self.visible_at: dict[str, float] = {}  # lag: key -> when it stops reading as missing

    def answer_code(self) -> tuple[int, str]:
        """The error this hit answers with: `codes` drawn per hit, else the rule's status and code."""
        if self.codes:
            status, code = self._rng.choice(self.codes)
            return int(status), str(code)
        return self.status, self.code

    def delay_s(self) -> float:
        lo, hi = self.latency_ms or (0, 0)
        return self._rng.uniform(lo, hi) / 1000.0

    def buckets(self) -> tuple:
        """(up, down) token buckets shared by every request this rule delays."""
        if self._buckets is None:
            self._buckets = (TokenBucket(self.bandwidth_bps), TokenBucket(self.bandwidth_bps)) \
                if self.bandwidth_bps else (None, None)
        return self._buckets

    def matches(self, req: S3Request) -> bool:
        if self.methods and req.method not in self.methods:
            return False
        if self.bucket is not None and req.bucket != self.bucket:
            return False
        if self.key_prefix is not None and not req.target_key.startswith(self.key_prefix):
            return False
        if self.part is not None and req.part != self.part:
            return False
        if self.ops and req.op not in self.ops:
            return False
        return True

    def expired(self, now: float | None = None) -> bool:
        return (self.duration_s is not None and self.first_hit_at is not None
                and (now or clock()) >= self.first_hit_at + self.duration_s)

    def draw(self) -> bool:
        """Count the match and decide (seeded) whether this request is hit."""
        self.matched += 1
        if self.expired() or (self.max_hits is not None and self.hits >= self.max_hits):
            return False
        hit = self.ratio >= 1.0 or self._rng.random() < self.ratio
        if hit:
            now = clock()
            self.hits += 1
            self.first_hit_at = self.first_hit_at or now
            self.last_hit_at = now
        return hit

    def note_key(self, key: str) -> None:
        """One of the first 20 keys this rule hit (its receipt names them)."""
        if len(self.hit_keys) < 20:
            self.hit_keys.append(key)

    def public(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if not k.startswith("_") and k != "visible_at"}
        out["expired"] = self.expired()
        return out


class RuleSet(dict):
    """The open rules (rule_id -> Rule), indexed so a request only meets rules that could match it: a rule
    whose bucket and key prefix pin the key's first two segments (`wave/task/...`) sits in that slot; others
    are checked for every request. The cost per request does not grow with rules on other tasks' prefixes."""

    def __init__(self):
        super().__init__()
        self._slots: dict[tuple, dict[str, Rule]] = {}
        self._wide: dict[str, Rule] = {}
        self._order: dict[str, int] = {}
        self._n = 0
        self.lag: dict[str, Rule] = {}

    @staticmethod
    def _slot(bucket: str | None, prefix: str | None) -> tuple | None:
        if bucket is None or not prefix:
            return None
        segs = prefix.split("/", 2)
        return (bucket, segs[0], segs[1]) if len(segs) == 3 else None

    def __setitem__(self, rid: str, rule: Rule) -> None:
        super().__setitem__(rid, rule)
        self._n += 1
        self._order[rid] = self._n
        slot = self._slot(rule.bucket, rule.key_prefix)
        (self._slots.setdefault(slot, {}) if slot else self._wide)[rid] = rule
        if rule.action == "lag":
            self.lag[rid] = rule

    def pop(self, rid: str, default=None):
        rule = super().pop(rid, None)
        if rule is None:
            return default
        slot = self._slot(rule.bucket, rule.key_prefix)
        if slot:
            self._slots.get(slot, {}).pop(rid, None)
            if not self._slots.get(slot):
                self._slots.pop(slot, None)
        else:
            self._wide.pop(rid, None)
        self._order.pop(rid, None)
        self.lag.pop(rid, None)
        return rule

    def route(self) -> bytes:
        """What the compiled relay must hand over (storage/relay.py): b"0" nothing (no rule open), b"1" every
        request (a rule not pinned to a slot, or a lag window: any request may meet it), else b"S" and the slots
        (`bucket/seg0/seg1`, one a line): only a request in one of them may meet a rule."""
        if not self:
            return b"0"
        if self._wide or self.lag:
            return b"1"
        slots = ["/".join(slot) for slot in self._slots]
        if any(len(slot.split("/")) != 3 or "\n" in slot for slot in slots):
            return b"1"  # a bucket or segment the line format cannot carry: the safe side
        try:
            data = b"S" + "\n".join(slots).encode()
        except UnicodeEncodeError:
            return b"1"
        return data if len(data) <= ROUTE_MAX else b"1"

    def candidates(self, req: "S3Request") -> list[Rule]:
        """The rules that could match `req`, in the order they were opened."""
        slot = self._slot(req.bucket, req.target_key)
        got = list(self._wide.values())
        if slot and slot in self._slots:
            got += self._slots[slot].values()
        if len(got) > 1:
            got.sort(key=lambda r: self._order.get(r.rule_id, 0))
        return got


class TokenBucket:
    """A bandwidth cap shared by concurrent streams: `take(n)` waits until n bytes fit the rate."""

    def __init__(self, rate_bps: float):
        self.rate = float(rate_bps)
        self.next_free = time.monotonic()
        self.waited_s = 0.0  # total time streams waited for the cap (the proxy's evidence that it applied)

    async def take(self, n: int) -> None:
        now = time.monotonic()
        start = max(now, self.next_free)
        self.next_free = start + n / self.rate
        if self.next_free - now > 0.001:
            self.waited_s += self.next_free - now
            await asyncio.sleep(self.next_free - now)


def _error_body(rule: Rule, req: S3Request, code: str | None = None) -> bytes:
    resource = f"/{req.bucket}/{req.key}" if req.key else f"/{req.bucket}"
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code or rule.code}</Code><Message>{rule.message}</Message>"
        f"<Resource>{resource}</Resource><RequestId>sandfleet-{rule.rule_id}</RequestId></Error>"
    ).encode()


_REASONS = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 500: "Internal Server Error",
            503: "Service Unavailable", 429: "Too Many Requests", 411: "Length Required", 501: "Not Implemented"}


def _xml_error(code: str, message: str, req: S3Request, request_id: str) -> bytes:
    esc = {ord("<"): "&lt;", ord(">"): "&gt;", ord("&"): "&amp;"}
    resource = f"/{req.bucket}/{req.key}" if req.key else f"/{req.bucket}"
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message.translate(esc)}</Message>"
            f"<Resource>{resource.translate(esc)}</Resource><RequestId>{request_id}</RequestId></Error>").encode()


def error_response(rule: Rule, req: S3Request, close: bool, answer: tuple[int, str] | None = None) -> bytes:
    status, code = answer or (rule.status, rule.code)
    body = _error_body(rule, req, code)
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"x-amz-request-id: sandfleet-{rule.rule_id}\r\n"
        f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
    ).encode()
    return head + (b"" if req.method == "HEAD" else body)


# The harness's own end-to-end probe of the path to the proxy (from a sandbox node, through the head's gate): answered
# by the proxy itself, never forwarded nor logged (it is no request of any task's)
HEALTH_PATH = "/.sandfleet/health"
HEALTH_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


def bad_request(why: str) -> bytes:
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>BadRequest</Code><Message>'
            f"{why[:200].replace('<', ' ').replace('&', ' ')}</Message></Error>").encode()
    return (f"HTTP/1.1 400 Bad Request\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


CLOSE, NEXT = "close", "next"  # what an action did with its hit: the connection ends / reads its next request


@dataclass
class Hit:
    """A request a rule hit, as its action sees it (`t0`: when its head was read)."""
    proxy: "FaultProxy"
    head: "Head"
    req: S3Request
    rule: Rule
    creader: asyncio.StreamReader
    cwriter: asyncio.StreamWriter
    base: dict


@dataclass
class Shaping:
    """A hit that is still relayed to the store: after `delay_s`, through its rule's shared token buckets."""
    rule: Rule
    delay_s: float
    up: "TokenBucket | None"
    down: "TokenBucket | None"
    waited0: float

    def extra(self) -> dict:
        waited = sum(b.waited_s for b in (self.up, self.down) if b is not None) - self.waited0
        return {"delay_ms": round(self.delay_s * 1000, 3), "throttle_wait_ms": round(waited * 1000, 3)}


class Action:
    """How a hit request is answered: one class per action, registered in `ACTIONS` by its `name`. `params` are the
    rule fields it reads (its parameters; `Rule` checks every field's type). `drawn`: the proxy draws the rule per
    matching request (`FaultProxy.match`) and calls `hit`, which returns CLOSE, NEXT, or a `Shaping` (relay it,
    shaped). A rule that is not drawn is watched elsewhere in the relay (`boundary`, `lag`)."""

    name = ""
    params: tuple[str, ...] = ()
    drawn = True

    async def hit(self, h: Hit) -> "str | Shaping":
        raise NotImplementedError(self.name)


class ErrorAnswer(Action):
    """ST1 and kin: an S3 error (status and code, or `codes` drawn per hit) in place of the store's answer; the
    request's body is read and dropped (or never sent: a 100-continue is refused), the connection goes on."""

    name, params = "error", ("status", "code", "message", "codes")

    def answer(self, rule: Rule) -> tuple[int, str]:
        return rule.answer_code()

    async def hit(self, h: Hit) -> str:
        answer = self.answer(h.rule)
        expect = h.head.get("expect").lower() == "100-continue"
        try:
            req_bytes = 0 if expect else await copy_body(h.creader, None, h.head)
        except BadFraming as exc:  # refused and logged as any request framed otherwise
            await h.proxy._refuse_bad(h.cwriter, h.req.method, str(exc))
            return CLOSE
        h.cwriter.write(error_response(h.rule, h.req, close=expect, answer=answer))
        await h.cwriter.drain()
        h.rule.note_key(h.req.target_key)
        h.proxy.record(**h.base, status=answer[0], code=answer[1], req_bytes=req_bytes, resp_bytes=0,
                       rule=h.rule.rule_id, fault=h.rule.fault, ms=round((clock() - h.base["t"]) * 1000, 3))
        return CLOSE if expect else NEXT


class Lag(ErrorAnswer):
    """ST7: an object written in the window reads as missing (404 NoSuchKey) for `lag_s` after its write, and
    listings leave it out (`FaultProxy._lagging`, `_listing_lag`)."""

    name, params, drawn = "lag", ("lag_s",), False

    def answer(self, rule: Rule) -> tuple[int, str]:
        return 404, "NoSuchKey"


class CutBody(Action):
    """ST6: the store gets the head and never the body (`FaultProxy._cut`)."""

    name, params = "cut_body", ("hold_s",)

    async def hit(self, h: Hit) -> str:
        await h.proxy._cut(h.head, h.req, h.rule, h.creader, h.cwriter, h.base)
        return CLOSE


class Reset(Action):
    """ST4: `reset_after` body bytes reach the store, then both connections are reset (`FaultProxy._reset`)."""

    name, params = "reset", ("reset_after",)

    async def hit(self, h: Hit) -> str:
        await h.proxy._reset(h.head, h.req, h.rule, h.creader, h.cwriter, h.base)
        return CLOSE


class Hold(Action):
    """PK1 `at_request`: the request is held (never forwarded) until the rule closes, then dropped, so a kill lands
    while that transfer is provably in flight."""

    name = "hold"

    async def hit(self, h: Hit) -> str:
        h.rule.note_key(f"{h.req.op} {h.req.target_key}")
        ev = h.proxy.released.setdefault(h.rule.rule_id, asyncio.Event())
        try:
            await asyncio.wait_for(ev.wait(), 60)
        except asyncio.TimeoutError:
            pass
        h.cwriter.transport.abort()  # never forwarded: the store never sees the held request
        h.proxy.record(**h.base, op=h.req.op, status=None, req_bytes=0, resp_bytes=0, rule=h.rule.rule_id,
                       fault=h.rule.fault, held=True, aborted=True, ms=round((clock() - h.base["t"]) * 1000, 3))
        return CLOSE


class Delay(Action):
    """ST5: seeded latency before the store sees the request, and a bandwidth cap shared by the window's requests."""

    name, params = "delay", ("latency_ms", "bandwidth_bps")

    async def hit(self, h: Hit) -> Shaping:
        delay_s = h.rule.delay_s()
        await asyncio.sleep(delay_s)
        up, down = h.rule.buckets()
        h.rule.note_key(h.req.target_key)
        return Shaping(h.rule, delay_s, up, down, sum(b.waited_s for b in (up, down) if b is not None))


class Boundary(Action):
    """PK1 at a store write: counts the 2xx writes it matches; at the `nth` the task's traffic is held until the rule
    closes (`variant` `after`: the answer is delivered first; `ambiguous`: it never is) (`FaultProxy._boundary`)."""

    name, params, drawn = "boundary", ("nth", "variant"), False


ACTIONS: dict[str, Action] = {a.name: a() for a in (ErrorAnswer, CutBody, Boundary, Reset, Delay, Lag, Hold)}
WRITES = ("PUT", "POST", "DELETE")


# --------------------------------------------------------------------------- HTTP helpers
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 5.6.2: a method, a field name
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) ([\x21-\x7e]+) HTTP/1\.[01]")
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # in a field value: any control byte but HTAB


def framing_problem(raw: bytes) -> str | None:
    """Why a request head must be refused (RFC 9112 2.2, 3, 5.1, 5.2, 6.1), or None. Each is a head that another
    HTTP/1.1 reader (SeaweedFS is Go's net/http) may frame otherwise than this proxy and the relay do, so bytes the
    log calls a body would reach the store as a request: an obs-fold line (Go folds it into the previous field), a
    bare CR or LF (Go ends a line, or the head, there), a field name that is not a token (`Content-Length :`), a
    line with no colon, lengths that disagree, a length with a transfer coding, a coding other than `chunked`."""
    body = raw[:-4] if raw.endswith(b"\r\n\r\n") else raw
    if b"\r" in body.replace(b"\r\n", b"") or b"\n" in body.replace(b"\r\n", b""):
        return "a bare CR or LF in the head: every line ends in CRLF"
    lines = body.split(b"\r\n")
    if not _REQUEST_LINE.fullmatch(lines[0]):
        return "the request line must be: a method, one space, a /target, one space, the HTTP version"
    lengths, codings = set(), []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            return "a header line starts with whitespace (obs-fold, RFC 9112 5.2): refused"
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            return f"header name {name[:40].decode('latin-1')!r} is not a token followed by a colon"
        value = value.strip(b" \t")
        if _CTL.search(value):
            return f"header {name[:40].decode('latin-1')!r} holds a control byte"
        lname = name.lower()
        if lname == b"content-length":
            if not (value.isdigit() and len(value) < 19):
                return f"Content-Length {value[:40].decode('latin-1')!r} is not a decimal number"
            lengths.add(int(value))
        elif lname == b"transfer-encoding":
            codings.append(value)
    if len(lengths) > 1:
        return "Content-Length given twice with different values"
    if codings and lengths:
        return "Content-Length and Transfer-Encoding together (RFC 9112 6.1)"
    if codings and (len(codings) > 1 or codings[0].lower() != b"chunked"):
        return "Transfer-Encoding other than exactly `chunked`"
    return None


class Head:
    def __init__(self, raw: bytes):
        self.raw = raw
        lines = raw.decode("latin-1").split("\r\n")
        self.start = lines[0]
        self.headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()

    def get(self, name: str, default: str = "") -> str:
        return self.headers.get(name, default)

    @property
    def chunked(self) -> bool:
        return self.get("transfer-encoding").lower() == "chunked"

    @property
    def length(self) -> int | None:
        v = self.get("content-length")
        return int(v) if v.isdecimal() and len(v) < 19 else None


async def read_head(reader: asyncio.StreamReader) -> Head | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise ConnectionError("connection closed inside an HTTP head") from exc
        return None
    except asyncio.LimitOverrunError as exc:
        raise ConnectionError("HTTP head too large") from exc
    return Head(raw)


_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})(;[\x09\x20-\x7e]*)?\r\n")


class BadFraming(ConnectionError):
    """A chunked body whose framing another HTTP/1.1 reader may take otherwise: the connection ends here."""


async def copy_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None,
                    head: Head, until_eof: bool = False, throttle: "TokenBucket | None" = None) -> int:
    """Relay one message body (Content-Length, chunked, or until EOF); returns body bytes.

    With `writer=None` the body is read and discarded; `throttle` caps the rate (ST2).
    """
    total = 0

    async def put(data: bytes):
        if throttle is not None:
            await throttle.take(len(data))
        if writer is not None:
            writer.write(data)
            await writer.drain()

    if head.chunked:  # strict (RFC 9112 7.1): a size line, data and trailers the store could read otherwise end it
        while True:
            line = await reader.readuntil(b"\r\n")
            m = _CHUNK_SIZE.fullmatch(line)
            if m is None:
                raise BadFraming(f"chunk size line {line[:40]!r} is not hex digits (and an extension) then CRLF")
            await put(line)
            size = int(m.group(1), 16)
            if size == 0:
                while True:  # trailers up to the empty line
                    trailer = await reader.readuntil(b"\r\n")
                    if trailer != b"\r\n" and framing_problem(b"GET / HTTP/1.1\r\n" + trailer + b"\r\n") is not None:
                        raise BadFraming(f"trailer line {trailer[:40]!r} is not a field line")
                    await put(trailer)
                    if trailer == b"\r\n":
                        return total
            remaining = size
            while remaining:
                data = await reader.read(min(CHUNK, remaining))
                if not data:
                    raise ConnectionError("connection closed inside a chunk")
                remaining -= len(data)
                await put(data)
            if await reader.readexactly(2) != b"\r\n":
                raise BadFraming("a chunk's data is not followed by CRLF")
            await put(b"\r\n")
            total += size
    length = head.length
    if length is not None:
        remaining = length
        while remaining:
            data = await reader.read(min(CHUNK, remaining))
            if not data:
                raise ConnectionError("connection closed inside a body")
            remaining -= len(data)
            total += len(data)
            await put(data)
        return total
    if until_eof:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                return total
            total += len(data)
            await put(data)
    return 0


_AKID = re.compile(r"Credential=([A-Za-z0-9]{8,128})/")
_AKID_Q = re.compile(r"[?&]X-Amz-Credential=([A-Za-z0-9]{8,128})(?:%2F|/)")


def access_key_id(authorization: str, target: str) -> str | None:
    """The SigV4 access key id that signed the request (header or presigned query): who wrote what. The id
    alone is not a secret; it lets the grader attribute every request to the attempt whose key it was."""
    m = _AKID.search(authorization or "") or _AKID_Q.search(target or "")
    return m.group(1) if m else None


def _xml_unescape(s: str) -> str:
    return s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&apos;", "'").replace(
        "&amp;", "&")


# --------------------------------------------------------------------------- proxy
class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int, log_path: str | None, quota: Quota | None = None):
        self.upstream = (upstream_host, upstream_port)
        self.rules = RuleSet()
        self.closed_rules: list[dict] = []
        self.log_path = log_path
        self.log = open(log_path, "ab") if log_path else None
        self.counts = {"requests": 0, "faulted": 0}
        self.port = 0
        self.control_port = 0
        self.token = os.environ.get("SANDFLEET_PROXY_TOKEN") or None
        self.released: dict[str, asyncio.Event] = {}  # boundary rules: set when the rule is closed
        self._pending: list[bytes] = []
        self.relay: relay.Relay | None = None  # the compiled front, when it owns the port (storage/relay.py)
        self._adopted: set[asyncio.Task] = set()
        self.quota = quota  # the store's per-task quota (storage/quota.py): None = no bound

    @staticmethod
    async def _upstream_head(ureader, uwriter, body_task) -> Head:
        """The upstream's next response head; if the client dies while its body is being relayed, the
        upstream request is aborted at once (never left open to land later)."""
        if body_task.done() and body_task.exception() is None:  # the common case: read the answer directly
            rhead = await read_head(ureader)
            if rhead is None:
                raise ConnectionError("upstream closed before answering")
            return rhead
        head_task = asyncio.ensure_future(read_head(ureader))
        done, _ = await asyncio.wait({head_task, body_task}, return_when=asyncio.FIRST_COMPLETED)
        if head_task not in done and body_task.done() and body_task.exception() is not None:
            head_task.cancel()
            uwriter.transport.abort()
            raise ConnectionError("the client died while its body was relayed; upstream request aborted")
        rhead = await head_task
        if rhead is None:
            raise ConnectionError("upstream closed before answering")
        return rhead

    async def _cut(self, head: Head, req: S3Request, rule: Rule, creader, cwriter, base: dict) -> None:
        """ST6, a request cut after its head: the store gets the head and never the body, its connection
        stays open `hold_s` and is then closed; the client's connection is reset at once (as when the writer
        or the network dies mid-request). SeaweedFS then stores an EMPTY object under the key, even over a
        newer complete write (docs/store-hazards.md)."""
        t0 = base["t"]
        rule.note_key(req.target_key)
        cwriter.transport.abort()  # the writer is gone; it never sends its body
        uw = None
        try:
            _, uw = await asyncio.open_connection(*self.upstream, limit=MAX_HEAD)
            # without `Expect: 100-continue` the store takes the body as coming right after the head
            lines = head.raw.split(b"\r\n")
            uw.write(b"\r\n".join(l for l in lines if not l.lower().startswith(b"expect:")))
            await uw.drain()
            await asyncio.sleep(rule.hold_s)
        except OSError:
            pass
        finally:
            if uw is not None:
                uw.close()
        self.record(**base, status=None, req_bytes=0, resp_bytes=0, rule=rule.rule_id, fault=rule.fault,
                    cut=True, withheld=head.length, ms=round((clock() - t0) * 1000, 3))

    def match(self, req: S3Request) -> Rule | None:
        for rule in self.rules.candidates(req):
            if ACTIONS[rule.action].drawn and rule.matches(req) and rule.draw():
                return rule
        return None

    def _boundary_rules(self, req: S3Request) -> list[Rule]:
        return [r for r in self.rules.candidates(req) if r.action == "boundary" and r.matches(req)]

    def _lagging(self, req: S3Request) -> Rule | None:
        """ST7: a read of an object written in a lag window less than `lag_s` ago answers as missing."""
        if req.method not in ("GET", "HEAD") or not req.key or req.upload_id:
            return None
        now = clock()
        for rule in self.rules.lag.values():
            if rule.visible_at.get(f"{req.bucket}/{req.key}", 0) > now:
                rule.matched += 1
                rule.hits += 1
                rule.first_hit_at = rule.first_hit_at or now
                rule.last_hit_at = now
                rule.note_key(req.key)
                return rule
        return None

    def _lag_note(self, req: S3Request, status: int) -> None:
        """A write the store answered 2xx under a lag rule starts that object's lag."""
        if not 200 <= status < 300 or req.op not in ("PutObject", "CompleteMultipartUpload", "CopyObject"):
            return
        for rule in self.rules.lag.values():
            if rule.matches(req) and not rule.expired():
                rule.visible_at[f"{req.bucket}/{req.key}"] = clock() + rule.lag_s

    def _listing_lag(self, req: S3Request) -> list[Rule]:
        if req.op not in ("ListObjectsV2", "ListObjects"):
            return []
        now = clock()
        return [r for r in self.rules.lag.values()
                if any(t > now and k.startswith(f"{req.bucket}/{req.list_prefix or ''}")
                        for k, t in r.visible_at.items())]

    @staticmethod
    def _strip_listing(body: bytes, bucket: str, rules: list[Rule]) -> tuple[bytes, int]:
        """Remove lagging keys' <Contents> entries from a listing (and fix KeyCount); returns (body, removed)."""
        now = clock()
        hidden = {k.split("/", 1)[1] for r in rules for k, t in r.visible_at.items()
                  if t > now and k.startswith(bucket + "/")}
        removed = 0

        def drop(m: re.Match) -> bytes:
            nonlocal removed
            key = re.search(rb"<Key>(.*?)</Key>", m.group(0))
            if key and _xml_unescape(key.group(1).decode()) in hidden:
                removed += 1
                return b""
            return m.group(0)
        out = re.sub(rb"<Contents>.*?</Contents>", drop, body, flags=re.S)
        if removed:
            out = re.sub(rb"<KeyCount>(\d+)</KeyCount>",
                         lambda m: b"<KeyCount>%d</KeyCount>" % max(0, int(m.group(1)) - removed), out)
            for r in rules:
                r.hits += 1
                r.matched += 1
                r.first_hit_at = r.first_hit_at or now
                r.last_hit_at = now
        return out, removed

    async def _reset(self, head: Head, req: S3Request, rule: Rule, creader, cwriter, base: dict) -> None:
        """ST4: a request dropped mid-transfer: `reset_after` body bytes (0 = none) reach the store, then both
        connections are reset (the client sees a reset; the store sees a body that stops)."""
        t0, sent = base["t"], 0
        uw = None
        try:
            if rule.reset_after and (head.length or 0) > 0:
                n = min(rule.reset_after, head.length or 0)
                if head.get("expect").lower() == "100-continue":
                    cwriter.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await cwriter.drain()
                data = await creader.readexactly(n)
                _, uw = await asyncio.open_connection(*self.upstream, limit=MAX_HEAD)
                lines = head.raw.split(b"\r\n")
                uw.write(b"\r\n".join(l for l in lines if not l.lower().startswith(b"expect:")) + data)
                await uw.drain()
                sent = n
                await asyncio.sleep(0.05)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            cwriter.transport.abort()
            if uw is not None:
                uw.transport.abort()
        rule.note_key(req.target_key)
        self.record(**base, status=None, req_bytes=sent, resp_bytes=0, rule=rule.rule_id, fault=rule.fault,
                    reset=True, forwarded=sent, ms=round((clock() - t0) * 1000, 3))

    async def _gate(self, req: S3Request) -> None:
        """After an `after` boundary fired, the task's next requests wait until the rule is closed (the kill)."""
        for rule in self._boundary_rules(req):
            if rule.first_hit_at is not None:
                ev = self.released.setdefault(rule.rule_id, asyncio.Event())
                await asyncio.wait_for(ev.wait(), 60)
                raise ConnectionError(f"held at boundary {rule.rule_id}")

    async def _boundary(self, req: S3Request, status: int) -> Rule | None:
        """Count a 2xx write against the boundary rules; the rule whose Nth it is fires (returned)."""
        if req.method not in WRITES or not 200 <= status < 300:
            return None
        for rule in self._boundary_rules(req):
            if rule.first_hit_at is not None:
                continue
            rule.counted += 1
            if rule.counted == rule.nth:
                rule.hits, rule.first_hit_at = 1, clock()
                rule.last_hit_at = rule.first_hit_at
                rule.note_key(req.target_key)
                return rule
        return None

    def record(self, **entry) -> None:
        self.counts["requests"] += 1
        if entry.get("rule"):
            self.counts["faulted"] += 1
        if self.log:
            # batched: one write LOG_FLUSH_S after the first line pending, not a syscall per request and no tick
            # while nothing is; any control call and the proxy's stop write what is pending first (a SIGKILL
            # loses at most LOG_FLUSH_S of lines)
            if not self._pending:
                try:
                    asyncio.get_running_loop().call_later(LOG_FLUSH_S, self.flush_log)
                except RuntimeError:  # no loop (a unit test drives the proxy by hand): flush_log is its to call
                    pass
            self._pending.append(orjson.dumps(entry) + b"\n")

    def flush_log(self) -> None:
        if self.log and self._pending:
            batch, self._pending = self._pending, []
            self.log.write(b"".join(batch))
            self.log.flush()

    async def handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        """One client connection: each request is checked, answered by the action of a rule that hit it, or relayed
        to the store on the connection's one upstream connection (kept alive as the client's is)."""
        upstream = uwriter = None
        try:
            while True:
                head = await read_head(creader)
                if head is None:
                    return
                method, target, _ = (head.start.split(" ", 2) + ["", ""])[:3]
                if method == "GET" and target == HEALTH_PATH:
                    cwriter.write(HEALTH_ANSWER)
                    await cwriter.drain()
                    return
                try:
                    why = framing_problem(head.raw)  # a head the store may frame otherwise: never forwarded
                    if why is not None:
                        raise ValueError(why)
                    req = S3Request.parse(method, target)
                    if not method.isalpha() or not target.startswith("/"):
                        raise ValueError("malformed request line or framing")
                except ValueError as exc:  # answered, logged, closed; never forwarded
                    await self._refuse_bad(cwriter, method, str(exc))
                    return
                t0 = clock()
                base = {"t": t0, "method": method, "bucket": req.bucket, "key": req.key,
                        "part": req.part, "upload_id": req.upload_id, "prefix": req.list_prefix,
                        "akid": access_key_id(head.get("authorization"), target)}
                sha = head.get("x-amz-content-sha256")
                if len(sha) == 64:  # the writer signed its payload's sha256: the audit checks the store against it
                    base["sha"] = sha
                await self._gate(req)
                rule = self._lagging(req) if self.rules.lag else None  # ST7: the object reads as missing
                if rule is None and self.rules:
                    rule = self.match(req)
                shaping = None
                if rule is not None:
                    done = await ACTIONS[rule.action].hit(Hit(self, head, req, rule, creader, cwriter, base))
                    if done == NEXT:
                        continue
                    if done == CLOSE:
                        return
                    shaping = done
                res = None
                if self.quota is not None:
                    res, refusal = self.quota.admit(req, head)
                    if method in WRITES:  # what the quota applied, for a resumed wave's preload
                        base["quota_op"] = res.op if res is not None else None
                    if refusal is not None:
                        if await self._refuse_quota(head, req, base, refusal, creader, cwriter) == CLOSE:
                            return
                        continue
                try:
                    if upstream is None:
                        upstream = await asyncio.open_connection(*self.upstream, limit=MAX_HEAD)
                        uwriter = upstream[1]
                    if not await self._relay(head, req, base, shaping, creader, cwriter, *upstream, res):
                        return
                finally:
                    if res is not None:
                        self.quota.release(res)  # never answered by the store (settled in _relay when it was)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            return
        finally:
            for w in (cwriter, uwriter):
                if w is not None:
                    w.close()

    async def _refuse_bad(self, cwriter, method: str, why: str) -> None:
        """A request the proxy will not forward: 400 BadRequest (S3's XML error), logged with no key, closed."""
        cwriter.write(bad_request(why))
        await cwriter.drain()
        self.record(t=clock(), method=method[:16], bucket=None, key=None, status=400, req_bytes=0, resp_bytes=0,
                    rule=None, fault=None, bad_request=why[:200])

    async def _refuse_quota(self, head: Head, req: S3Request, base: dict, refusal: tuple, creader,
                            cwriter) -> str:
        """The store quota refuses the write (storage/quota.py): the S3 error in place of the store's answer, the
        body read and dropped (or never sent: a 100-continue is refused and the connection closes)."""
        status, code, why = refusal
        expect = head.get("expect").lower() == "100-continue"
        req_bytes = 0 if expect or head.chunked else await copy_body(creader, None, head)
        await self._answer_error(cwriter, req, status, code, why, close=expect or head.chunked)
        self.record(**base, op=req.op, status=status, code=code, req_bytes=req_bytes, resp_bytes=0, rule=None,
                    fault=None, quota=dict(self.quota.usage(req.bucket, req.key or req.list_prefix or ""), why=why),
                    ms=round((clock() - base["t"]) * 1000, 3))
        return CLOSE if expect or head.chunked else NEXT

    @staticmethod
    async def _answer_error(cwriter, req: S3Request, status: int, code: str, why: str, close: bool) -> None:
        """The proxy's own S3 error (XML Error with Code and Message) in place of the store's answer."""
        body = _xml_error(code, why, req, "sandfleet-quota")
        cwriter.write((f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/xml\r\n"
                       f"Content-Length: {len(body)}\r\nx-amz-request-id: sandfleet-quota\r\n"
                       f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n").encode()
                      + (b"" if req.method == "HEAD" else body))
        await cwriter.drain()

    async def _relay(self, head: Head, req: S3Request, base: dict, shaping: Shaping | None, creader, cwriter,
                     ureader, uwriter, res=None) -> bool:
        """Forward one request to the store and its answer to the client (bodies streamed; a small request body
        held whole first; ST7 listings rewritten; a boundary counted). True: the connection reads its next
        request."""
        method, t0 = req.method, base["t"]
        throttle_up, throttle_down = (shaping.up, shaping.down) if shaping is not None else (None, None)
        strip = self._listing_lag(req) if self.rules.lag else []
        expect = head.get("expect").lower() == "100-continue"
        held = None
        if not head.chunked and head.length is not None and 0 < head.length <= HOLD_MAX:
            # A small body is held whole before the store sees the request: a client that dies
            # mid-body never reaches the store (SeaweedFS turns a PUT whose body never arrived
            # into an EMPTY object, even over a newer complete one, when its connection closes).
            if expect:
                cwriter.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                await cwriter.drain()
            held = await creader.readexactly(head.length)
        keys: list[str] = []
        if res is not None and res.op == "DeleteObjects":
            try:  # the keys the store will delete, as it parses them; a body it could read otherwise is refused
                keys = delete_keys(held)
            except ValueError as exc:
                await self._answer_error(cwriter, req, 400, "MalformedXML", str(exc), close=False)
                self.record(**base, op=req.op, status=400, code="MalformedXML", req_bytes=len(held or b""),
                            resp_bytes=0, rule=None, fault=None, quota=dict(
                                self.quota.usage(req.bucket, req.list_prefix or ""), why=str(exc)[:200]),
                            ms=round((clock() - t0) * 1000, 3))
                return True  # never forwarded; its body was read whole, so the connection reads on
        settle_later = False

        def settle_delete(answer: bytes | None) -> None:
            """A DeleteObjects the store answered 2xx: the keys it named less those its answer lists as errors
            (all of them when its answer is not read) leave the quota."""
            kept = not_deleted(answer, keys)
            if kept:
                base["not_deleted"] = kept[:MAX_LOGGED_KEYS]
            self.quota.settle(res, status, [k for k in keys if k not in kept])

        uwriter.write(head.raw + held if held is not None and not expect else head.raw)  # one send
        await uwriter.drain()
        if held is not None:
            if throttle_up is not None:
                await throttle_up.take(len(held))
            body_task = asyncio.get_running_loop().create_future()
            if not expect:
                body_task.set_result(len(held))
        elif not head.chunked and not head.length:  # no body (GET, HEAD, DELETE): nothing to relay
            body_task = asyncio.get_running_loop().create_future()
            body_task.set_result(0)
        else:
            body_task = asyncio.create_task(copy_body(creader, uwriter, head, throttle=throttle_up))
        while True:
            try:
                rhead = await self._upstream_head(ureader, uwriter, body_task)
            except ConnectionError:
                if body_task.done() and not body_task.cancelled() and isinstance(body_task.exception(), BadFraming):
                    await self._refuse_bad(cwriter, method, str(body_task.exception()))  # the store got no end
                raise
            status = int(rhead.start.split(" ", 2)[1])
            if 100 <= status < 200:
                if held is not None and expect and not body_task.done():
                    uwriter.write(held)  # our own 100 went to the client already
                    await uwriter.drain()
                    body_task.set_result(len(held))
                else:
                    cwriter.write(rhead.raw)
                    await cwriter.drain()
                continue
            if res is not None:  # the store has answered: the quota counts what it applied
                if res.op == "DeleteObjects":  # the keys it names: the grader attributes a bucket-level POST by
                    base["keys"] = keys[:MAX_LOGGED_KEYS]  # them, not by ""; its answer says which were deleted
                    settle_later = 200 <= status < 300
                    if not settle_later:
                        self.quota.settle(res, status)
                else:
                    self.quota.settle(res, status)
                    if res.op in ("PutObject", "UploadPart"):
                        base["stored"] = res.length  # what the quota counted (a copy's source, a body's bytes)
            if self.rules.lag:
                self._lag_note(req, status)
            fired = await self._boundary(req, status)
            if fired is not None and fired.variant == "ambiguous":
                # the store applied the write; its answer never reaches the runner (killed meanwhile)
                if settle_later:
                    settle_delete(None)
                self.record(**base, status=status, req_bytes=body_task.result() if body_task.done()
                            and not body_task.exception() else 0, resp_bytes=0, rule=fired.rule_id,
                            fault=fired.fault, held=True, ms=round((clock() - t0) * 1000, 3))
                ev = self.released.setdefault(fired.rule_id, asyncio.Event())
                await asyncio.wait_for(ev.wait(), 60)
                return False
            if strip and status == 200 and rhead.length is not None and rhead.length <= HOLD_MAX:
                break  # a listing that may name lagging keys: rewritten below before it is relayed
            strip = []
            break
        no_body = method == "HEAD" or status in (204, 304)
        closing = rhead.get("connection").lower() == "close" or head.get("connection").lower() == "close"
        small = not strip and throttle_down is None and not rhead.chunked and (
            no_body or (rhead.length is not None and rhead.length <= (HOLD_MAX if settle_later else SMALL_BODY)))
        if settle_later and not small:
            settle_delete(None)  # an answer not held: nothing is taken as deleted
        shaped = shaping.rule if shaping is not None else None
        try:
            if small:  # head and body in one send (most S3 answers are small)
                body = b"" if no_body else await ureader.readexactly(rhead.length)
                if settle_later:
                    settle_delete(body)
                cwriter.write(rhead.raw + body)
                await cwriter.drain()
                resp_bytes = len(body)
            elif not strip:
                cwriter.write(rhead.raw)
                await cwriter.drain()
            if small:
                pass
            elif strip:  # ST7: drop the lagging keys from the listing, fix its length
                body, _ = self._strip_listing(await ureader.readexactly(rhead.length), req.bucket, strip)
                raw = re.sub(rb"(?im)^content-length:[^\r\n]*", b"Content-Length: %d" % len(body), rhead.raw)
                cwriter.write(raw + body)
                await cwriter.drain()
                resp_bytes = len(body)
            else:
                resp_bytes = 0 if no_body else await copy_body(
                    ureader, cwriter, rhead, until_eof=rhead.length is None and not rhead.chunked,
                    throttle=throttle_down)
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            # the store has answered: the line is written even when its answer does not reach the client whole
            # (a write it applied is never missing from the log); the connection then closes
            if settle_later and not res.done:
                settle_delete(None)
            sent = body_task.done() and not body_task.cancelled() and body_task.exception() is None
            self.record(**base, status=status, req_bytes=body_task.result() if sent else 0, resp_bytes=0,
                        rule=shaped.rule_id if shaped else None, fault=shaped.fault if shaped else None,
                        ms=round((clock() - t0) * 1000, 3), answer_lost=True,
                        **(shaping.extra() if shaping is not None else {}))
            raise
        if not body_task.done():
            # The upstream answered without taking the body (e.g. refused a 100-continue).
            body_task.cancel()
            closing = True
            req_bytes = 0
        elif body_task.exception() is not None:
            if isinstance(body_task.exception(), BadFraming):  # the store answered before the bad chunk came
                self.record(**base, status=status, req_bytes=0, resp_bytes=resp_bytes, rule=None, fault=None,
                            ms=round((clock() - t0) * 1000, 3), bad_request=str(body_task.exception())[:200])
            return False
        else:
            req_bytes = body_task.result()
        self.record(**base, status=status, req_bytes=req_bytes, resp_bytes=resp_bytes,
                    rule=shaped.rule_id if shaped else None, fault=shaped.fault if shaped else None,
                    ms=round((clock() - t0) * 1000, 3), **(shaping.extra() if shaping is not None else {}))
        return not (closing or (rhead.length is None and not rhead.chunked and not no_body))

    # -- control API --------------------------------------------------------
    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await read_head(reader)
            if head is None:
                return
            method, target, _ = (head.start.split(" ", 2) + ["", ""])[:3]
            body = await reader.readexactly(head.length or 0)
            if self.token and not hmac.compare_digest(head.get("authorization"), f"Bearer {self.token}"):
                status, payload = 401, {"error": "the control API needs the harness's bearer token"}
            else:
                path = urllib.parse.urlsplit(target).path
                if self.relay is not None:  # the relay's log written too, and before a rule opens every
                    # request whose head it reads from now on comes here
                    opening = method == "POST" and path == "/rules"
                    await self.relay.sync((lambda: b"1") if opening else self.route)
                status, payload = self.dispatch(method, path, body)
                if self.relay is not None and self.relay.route != self.route():
                    await self.relay.sync(self.route)  # only what the open rules (and a quota) may meet comes here
        except Exception as exc:  # noqa: BLE001 - the control API answers every error as JSON
            status, payload = 400, {"error": str(exc)}
        data = orjson.dumps(payload)
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        try:
            await writer.drain()
        finally:
            writer.close()

    def dispatch(self, method: str, path: str, body: bytes) -> tuple[int, dict]:
        self.flush_log()  # whoever asks the proxy anything sees every request logged before the question
        if method == "POST" and path == "/flush":
            return 200, {"flushed": True}
        if method == "GET" and path == "/rules":
            return 200, {"rules": [r.public() for r in self.rules.values()], "closed": self.closed_rules}
        if method == "GET" and path == "/stats":
            relayed = self.relay.relayed if self.relay is not None else 0
            return 200, dict(self.counts, requests=self.counts["requests"] + relayed, relayed=relayed,
                             open_rules=len(self.rules),
                             quota_refused=sum(u.refused for u in self.quota.use.values()) if self.quota else None)
        if method == "POST" and path == "/rules":
            spec = orjson.loads(body)
            rule = Rule(**spec)
            if rule.rule_id in self.rules:
                return 409, {"error": f"rule {rule.rule_id!r} is already open"}
            self.rules[rule.rule_id] = rule
            return 201, rule.public()
        if method == "DELETE" and path.startswith("/rules/"):
            rid = urllib.parse.unquote(path[len("/rules/"):])
            rule = self.rules.pop(rid, None)
            if rule is None:
                return 404, {"error": f"no open rule {rid!r}"}
            self.released.setdefault(rid, asyncio.Event()).set()
            closed = dict(rule.public(), closed_at=clock())
            self.closed_rules.append(closed)
            return 200, closed
        if method == "DELETE" and path == "/rules":
            closed = []
            for rid in list(self.rules):
                self.released.setdefault(rid, asyncio.Event()).set()
                closed.append(dict(self.rules.pop(rid).public(), closed_at=clock()))
            self.closed_rules.extend(closed)
            return 200, {"closed": closed}
        return 404, {"error": f"no route {method} {path}"}

    def route(self) -> bytes:
        """What the relay hands over: the open rules' route, and every write while a quota is on (`W`)."""
        r = self.rules.route()
        return r if self.quota is None or r == b"1" else b"W" + r

    def _adopt(self, fd: int, data: bytes) -> None:
        """A connection the relay handed over, served here from its next request on."""
        task = asyncio.ensure_future(self._serve_adopted(fd, data))
        self._adopted.add(task)
        task.add_done_callback(self._adopted.discard)

    async def _serve_adopted(self, fd: int, data: bytes) -> None:
        try:
            creader, cwriter = await relay.adopt_socket(fd, data, MAX_HEAD)
        except OSError:
            return
        await self.handle(creader, cwriter)

    async def serve(self, port: int = 0, control_port: int = 0) -> int:
        """Serve until SIGTERM or SIGINT (0), or until the relay that owns the port exits (1)."""
        path, server = relay.binary(), None
        if path:
            self.relay = relay.Relay(path, self.upstream, self.log_path)
            self.port = self.relay.start(port)
            self.relay.attach(self._adopt)
            if self.quota is not None:  # before READY: no one knows the port yet, so no write passes the quota
                await self.relay.sync(self.route)
        else:
            server = await asyncio.start_server(self.handle, "127.0.0.1", port, limit=MAX_HEAD)
            self.port = server.sockets[0].getsockname()[1]
        ctl = await asyncio.start_server(self.control, "127.0.0.1", control_port, limit=MAX_HEAD)
        self.control_port = ctl.sockets[0].getsockname()[1]
        print(f"READY {self.port} {self.control_port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        waits = [asyncio.ensure_future(stop.wait())]
        if self.relay is not None:
            waits.append(asyncio.ensure_future(self.relay.lost.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for s in (server, ctl):
                if s is not None:
                    s.close()
        lost = self.relay is not None and self.relay.lost.is_set() and not stop.is_set()
        for w in waits:
            w.cancel()
        if self.relay is not None:
            self.relay.stop()  # it writes what it relayed before it exits
        self.flush_log()
        if self.log:
            self.log.close()
        if lost:
            print("the proxy's relay exited; the proxy's port is gone", file=sys.stderr, flush=True)
        return 1 if lost else 0


class ProxyControl:
    """Client of the proxy's control API (stdlib only, so runners and tests can use it)."""

    def __init__(self, control_port: int, host: str = "127.0.0.1", token: str | None = None):
        self.base = f"http://{host}:{control_port}"
        self.token = token

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = orjson.dumps(body) if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return orjson.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"proxy control {method} {path}: {exc.code} {exc.read().decode()}") from exc

    def open_rule(self, **spec) -> dict:
        return self._call("POST", "/rules", spec)

    def close_rule(self, rule_id: str) -> dict:
        return self._call("DELETE", f"/rules/{urllib.parse.quote(rule_id, safe='')}")

    def close_all(self) -> list[dict]:
        return self._call("DELETE", "/rules")["closed"]

    def rules(self) -> dict:
        return self._call("GET", "/rules")

    def stats(self) -> dict:
        return self._call("GET", "/stats")

    def flush(self) -> None:
        """Write every request the proxy has logged so far to its log file."""
        self._call("POST", "/flush", {})


class ProxyProcess:
    """The proxy as a child process of the harness, ended by PID in `stop()`."""

    def __init__(self, upstream_url: str, log_path: str, relay: bool = True, merge_slashes: bool = False,
                 quota: tuple[int, int] | None = None):
        parts = urllib.parse.urlsplit(upstream_url)
        self.quota = quota  # (objects, bytes) per task (storage/quota.py), or None: no bound
        self.merge_slashes = merge_slashes  # the store is SeaweedFS (MERGE_SLASHES)
        self.relay = relay  # False: the proxy serves alone even where the relay is installed (a bench's "before")
        self.upstream = f"{parts.hostname}:{parts.port or 80}"
        self.log_path = log_path
        self.proc = None
        self.port = 0
        self.control_port = 0
        self.token: str | None = None

    def start(self, timeout_s: float = 20.0) -> "ProxyProcess":
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> "ProxyProcess":
        """Start the proxy's process and return at once (it needs nothing from its upstream to start);
        `wait_ready` reads its READY line with its ports."""
        self.token = secrets.token_urlsafe(32)
        env = dict(os.environ, SANDFLEET_PROXY_TOKEN=self.token)
        if not self.relay:
            env["SANDFLEET_PROXY_RELAY"] = "off"
        self.proc = subprocess.Popen(  # the token goes through the environment, never argv (ps shows argv)
            [sys.executable, "-m", "storage.proxy", "--upstream", self.upstream, "--log", self.log_path]
            + (["--merge-slashes"] if self.merge_slashes else [])
            + (["--quota-objects", str(self.quota[0]), "--quota-bytes", str(self.quota[1])] if self.quota else []),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
        return self

    def wait_ready(self, timeout_s: float = 20.0) -> "ProxyProcess":
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline().decode().split() if ready else ["(no READY line after", f"{timeout_s}s)"]
        if len(line) != 3 or line[0] != "READY":
            err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.poll() is not None else ""
            self.stop()
            raise RuntimeError(f"the S3 fault proxy did not start: {line} {err}")
        self.port, self.control_port = int(line[1]), int(line[2])
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def relay_pid(self) -> int | None:
        """The compiled relay's pid (the proxy's one child), or None when the proxy serves alone."""
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                kids = f.read().split()
        except (OSError, AttributeError):
            return None
        return int(kids[0]) if kids else None

    def control(self) -> ProxyControl:
        return ProxyControl(self.control_port, token=self.token)

    def stop(self, grace_s: float = 5.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        stop_process(proc, grace_s)
        for f in (proc.stdout, proc.stderr):
            if f:
                f.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True, help="HOST:PORT of the S3 store")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--control-port", type=int, default=0)
    ap.add_argument("--log", default=None, help="JSON-lines request log")
    ap.add_argument("--merge-slashes", action="store_true", help="match and log keys as SeaweedFS stores them")
    ap.add_argument("--quota-objects", type=int, default=0, help="objects a task's prefix may hold (0: no quota)")
    ap.add_argument("--quota-bytes", type=int, default=0, help="bytes a task's prefix may hold (0: no quota)")
    args = ap.parse_args(argv)
    global MERGE_SLASHES
    MERGE_SLASHES = args.merge_slashes
    host, _, port = args.upstream.rpartition(":")
    if not host or not port.isdigit():
        sys.exit(f"--upstream {args.upstream!r}: expected HOST:PORT")
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    quota = None
    if args.quota_objects or args.quota_bytes:
        quota = Quota(args.quota_objects or 2 ** 62, args.quota_bytes or 2 ** 62)
        if args.log and os.path.exists(args.log):  # a resumed wave: what the store already holds counts
            with open(args.log, "rb") as f:
                quota.preload(_log_lines(f))
    sys.exit(asyncio.run(FaultProxy(host, int(port), args.log, quota).serve(args.port, args.control_port)))


def _log_lines(f):
    for line in f:
        try:
            yield orjson.loads(line)
        except orjson.JSONDecodeError:
            continue


if __name__ == "__main__":
    main()
