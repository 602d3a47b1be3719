"""The fault proxy's server: each client connection's requests checked (framing, rules, the store quota) and
answered by a rule's action, the quota, or relayed (storage/proxy/relay.py); the request log; the token-guarded
control API that opens and closes rules; and the compiled front's hand-overs (storage/relay.py)."""
from __future__ import annotations

import asyncio
import hmac
import os
import signal
import sys
import urllib.parse

import orjson

from storage import relay
from storage.proxy import rules
from storage.proxy.http import (HEAD_TOO_LARGE, MAX_HEAD, Head, HeadTooLarge, access_key_id, copy_body,
                                framing_problem, read_head)
from storage.proxy.relay import Relaying
from storage.proxy.rules import (ACTIONS, CLOSE, HEALTH_ANSWER, HEALTH_PATH, NEXT, REASONS, WRITES, Hit, Rule,
                                 InvalidArgument, RuleSet, S3Request, bad_request, xml_error)
from storage.quota import Quota

LOG_FLUSH_S = 0.01  # the request log is written in batches this often
RELAY_LOST_EXIT = 3  # the compiled relay that owned the port exited: the health watch names the relay


class FaultProxy(Relaying):
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
                try:
                    head = await read_head(creader)
                except HeadTooLarge as exc:  # answered 431 and logged, never forwarded; the connection ends
                    await self._refuse_too_large(creader, cwriter, str(exc))
                    return
                if head is None:
                    return
                method, target, _ = (head.start.split(" ", 2) + ["", ""])[:3]
                if method == "GET" and target == HEALTH_PATH:
                    cwriter.write(HEALTH_ANSWER)
                    await cwriter.drain()
                    return
                try:
                    why = framing_problem(head.raw) or head.repeated_read()  # the store may read it otherwise
                    if why is not None:
                        raise ValueError(why)
                    req = S3Request.parse(method, target)
                    if not method.isalpha() or not target.startswith("/"):
                        raise ValueError("malformed request line or framing")
                except ValueError as exc:  # answered, logged, closed; never forwarded
                    await self._refuse_bad(cwriter, method, str(exc),
                                           "InvalidArgument" if isinstance(exc, InvalidArgument) else "BadRequest")
                    return
                t0 = rules.clock()
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

    async def _refuse_bad(self, cwriter, method: str, why: str, code: str = "BadRequest") -> None:
        """A request the proxy will not forward: 400 BadRequest (S3's XML error), logged with no key, closed."""
        cwriter.write(bad_request(why, code))
        await cwriter.drain()
        self.record(t=rules.clock(), method=method[:16], bucket=None, key=None, status=400, req_bytes=0, resp_bytes=0,
                    rule=None, fault=None, bad_request=why[:200])

    async def _refuse_too_large(self, creader, cwriter, why: str) -> None:
        """A head past MAX_HEAD: 431, logged with no key; what the client still sends is read (bounded) before the
        close, so the answer is not lost to a reset."""
        cwriter.write(HEAD_TOO_LARGE)
        await cwriter.drain()
        self.record(t=rules.clock(), method=None, bucket=None, key=None, status=431, req_bytes=0, resp_bytes=0,
                    rule=None, fault=None, bad_request=why[:200])
        if cwriter.can_write_eof():
            cwriter.write_eof()
        try:
            for _ in range(64):  # at most 64 reads (the unread head) or 5 s: the peer sees the 431, then EOF
                if not await asyncio.wait_for(creader.read(MAX_HEAD), 5):
                    break
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass

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
                    ms=round((rules.clock() - base["t"]) * 1000, 3))
        return CLOSE if expect or head.chunked else NEXT

    @staticmethod
    async def _answer_error(cwriter, req: S3Request, status: int, code: str, why: str, close: bool) -> None:
        """The proxy's own S3 error (XML Error with Code and Message) in place of the store's answer."""
        body = xml_error(code, why, req, "sandfleet-quota")
        cwriter.write((f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: application/xml\r\n"
                       f"Content-Length: {len(body)}\r\nx-amz-request-id: sandfleet-quota\r\n"
                       f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n").encode()
                      + (b"" if req.method == "HEAD" else body))
        await cwriter.drain()

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
            closed = dict(rule.public(), closed_at=rules.clock())
            self.closed_rules.append(closed)
            return 200, closed
        if method == "DELETE" and path == "/rules":
            closed = []
            for rid in list(self.rules):
                self.released.setdefault(rid, asyncio.Event()).set()
                closed.append(dict(self.rules.pop(rid).public(), closed_at=rules.clock()))
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
        """Serve until SIGTERM or SIGINT (0), or until the relay that owns the port exits (RELAY_LOST_EXIT)."""
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
        return RELAY_LOST_EXIT if lost else 0
