"""Relaying one request to the store and its answer back (`Relaying._relay`: bodies streamed, a small body held
whole first, ST7 listings rewritten, a boundary counted, the store quota settled), and the rule actions that
act on the store's connection (cut, reset, lag, boundary). A mixin of `FaultProxy` (storage/proxy/handler.py):
it reads the proxy's `upstream`, `rules`, `quota`, `released` and calls its `record` and S3 error answers. Not
the compiled front (storage/relay.py), which hands connections to the proxy."""
from __future__ import annotations

import asyncio
import re

from storage.proxy import rules
from storage.proxy.http import MAX_HEAD, BadFraming, Head, copy_body, read_head, xml_unescape
from storage.proxy.rules import WRITES, ACTIONS, Rule, S3Request, Shaping
from storage.quota import delete_keys, not_deleted

MAX_LOGGED_KEYS = 1000  # a DeleteObjects names at most 1,000 keys (the S3 API's own bound)
SMALL_BODY = 64 * 1024  # responses up to this size are sent with their head in one write
HOLD_MAX = 1024 * 1024  # request bodies up to this size are held whole before the store sees the request


class Relaying:
    """How the proxy talks to the store for a request it forwards (see the module)."""

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
                    cut=True, withheld=head.length, ms=round((rules.clock() - t0) * 1000, 3))

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
                    reset=True, forwarded=sent, ms=round((rules.clock() - t0) * 1000, 3))

    def match(self, req: S3Request) -> Rule | None:
        for rule in self.rules.candidates(req):
            if ACTIONS[rule.action].drawn and rule.matches(req) and rule.draw():
                return rule
        return None

    def _boundary_rules(self, req: S3Request) -> list[Rule]:
        return [r for r in self.rules.candidates(req) if r.action == "boundary" and r.matches(req)]

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
                rule.hits, rule.first_hit_at = 1, rules.clock()
                rule.last_hit_at = rule.first_hit_at
                rule.note_key(req.target_key)
                return rule
        return None

    def _lagging(self, req: S3Request) -> Rule | None:
        """ST7: a read of an object written in a lag window less than `lag_s` ago answers as missing."""
        if req.method not in ("GET", "HEAD") or not req.key or req.upload_id:
            return None
        now = rules.clock()
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
                rule.visible_at[f"{req.bucket}/{req.key}"] = rules.clock() + rule.lag_s

    def _listing_lag(self, req: S3Request) -> list[Rule]:
        if req.op not in ("ListObjectsV2", "ListObjects"):
            return []
        now = rules.clock()
        return [r for r in self.rules.lag.values()
                if any(t > now and k.startswith(f"{req.bucket}/{req.list_prefix or ''}")
                        for k, t in r.visible_at.items())]

    @staticmethod
    def _strip_listing(body: bytes, bucket: str, lagging: list[Rule]) -> tuple[bytes, int]:
        """Remove lagging keys' <Contents> entries from a listing (and fix KeyCount); returns (body, removed)."""
        now = rules.clock()
        hidden = {k.split("/", 1)[1] for r in lagging for k, t in r.visible_at.items()
                  if t > now and k.startswith(bucket + "/")}
        removed = 0

        def drop(m: re.Match) -> bytes:
            nonlocal removed
            key = re.search(rb"<Key>(.*?)</Key>", m.group(0))
            if key and xml_unescape(key.group(1).decode()) in hidden:
                removed += 1
                return b""
            return m.group(0)
        out = re.sub(rb"<Contents>.*?</Contents>", drop, body, flags=re.S)
        if removed:
            out = re.sub(rb"<KeyCount>(\d+)</KeyCount>",
                         lambda m: b"<KeyCount>%d</KeyCount>" % max(0, int(m.group(1)) - removed), out)
            for r in lagging:
                r.hits += 1
                r.matched += 1
                r.first_hit_at = r.first_hit_at or now
                r.last_hit_at = now
        return out, removed

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
                            ms=round((rules.clock() - t0) * 1000, 3))
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
                            fault=fired.fault, held=True, ms=round((rules.clock() - t0) * 1000, 3))
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
                        ms=round((rules.clock() - t0) * 1000, 3), answer_lost=True,
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
                            ms=round((rules.clock() - t0) * 1000, 3), bad_request=str(body_task.exception())[:200])
            return False
        else:
            req_bytes = body_task.result()
        self.record(**base, status=status, req_bytes=req_bytes, resp_bytes=resp_bytes,
                    rule=shaped.rule_id if shaped else None, fault=shaped.fault if shaped else None,
                    ms=round((rules.clock() - t0) * 1000, 3), **(shaping.extra() if shaping is not None else {}))
        return not (closing or (rhead.length is None and not rhead.chunked and not no_body))

    # -- control API --------------------------------------------------------
