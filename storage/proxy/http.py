"""The proxy's HTTP/1.1 reading: a request head and its framing checks (no request smuggling), bodies relayed by
Content-Length, chunked or to EOF, and the access key id that signed a request."""
from __future__ import annotations

import asyncio
import re
import time

CHUNK = 256 * 1024
MAX_HEAD = 64 * 1024


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


# fields the proxy or its quota reads: given twice, Go's Header.Get (the store) reads the first, so one request
# could be counted for one value and applied for another (a copy of a large object counted as a small one)
READ_ONCE = ("content-length", "transfer-encoding", "expect", "authorization", "x-amz-copy-source",
             "x-amz-copy-source-range", "x-amz-content-sha256", "x-amz-decoded-content-length", "content-encoding",
             "x-amz-sdk-checksum-algorithm", "x-amz-trailer")


class Head:
    def __init__(self, raw: bytes):
        self.raw = raw
        lines = raw.decode("latin-1").split("\r\n")
        self.start = lines[0]
        self.headers: dict[str, str] = {}
        self.repeated: list[str] = []  # field names given more than once
        for line in lines[1:]:
            if not line:
                continue
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name in self.headers:
                self.repeated.append(name)
                continue  # the first value, as Go's Header.Get reads it
            self.headers[name] = value.strip()

    def repeated_read(self) -> str | None:
        """Why this head must be refused: a field the proxy reads given twice (the store may read the other)."""
        names = sorted({n for n in self.repeated if n in READ_ONCE})
        return f"header {names[0]!r} given more than once: refused (give it once)" if names else None

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
        raise HeadTooLarge(f"the request head is over {MAX_HEAD} bytes") from exc
    return Head(raw)


class HeadTooLarge(ConnectionError):
    """A head past MAX_HEAD: answered 431 and logged, then the connection ends."""


HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain\r\n"
                  b"Content-Length: 35\r\nConnection: close\r\n\r\nrequest head over 64 KiB: refused\r\n")


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


def xml_unescape(s: str) -> str:
    return s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&apos;", "'").replace(
        "&amp;", "&")
