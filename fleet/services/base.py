"""A small threaded JSON-over-HTTP server base, on 127.0.0.1, with per-task bearer keys, a body size limit, a
per-key in-flight limit and a per-key request rate (a runner that floods gets 429, not the others' latency). Every
call is attributed by its key, never by what the runner claims.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import email.utils
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson

from fleet.services.registry import CallLog, TaskEntry, TaskRegistry

MAX_BODY = 8 * 1024 * 1024
# a body over LARGE_BODY is read only while the service's shared budget of LARGE_BODY_POOL bytes has room for it
# (else 429, unread, retry later): the bodies a flood holds at once are bounded by the pool plus
# MAX_CONNECTIONS x LARGE_BODY, whatever the number of keys (freed ones go back at once: _return_large_buffers),
# and a step's call (a few KiB, a long agent history a few hundred) is never kept waiting behind it
LARGE_BODY = 256 * 1024
LARGE_BODY_POOL = 32 * 1024 * 1024
MAX_IN_FLIGHT_PER_KEY = 8
# requests a second per key (a token bucket: RATE_PER_KEY sustained, BURST_PER_KEY at once): a runner that loops on
# the model endpoint or the effects service gets 429, not the driver's CPU. A step is one model call and at most a
# few effects; durable makes under 10 calls a second, and every example runner fewer
RATE_PER_KEY = 50.0
BURST_PER_KEY = 100.0
MAX_CONNECTIONS = 512  # open connections per service: one more is closed at once (each one is a thread)
IDLE_TIMEOUT_S = 120.0  # a connection that sends nothing for this long is closed (a keep-alive between steps is not)


_MMAP_THRESHOLD_SET = False


def _return_large_buffers() -> None:
    """Fix glibc's mmap threshold at LARGE_BODY (M_MMAP_THRESHOLD, once per process): by default it rises to the
    size of the largest buffer freed (up to 32 MiB), after which a flood's 8 MiB bodies come from the heap and
    stay resident when freed; fixed, every buffer over LARGE_BODY is its own mapping, returned when freed, so the
    services' bodies in memory are bounded by the pool, not by glibc's high-water mark. No-op off glibc."""
    global _MMAP_THRESHOLD_SET
    if _MMAP_THRESHOLD_SET:
        return
    _MMAP_THRESHOLD_SET = True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, LARGE_BODY)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


class HttpError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Server(ThreadingHTTPServer):
    """A thread per open connection, at most `max_connections` of them: a runner that opens thousands of idle
    connections gets the extra ones closed, and the others' threads and fds stay bounded. A thread whose connection
    ended waits for the next one instead of exiting: a runner that opens a connection per call (urllib) costs no
    thread start per call."""

    daemon_threads = True
    request_queue_size = 256
    max_connections = MAX_CONNECTIONS

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._open = 0
        self._idle = 0  # threads waiting for a connection
        self._workers = 0
        self._open_lock = threading.Lock()
        self._conns: queue.SimpleQueue = queue.SimpleQueue()
        self.refused = 0  # connections closed at once because max_connections were open

    def process_request(self, request, client_address):
        with self._open_lock:
            if self._open >= self.max_connections:
                self.refused += 1
                self.shutdown_request(request)
                return
            self._open += 1
            start = self._idle == 0
            if start:
                self._workers += 1
            else:
                self._idle -= 1  # an idle thread takes it
        self._conns.put((request, client_address))
        if start:
            try:
                threading.Thread(target=self._serve_connections, daemon=True).start()
            except BaseException:
                with self._open_lock:
                    self._workers -= 1
                    self._open -= 1
                raise

    def _serve_connections(self) -> None:
        while True:
            job = self._conns.get()
            if job is None:
                return
            request, client_address = job
            try:
                self.finish_request(request, client_address)
            except Exception:  # noqa: BLE001 - one connection's failure never ends the thread
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)
                with self._open_lock:
                    self._open -= 1
                    self._idle += 1

    def server_close(self) -> None:
        super().server_close()
        with self._open_lock:
            n = self._workers
        for _ in range(n):  # every thread ends once its connection does
            self._conns.put(None)

    def handle_error(self, request, client_address):  # a killed runner hangs up: not an error
        pass


class JsonService:
    """Base of the model endpoint and the effects service. Subclasses implement `route`."""

    name = "service"

    def __init__(self, registry: TaskRegistry, log_path: str | Path | None = None):
        _return_large_buffers()
        self.registry = registry
        self.log = CallLog(log_path)
        self.fenced: CallLog | None = None  # where refused calls of fenced attempts are recorded (set by the wave)
        self._in_flight: dict[str, int] = {}
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, when last refilled)
        self._lock = threading.Lock()
        self._pool_used = 0  # bytes of large bodies being read or handled right now (LARGE_BODY_POOL)
        self.pool_refused = 0  # large bodies answered 429 because the pool was full
        service = self

        class Handler(BaseHTTPRequestHandler):
            timeout = IDLE_TIMEOUT_S  # the socket's timeout: an idle (or trickling) connection is closed
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # a head and a body in two writes must not wait for a delayed ACK
            server_version = "sandfleet"
            sys_version = ""

            def log_message(self, *args):
                pass

            def date_time_string(self, timestamp=None):
                return _http_date() if timestamp is None else super().date_time_string(timestamp)

            def do_GET(self):
                service._dispatch(self, "GET")

            def do_POST(self):
                service._dispatch(self, "POST")

        self.server = _Server(("127.0.0.1", 0), Handler)
        # a short poll: stop() waits one poll for the loop to see its shutdown (0.5 s by default, per service per wave)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name=self.name, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self):
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        self.log.close()

    # -- request plumbing ---------------------------------------------------------
    @staticmethod
    def send_json(h: BaseHTTPRequestHandler, status: int, payload: dict, headers: dict | None = None) -> bool:
        data = orjson.dumps(payload)
        try:
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
            h.wfile.flush()
            return True
        except OSError:
            return False

    def read_json(self, h: BaseHTTPRequestHandler) -> dict:
        if "chunked" in (h.headers.get("Transfer-Encoding") or "").lower():
            h.close_connection = True
            raise HttpError(411, "send the body with a Content-Length")
        n = body_length(h.headers)
        if n is None:  # negative, signed, spaced, '1_000', or two different values: never read to EOF on it
            h.close_connection = True
            raise HttpError(400, "Content-Length must be one decimal number of bytes (0-9 only)")
        if n > MAX_BODY:
            h.close_connection = True
            raise HttpError(413, f"request body of {n} bytes is over the {MAX_BODY} byte limit")
        if n > LARGE_BODY:
            with self._lock:
                if self._pool_used + n > LARGE_BODY_POOL:
                    self.pool_refused += 1
                    h.close_connection = True
                    h._sf_body_read = True  # never read it, not even to drain it: the connection is closed
                    raise HttpError(429, f"request body of {n} bytes: the service's budget for bodies over "
                                         f"{LARGE_BODY} bytes ({LARGE_BODY_POOL} in all) is in use; retry later",
                                    type_="rate_limit_exceeded", code="rate_limit_exceeded")
                self._pool_used += n
                h._sf_reserved = n
        raw = h.rfile.read(n) if n else b""
        h._sf_body_read = True
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise HttpError(400, f"We could not parse the JSON body of your request: {exc}") from None
        if not isinstance(body, dict):
            raise HttpError(400, "the request body must be a JSON object")
        return body

    def authenticate(self, h: BaseHTTPRequestHandler):
        auth = h.headers.get("Authorization") or ""
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        key = key or (h.headers.get("x-api-key") or "").strip()  # Anthropic's header (Messages API clients)
        entry = self.registry.lookup(key) if key else None
        if entry is None and key in self.registry.revoked:
            gone = self.registry.revoked[key]
            if self.fenced is not None:  # the harness's record that a fenced attempt was refused
                self.fenced.append({"t": time.time(), "service": self.name, "task": gone.task_id,
                                    "attempt": gone.attempt, "method": h.command, "path": h.path[:200],
                                    "status": 401})
            raise HttpError(401, "This attempt's key was revoked: its lease ended and a newer attempt holds the "
                            "task (fenced).", code="invalid_api_key")
        if entry is None:
            raise HttpError(401, "Incorrect API key provided. This service takes the per-task key it was given "
                            "in the environment.", code="invalid_api_key")
        return entry

    @staticmethod
    def _drain(h: BaseHTTPRequestHandler) -> None:
        """Read an unread request body so the connection stays usable, or close it."""
        if getattr(h, "_sf_body_read", False):
            return
        n = body_length(h.headers)
        if n is None:
            n = -1
        if 0 < n <= LARGE_BODY and "chunked" not in (h.headers.get("Transfer-Encoding") or "").lower():
            h.rfile.read(n)
        elif n != 0:  # a large unread body is not drained into the heap: the connection is closed instead
            h.close_connection = True

    def _dispatch(self, h: BaseHTTPRequestHandler, method: str) -> None:
        key = None
        h._sf_body_read = False
        h._sf_reserved = 0
        try:
            path = h.path.split("?", 1)[0]
            entry = self.authenticate(h)
            key = entry.key
            with self._lock:
                if not self._take_token(key):
                    key = None
                    raise HttpError(429, f"more than {RATE_PER_KEY:g} requests a second for this key (bursts of "
                                         f"{BURST_PER_KEY:g}): slow down and retry", type_="rate_limit_exceeded",
                                    code="rate_limit_exceeded")
                if self._in_flight.get(key, 0) >= MAX_IN_FLIGHT_PER_KEY:
                    key = None
                    raise HttpError(429, f"more than {MAX_IN_FLIGHT_PER_KEY} requests in flight for this key",
                                    type_="rate_limit_exceeded", code="rate_limit_exceeded")
                self._in_flight[key] = self._in_flight.get(key, 0) + 1
            self.route(h, method, path, entry)
        except HttpError as err:
            self._drain(h)
            self.send_json(h, err.status, self.error_body(h.path.split("?", 1)[0], err))
        except Exception as exc:  # noqa: BLE001 - never crash the service on one bad request
            err = HttpError(500, f"internal error: {type(exc).__name__}", "server_error")
            self.send_json(h, 500, self.error_body(h.path.split("?", 1)[0], err))
        finally:
            if key is not None or h._sf_reserved:
                with self._lock:
                    if key is not None:
                        self._in_flight[key] -= 1
                    self._pool_used -= h._sf_reserved

    def error_body(self, path: str, err: HttpError) -> dict:
        """An error as the API of `path` shapes it (OpenAI's unless a service speaks another one)."""
        return err.body()

    def _take_token(self, key: str) -> bool:
        """The key's token bucket (under the lock): refilled at RATE_PER_KEY a second up to BURST_PER_KEY."""
        t = time.monotonic()
        tokens, last = self._buckets.get(key, (BURST_PER_KEY, t))
        tokens = min(BURST_PER_KEY, tokens + (t - last) * RATE_PER_KEY)
        if tokens < 1.0:
            self._buckets[key] = (tokens, t)
            return False
        self._buckets[key] = (tokens - 1.0, t)
        return True

    def route(self, h: BaseHTTPRequestHandler, method: str, path: str, entry: TaskEntry) -> None:
        raise NotImplementedError


def body_length(headers) -> int | None:
    """The request's Content-Length (0 when absent), or None when it is not one plain decimal number: Python's
    int() takes '-1', '+5', ' 5' and '1_000', and a negative length makes rfile.read() read to EOF (a runner
    could then stream gigabytes into the driver's heap)."""
    values = headers.get_all("Content-Length") or []
    if not values:
        return 0
    if len(set(v.strip() for v in values)) != 1:
        return None
    v = values[0].strip()
    if not v.isascii() or not v.isdigit() or len(v) > 18:
        return None
    return int(v)


_DATE = (0, "")


def _http_date() -> str:
    """The Date header of an answer, formatted once a second (email.utils' formatting was a twentieth of a
    call's CPU)."""
    global _DATE
    sec = int(time.time())
    if _DATE[0] != sec:
        _DATE = (sec, email.utils.formatdate(sec, usegmt=True))
    return _DATE[1]


def now() -> float:
    return time.time()
