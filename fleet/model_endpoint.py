"""An OpenAI-compatible model endpoint on 127.0.0.1 that answers each task's script.

`POST /v1/chat/completions` (plain JSON, or Server-Sent Events with
`stream: true`) and `GET /v1/models`. Each task has its own API key; the answer
to a conversation is the next step's tool call, chosen from the task's seed and
the number of tool results already in `messages`, so a framework that replays
its conversation from a checkpoint is asked for the same step. After the last
step it answers with a final assistant message. Every call gets a fresh id and
`usage` token counts, and is recorded (time, task, the attempt holding the lease
at that moment, step, tokens, whether the answer was delivered).
"""
from __future__ import annotations

import secrets
import time
from http.server import BaseHTTPRequestHandler

import orjson

from fleet import dialects, workloads
from fleet.services import HttpError, JsonService, TaskEntry, TaskRegistry

MODEL_ID = "sandfleet-script"
ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def count_tool_results(messages: list) -> int:
    return sum(1 for m in messages if m.get("role") in ("tool", "function"))


def validate(body: dict) -> tuple[list, bool, dict]:
    """OpenAI-style validation of a chat request; returns (messages, stream, stream_options)."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise HttpError(400, "you must provide a model parameter", param="model", code="missing_required_parameter")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise HttpError(400, "'messages' must be a non-empty array", param="messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise HttpError(400, f"messages[{i}].role must be one of {sorted(ROLES)}", param=f"messages[{i}].role")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise HttpError(400, "'stream' must be a boolean", param="stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise HttpError(400, "'stream_options' must be an object", param="stream_options")
    return msgs, bool(stream), opts


class ModelEndpoint(JsonService):
    """Runs in threads of the wave driver; `stop()` closes the socket."""

    name = "model-endpoint"

    def __init__(self, registry: TaskRegistry | None = None, think_ms: int = 0, log_path=None,
                 dialect: str = "auto", finish: str | None = None):
        super().__init__(registry or TaskRegistry(), log_path)
        self.think_ms = think_ms
        self.pinned = None if dialect == "auto" else dialect  # fleet/dialects.py
        self.finish = finish
        self._scripts: dict[tuple, list] = {}
        self._delivered: dict[str, int] = {}

    def delivered(self, task_id: str) -> int:
        """How many answers reached the task's runner so far (a boundary fault's trigger)."""
        return self._delivered.get(task_id, 0)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def _script(self, entry: TaskEntry):
        k = (entry.workload, entry.seed, entry.steps)
        if k not in self._scripts:
            self._scripts[k] = workloads.get(entry.workload).script(entry.seed, entry.steps)
        return self._scripts[k]

    def route(self, h: BaseHTTPRequestHandler, method: str, path: str, entry: TaskEntry) -> None:
        if method == "GET" and path in ("/v1/models", "/models"):
            return self._send_json(h, 200, {"object": "list", "data": [
                {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "sandfleet"}]})
        if method == "GET" and path.startswith(("/v1/models/", "/models/")):
            return self._send_json(h, 200, {"id": path.rsplit("/", 1)[1], "object": "model", "created": 0,
                                            "owned_by": "sandfleet"})
        if method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            with self.registry.answering(entry.key):  # a model call: the attempt is alive (cluster/wave/silence.py)
                return self._chat(h, entry)
        raise HttpError(404, f"no route {method} {path}; this endpoint serves POST /v1/chat/completions and "
                        "GET /v1/models", code="not_found")

    def _send_json(self, h, status, payload) -> None:
        self.send_json(h, status, payload)

    def _chat(self, h: BaseHTTPRequestHandler, entry: TaskEntry) -> None:
        t0 = time.time()
        attempt = entry.attempt
        body = self.read_json(h)
        msgs, stream, opts = validate(body)
        script = self._script(entry)
        wl = workloads.get(entry.workload)
        try:
            dialect, mismatch = dialects.detect(body, {t["function"]["name"] for t in wl.tools()}, self.pinned)
        except dialects.DialectError as exc:
            self.log.append({"t": t0, "t_done": time.time(), "task": entry.task_id, "attempt": attempt,
                             "attempt_at_end": entry.attempt, "step": None, "kind": "refused", "tool": None,
                             "id": None, "stream": stream, "prompt_tokens": 0, "completion_tokens": 0, "tokens": 0,
                             "delivered": False, "dialect": None, "refused": str(exc)[:300]})
            raise HttpError(400, f"sandfleet cannot answer this request: {exc}", param="tools",
                            code="unsupported_dialect") from None
        step = dialects.step_of(msgs, dialect)
        if self.think_ms:
            time.sleep(self.think_ms / 1000)
        prompt_tokens = 8 + sum(len(orjson.dumps(m)) // 4 for m in msgs)
        cid = "chatcmpl-" + secrets.token_hex(12)
        created = int(t0)
        model = body["model"]
        if step < len(script) and dialect.kind == "text":
            s = script[step]
            text = dialects.text_answer(s, dialect.fence)
            message = {"role": "assistant", "content": text, "refusal": None}
            finish, completion_tokens, kind, tool = "stop", s.completion_tokens, "tool", s.tool
        elif step < len(script):
            s = script[step]
            name, args = dialects.tool_call_arguments(s, dialect)
            call = {"id": "call_" + secrets.token_hex(12), "type": "function",
                    "function": {"name": name, "arguments": orjson.dumps(args).decode()}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish, completion_tokens, kind, tool = "tool_calls", s.completion_tokens, "tool", s.tool
        else:
            text = wl.final_message(entry.seed, entry.steps)
            if dialect.kind == "text":
                text = dialects.text_final(text, self.finish, dialect.fence)
            message = {"role": "assistant", "content": text, "refusal": None}
            finish, completion_tokens, kind, tool = "stop", 4 + len(text) // 4, "final", None
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        if stream:
            delivered = self._stream(h, cid, created, model, message, finish, usage, bool(opts.get("include_usage")))
        else:
            delivered = self.send_json(h, 200, {
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "system_fingerprint": "sandfleet-script",
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": usage})
        if delivered:
            with self._lock:
                self._delivered[entry.task_id] = self._delivered.get(entry.task_id, 0) + 1
        self.log.append({"t": t0, "t_done": time.time(), "task": entry.task_id, "attempt": attempt,
                         "attempt_at_end": entry.attempt, "step": step, "kind": kind, "tool": tool, "id": cid,
                         "stream": stream, "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                         "tokens": usage["total_tokens"], "delivered": delivered, "dialect": dialect.kind,
                         **({"dialect_mismatch": mismatch} if mismatch else {})})

    @staticmethod
    def _stream(h, cid, created, model, message, finish, usage, include_usage) -> bool:
        def chunk(delta: dict | None, finish_reason=None, use=None) -> bytes:
            obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "system_fingerprint": "sandfleet-script",
                   "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                                                         "logprobs": None}]}
            if use is not None:
                obj["usage"] = use
            return b"data: " + orjson.dumps(obj) + b"\n\n"

        events = []
        if message.get("tool_calls"):
            tc = message["tool_calls"][0]
            events.append(chunk({"role": "assistant", "content": None, "tool_calls": [
                {"index": 0, "id": tc["id"], "type": "function",
                 "function": {"name": tc["function"]["name"], "arguments": ""}}]}))
            args = tc["function"]["arguments"]
            for i in range(0, len(args), 48):
                events.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + 48]}}]}))
        else:
            events.append(chunk({"role": "assistant", "content": ""}))
            text = message["content"]
            for i in range(0, len(text), 24):
                events.append(chunk({"content": text[i:i + 24]}))
        events.append(chunk({}, finish))
        if include_usage:
            events.append(chunk(None, use=usage))
        events.append(b"data: [DONE]\n\n")
        try:
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Cache-Control", "no-cache")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            for ev in events:
                h.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
            return True
        except OSError:
            h.close_connection = True
            return False
