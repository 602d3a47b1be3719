"""A local model endpoint on 127.0.0.1. It answers each agent step from the task's
seed (the content comes from `workload.decide`), with a fresh nonce on every call,
after a configurable think time, and counts calls and tokens per task and step.

POST /v1/step {"task_id", "seed", "step", "attempt"} -> {"decision", "nonce", "tokens"}
GET  /v1/stats -> {"tasks": {task_id: {"calls", "tokens", "steps": {step: calls}, "log": [...]}}}
"""
from __future__ import annotations

import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson

from fleet import workload


class ModelStats:
    def __init__(self):
        self.lock = threading.Lock()
        self.tasks: dict[str, dict] = {}

    def record(self, task_id: str, step: int, attempt: int, tokens: int, nonce: str) -> None:
        with self.lock:
            t = self.tasks.setdefault(task_id, {"calls": 0, "tokens": 0, "steps": {}, "log": []})
            t["calls"] += 1
            t["tokens"] += tokens
            t["steps"][str(step)] = t["steps"].get(str(step), 0) + 1
            t["log"].append({"t": time.time(), "step": step, "attempt": attempt, "nonce": nonce,
                             "tokens": tokens})

    def snapshot(self) -> dict:
        with self.lock:
            return orjson.loads(orjson.dumps({"tasks": self.tasks}))


class ModelEndpoint:
    """Runs in a thread of the wave driver; `stop()` closes the socket."""

    def __init__(self, think_ms: int = 0):
        self.think_ms = think_ms
        self.stats = ModelStats()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, payload: dict) -> None:
                data = orjson.dumps(payload)
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/stats":
                    return self._send(200, endpoint.stats.snapshot())
                self._send(404, {"error": "no route"})

            def do_POST(self):
                if self.path != "/v1/step":
                    return self._send(404, {"error": "no route"})
                try:
                    req = orjson.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    task_id, seed, step = str(req["task_id"]), int(req["seed"]), int(req["step"])
                except Exception as exc:  # noqa: BLE001
                    return self._send(400, {"error": f"bad request: {exc}"})
                if endpoint.think_ms:
                    time.sleep(endpoint.think_ms / 1000)
                decision = workload.decide(seed, step)
                nonce = secrets.token_hex(8)
                tokens = 40 + len(decision["line"]) * 3
                endpoint.stats.record(task_id, step, int(req.get("attempt", 0)), tokens, nonce)
                self._send(200, {"decision": decision, "nonce": nonce, "tokens": tokens})

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):  # a killed runner hangs up: not an error
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="model-endpoint", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "ModelEndpoint":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
