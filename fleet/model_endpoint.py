"""A model endpoint on 127.0.0.1 that answers each task's script.

`POST /v1/chat/completions` (plain JSON, or Server-Sent Events with
`stream: true`) and `GET /v1/models`; the same in Anthropic's Messages API
(`POST /v1/messages`, `/v1/messages/count_tokens`: fleet/dialect_messages.py)
and OpenAI's Responses API (`POST /v1/responses`: fleet/dialect_responses.py).
Each task has its own API key (`Authorization: Bearer` or `x-api-key`); the answer
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
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

import orjson

from fleet import dialect_messages, dialect_responses, dialects, workloads
from fleet.services import HttpError, JsonService, TaskEntry, TaskRegistry

MODEL_ID = "sandfleet-script"
ASIDE = "OK."  # the answer to a side request (no tools, no fenced block) in the Messages and Responses APIs
ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def count_tool_results(messages: list) -> int:
    return sum(1 for m in messages if dialects.tool_step_done(m))


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
        self.responses = dialect_responses.Memory()  # what previous_response_id names
        self.asides: dict[str, int] = {}  # per task: side requests answered in the Messages/Responses APIs

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
        anthropic = bool(h.headers.get("anthropic-version"))  # an Anthropic client lists models in its own shape
        if method == "GET" and path in ("/v1/models", "/models"):
            if anthropic:
                return self._send_json(h, 200, {"data": [dialect_messages.model_info(MODEL_ID)], "has_more": False,
                                                "first_id": MODEL_ID, "last_id": MODEL_ID})
            return self._send_json(h, 200, {"object": "list", "data": [
                {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "sandfleet"}]})
        if method == "GET" and path.startswith(("/v1/models/", "/models/")):
            if anthropic:
                return self._send_json(h, 200, dialect_messages.model_info(path.rsplit("/", 1)[1]))
            return self._send_json(h, 200, {"id": path.rsplit("/", 1)[1], "object": "model", "created": 0,
                                            "owned_by": "sandfleet"})
        if method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            with self.registry.answering(entry.key):  # a model call: the attempt is alive (cluster/wave/silence.py)
                return self._chat(h, entry)
        if method == "POST" and path in dialect_messages.PATHS:
            with self.registry.answering(entry.key):
                return self._messages(h, entry)
        if method == "POST" and path in dialect_messages.COUNT_PATHS:
            return self._count_tokens(h)
        if method == "POST" and path in dialect_responses.PATHS:
            with self.registry.answering(entry.key):
                return self._responses(h, entry)
        raise HttpError(404, f"no route {method} {path}; this endpoint serves POST /v1/chat/completions, "
                        "POST /v1/messages (+ /count_tokens), POST /v1/responses and GET /v1/models",
                        code="not_found")

    def error_body(self, path: str, err: HttpError) -> dict:
        """Anthropic's error shape on the Messages API's paths, OpenAI's elsewhere."""
        if path.startswith(dialect_messages.PATHS):
            return dialect_messages.error_body(err)
        return err.body()

    def _send_json(self, h, status, payload) -> None:
        self.send_json(h, status, payload)

    def _answer(self, entry: TaskEntry, chat: dict, msgs: list, stream: bool, t0: float, attempt, api: str):
        """The step a conversation (in chat form) is at and the answer to it, in the form the request asks for
        (fleet/dialects.py); a request no form serves is logged as refused and answered 400."""
        script = self._script(entry)
        wl = workloads.get(entry.workload)
        try:
            dialect, mismatch = dialects.detect(chat, {t["function"]["name"] for t in wl.tools()}, self.pinned)
        except dialects.DialectError as exc:
            self.log.append({"t": t0, "t_done": time.time(), "task": entry.task_id, "attempt": attempt,
                             "attempt_at_end": entry.attempt, "step": None, "kind": "refused", "tool": None,
                             "id": None, "stream": stream, "prompt_tokens": 0, "completion_tokens": 0, "tokens": 0,
                             "delivered": False, "dialect": None if api == "chat" else api,
                             "refused": str(exc)[:300]})
            raise HttpError(400, f"sandfleet cannot answer this request: {exc}", param="tools",
                            code="unsupported_dialect") from None
        prompt_tokens = 8 + sum(len(orjson.dumps(m)) // 4 for m in msgs)
        if api != "chat" and not chat.get("tools") and dialect.kind == "tools" and self.pinned is None:
            # no tools and no fenced block: not the agent's loop but a side request of its own (Claude Code's
            # title, topic or quota calls): answered, not a step, not a boundary, not in model-calls.jsonl
            return _Answer(dialect, None, None, None, ASIDE, "aside", None, prompt_tokens, 2)
        step = dialects.step_of(msgs, dialect)
        if self.think_ms:
            time.sleep(self.think_ms / 1000)
        call = text = None
        if step < len(script) and dialect.kind == "text":
            s = script[step]
            text, completion_tokens, kind, tool = dialects.text_answer(s, dialect.fence), s.completion_tokens, \
                "tool", s.tool
        elif step < len(script):
            s = script[step]
            call, completion_tokens, kind, tool = dialects.tool_call_arguments(s, dialect), s.completion_tokens, \
                "tool", s.tool
        else:
            text = wl.final_message(entry.seed, entry.steps)
            if dialect.kind == "text":
                text = dialects.text_final(text, self.finish, dialect.fence)
            completion_tokens, kind, tool = 4 + len(text) // 4, "final", None
        return _Answer(dialect, mismatch, step, call, text, kind, tool, prompt_tokens, completion_tokens)

    def _record(self, entry: TaskEntry, a: "_Answer", t0: float, attempt, cid: str, stream: bool, delivered: bool,
                api: str) -> None:
        """One model call in model-calls.jsonl (the same fields in every API; `dialect` names the API unless it is
        Chat Completions, where it names the form, and `form` the form of the answer). An aside is only counted."""
        if a.kind == "aside":
            with self._lock:
                self.asides[entry.task_id] = self.asides.get(entry.task_id, 0) + 1
            return
        if delivered:
            with self._lock:
                self._delivered[entry.task_id] = self._delivered.get(entry.task_id, 0) + 1
        self.log.append({"t": t0, "t_done": time.time(), "task": entry.task_id, "attempt": attempt,
                         "attempt_at_end": entry.attempt, "step": a.step, "kind": a.kind, "tool": a.tool, "id": cid,
                         "stream": stream, "prompt_tokens": a.prompt_tokens,
                         "completion_tokens": a.completion_tokens,
                         "tokens": a.prompt_tokens + a.completion_tokens, "delivered": delivered,
                         "dialect": a.dialect.kind if api == "chat" else api, "form": a.dialect.kind,
                         **({"dialect_mismatch": a.mismatch} if a.mismatch else {})})

    def _chat(self, h: BaseHTTPRequestHandler, entry: TaskEntry) -> None:
        t0 = time.time()
        attempt = entry.attempt
        body = self.read_json(h)
        msgs, stream, opts = validate(body)
        a = self._answer(entry, body, msgs, stream, t0, attempt, "chat")
        cid = "chatcmpl-" + secrets.token_hex(12)
        created = int(t0)
        model = body["model"]
        if a.call is not None:
            call = {"id": "call_" + secrets.token_hex(12), "type": "function",
                    "function": {"name": a.call[0], "arguments": orjson.dumps(a.call[1]).decode()}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": a.text, "refusal": None}
            finish = "stop"
        usage = {"prompt_tokens": a.prompt_tokens, "completion_tokens": a.completion_tokens,
                 "total_tokens": a.prompt_tokens + a.completion_tokens}
        if stream:
            delivered = self._stream(h, cid, created, model, message, finish, usage, bool(opts.get("include_usage")))
        else:
            delivered = self.send_json(h, 200, {
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "system_fingerprint": "sandfleet-script",
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": usage})
        self._record(entry, a, t0, attempt, cid, stream, delivered, "chat")

    def _messages(self, h: BaseHTTPRequestHandler, entry: TaskEntry) -> None:
        """Anthropic Messages (fleet/dialect_messages.py)."""
        t0 = time.time()
        attempt = entry.attempt
        body = self.read_json(h)
        _, stream = dialect_messages.validate(body)
        chat = dialect_messages.to_chat(body)
        a = self._answer(entry, chat, chat["messages"], stream, t0, attempt, dialect_messages.NAME)
        mid = "msg_" + secrets.token_hex(12)
        msg = dialect_messages.message(mid, body["model"], a.call, a.text,
                                       dialect_messages.usage(a.prompt_tokens, a.completion_tokens))
        if stream:
            delivered = self.write_sse(h, dialect_messages.stream_events(msg))
        else:
            delivered = self.send_json(h, 200, msg)
        self._record(entry, a, t0, attempt, mid, stream, delivered, dialect_messages.NAME)

    def _count_tokens(self, h: BaseHTTPRequestHandler) -> None:
        """`/v1/messages/count_tokens`: the prompt tokens a call with this body would be counted (not a model call:
        not logged, no step)."""
        body = self.read_json(h)
        dialect_messages.validate(body, counting=True)
        msgs = dialect_messages.to_chat(body)["messages"]
        self.send_json(h, 200, {"input_tokens": 8 + sum(len(orjson.dumps(m)) // 4 for m in msgs)})

    def _responses(self, h: BaseHTTPRequestHandler, entry: TaskEntry) -> None:
        """OpenAI Responses (fleet/dialect_responses.py), `previous_response_id` from the endpoint's memory."""
        t0 = time.time()
        attempt = entry.attempt
        body = self.read_json(h)
        items, stream = dialect_responses.validate(body)
        prev = body.get("previous_response_id")
        earlier = self.responses.chain(entry.task_id, prev) if prev else []
        chat = dialect_responses.to_chat(body, earlier + items)
        a = self._answer(entry, chat, chat["messages"], stream, t0, attempt, dialect_responses.NAME)
        rid = "resp_" + secrets.token_hex(24)
        item = dialect_responses.output_item(a.call, a.text)
        resp = dialect_responses.response(rid, body, item,
                                          dialect_responses.usage(a.prompt_tokens, a.completion_tokens), t0)
        if body.get("store", True) is not False:
            self.responses.remember(entry.task_id, rid, prev, items + [item])
        if stream:
            delivered = self.write_sse(h, dialect_responses.stream_events(resp))
        else:
            delivered = self.send_json(h, 200, resp)
        self._record(entry, a, t0, attempt, rid, stream, delivered, dialect_responses.NAME)

    @staticmethod
    def write_sse(h, events: list[bytes]) -> bool:
        """Server-Sent Events, one chunk each; False when the client hung up before the last."""
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
        return ModelEndpoint.write_sse(h, events)


@dataclass(frozen=True)
class _Answer:
    """What the script answers one call: a tool call `(name, arguments)` or a text, and what is logged of it."""
    dialect: dialects.Dialect
    mismatch: str | None
    step: int | None
    call: tuple[str, dict] | None
    text: str | None
    kind: str  # tool | final | aside
    tool: str | None
    prompt_tokens: int
    completion_tokens: int
