"""Fault rules: what a request is (`S3Request`), the open windows that may meet it (`Rule`, `RuleSet`), and how a hit
is answered (one `Action` class each, registered in `ACTIONS`), with the S3 error bodies they send."""
from __future__ import annotations

import asyncio
import math
import random
import re
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from typing import Any

from storage.proxy.http import BadFraming, Head, TokenBucket, copy_body

# The proxy's one clock: rule windows (time-triggered or opened by a request), hits and lags all read it, and
# every timestamp it logs comes from it. Tests inject their own (`storage.proxy.rules.clock = fake`) to step windows.
clock = time.time
# The embedded store (SeaweedFS) stores `a//b` as `a/b` and `/a` as `a`: with this set (`--merge-slashes`, the
# harness sets it for the embedded store) a key is matched and logged as the store will hold it, so a rule on
# `wave/task/` meets `wave//task/x` and the audit finds the logged write of every object. Other stores keep keys.
MERGE_SLASHES = False
ROUTE_MAX = 150 * 1024  # the relay is told at most this many bytes of slots (one SOCK_SEQPACKET packet), else all


class InvalidArgument(ValueError):
    """A request the proxy refuses as S3 does a malformed argument: 400 InvalidArgument (not BadRequest)."""


_ESCAPE_OK = re.compile(r"%[0-9A-Fa-f]{2}")
_ASCII_NUMBER = re.compile(r"[0-9]{1,9}")
# query values the proxy or the store reads as numbers: ASCII digits only (`int()` and `isdecimal()` take U+0661,
# Go's router and strconv do not, so SeaweedFS would run another operation than the one logged and counted)
NUMERIC_PARAMS = ("partNumber", "max-keys", "max-parts", "max-uploads", "part-number-marker")


def go_query(raw: str) -> dict[str, list[str]]:
    """A query string read as Go's url.ParseQuery reads it, or ValueError where the two could differ: Go drops a
    pair with a `;` or a bad percent escape (Python's parse_qs keeps it: `?tagging=%zz` would be a tagging
    sub-resource here and a plain PutObject in the store), and keeps escaped bytes that are not UTF-8 as bytes.
    A name given twice keeps its values in order (the first is read, as Go's Get does); a number that is not ASCII
    digits is refused."""
    out: dict[str, list[str]] = {}
    for pair in raw.split("&"):
        if not pair:
            continue
        if ";" in pair:
            raise ValueError(f"query {pair[:60]!r}: a `;` (Go's query parser drops the pair): refused")
        name, _, value = pair.partition("=")
        for s in (name, value):
            if s.count("%") != len(_ESCAPE_OK.findall(s)):
                raise ValueError(f"query {pair[:60]!r}: a bad percent escape (Go's query parser drops the pair)")
        try:
            name, value = (urllib.parse.unquote_to_bytes(s.replace("+", " ")).decode("utf-8", "strict")
                           for s in (name, value))
        except UnicodeDecodeError as exc:
            raise ValueError(f"query {pair[:60]!r}: an escape that is not UTF-8: refused") from exc
        if name in NUMERIC_PARAMS and not _ASCII_NUMBER.fullmatch(value):
            raise InvalidArgument(f"query {name}={value[:20]!r} must be ASCII digits [0-9]+ (at most 9)")
        out.setdefault(name, []).append(value)  # a name given twice: Go keeps both and reads the first, as here
    return out


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
        """Raises ValueError (answered 400, logged) for a target the store (Go) may read otherwise than this."""
        if "#" in target:  # Python's urlsplit cuts a fragment; Go's request-URI parse keeps `#` in the path/query
            raise ValueError("a `#` in the request target: the store reads it otherwise (percent-encode it)")
        parts = urllib.parse.urlsplit(target)
        path = urllib.parse.unquote(parts.path)
        query = go_query(parts.query)
        segs = path.lstrip("/").split("/", 1)
        bucket = segs[0] if segs and segs[0] else ""
        key = segs[1] if len(segs) > 1 else ""
        if MERGE_SLASHES and "/" in key:
            key = re.sub("/{2,}", "/", key).lstrip("/")
        part = query.get("partNumber", [None])[0]
        return cls(method=method, bucket=bucket, key=key,
                   part=int(part) if part is not None else None,
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


def _error_body(rule: Rule, req: S3Request, code: str | None = None) -> bytes:
    resource = f"/{req.bucket}/{req.key}" if req.key else f"/{req.bucket}"
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code or rule.code}</Code><Message>{rule.message}</Message>"
        f"<Resource>{resource}</Resource><RequestId>sandfleet-{rule.rule_id}</RequestId></Error>"
    ).encode()


REASONS = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 500: "Internal Server Error",
            503: "Service Unavailable", 429: "Too Many Requests", 411: "Length Required", 501: "Not Implemented"}


def xml_error(code: str, message: str, req: S3Request, request_id: str) -> bytes:
    esc = {ord("<"): "&lt;", ord(">"): "&gt;", ord("&"): "&amp;"}
    resource = f"/{req.bucket}/{req.key}" if req.key else f"/{req.bucket}"
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message.translate(esc)}</Message>"
            f"<Resource>{resource.translate(esc)}</Resource><RequestId>{request_id}</RequestId></Error>").encode()


def error_response(rule: Rule, req: S3Request, close: bool, answer: tuple[int, str] | None = None) -> bytes:
    status, code = answer or (rule.status, rule.code)
    body = _error_body(rule, req, code)
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
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


def bad_request(why: str, code: str = "BadRequest") -> bytes:
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>' + code + '</Code><Message>'
            f"{why[:200].replace('<', ' ').replace('&', ' ')}</Message></Error>").encode()
    return (f"HTTP/1.1 400 Bad Request\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


CLOSE, NEXT = "close", "next"  # what an action did with its hit: the connection ends / reads its next request


@dataclass
class Hit:
    """A request a rule hit, as its action sees it (`t0`: when its head was read)."""
    proxy: Any  # the FaultProxy (storage/proxy/handler.py), which imports this module
    head: Head
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
