"""The Anthropic Messages API as the scripted model speaks it (`POST /v1/messages`, `/v1/messages/count_tokens`).

A request is read into the chat form fleet/dialects.py already knows (tools as functions, each `tool_result` block
a tool message), so the form of the answer (`tools`, `shell`, `text`) and the step are chosen exactly as for Chat
Completions; the answer goes back as the API writes it: `content` blocks (`tool_use` with `input`, or `text`),
`stop_reason` `tool_use` / `end_turn`, `usage` with `input_tokens` / `output_tokens`, and with `stream: true` the
API's SSE events (message_start, content_block_start, ping, content_block_delta with input_json_delta or text_delta,
content_block_stop, message_delta, message_stop). Errors are the API's `{"type": "error", "error": {...}}`.
"""
from __future__ import annotations

import secrets

import orjson

from fleet.services import HttpError

NAME = "messages"
PATHS = ("/v1/messages", "/messages")
COUNT_PATHS = ("/v1/messages/count_tokens", "/messages/count_tokens")
# Anthropic's error type per status (docs: errors)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 411: "invalid_request_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}
# the API's schema-less client tools whose one input is a shell command (Anthropic's "bash tool")
BASH_TOOL_TYPES = ("bash_20241022", "bash_20250124")


def error_body(err: HttpError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(err.status, "api_error"), "message": err.message}}


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(b.get("text", "") for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def validate(body: dict, counting: bool = False) -> tuple[list, bool]:
    """The API's own checks on what a step needs; returns (messages, stream). `count_tokens` takes no max_tokens."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise HttpError(400, "model: Field required")
    if not counting and (not isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_tokens"), bool)
                         or body["max_tokens"] < 1):
        raise HttpError(400, "max_tokens: Field required (an integer of at least 1)")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise HttpError(400, "messages: must be a non-empty list of {role: user|assistant, content}")
    for i, m in enumerate(msgs):
        # Claude Code 2.1 sends its environment as a `system` message among the turns (and retries without it on
        # a 400): it is read as system text, never a turn
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise HttpError(400, f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'")
        c = m.get("content")
        if not isinstance(c, str) and not (isinstance(c, list) and all(isinstance(b, dict) and
                                                                       isinstance(b.get("type"), str) for b in c)):
            raise HttpError(400, f"messages.{i}.content: a string or a list of blocks, each with a type")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) and isinstance(t.get("name"),
                                                                                                     str)
                                                                  for t in tools)):
        raise HttpError(400, "tools: a list of {name, description, input_schema}")
    if not isinstance(body.get("system", ""), (str, list)):
        raise HttpError(400, "system: a string or a list of text blocks")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise HttpError(400, "stream: Input should be a valid boolean")
    return msgs, bool(stream)


def to_chat(body: dict) -> dict:
    """The request in chat form: `tools` as functions, `system` a system message, every `tool_result` block a tool
    message (a user turn holding results and text gives the tool messages, then the text)."""
    fns = []
    for t in body.get("tools") or []:
        if isinstance(t.get("input_schema"), dict):
            fns.append({"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}})
        elif t.get("type") in BASH_TOOL_TYPES:
            fns.append({"type": "function", "function": {"name": t["name"], "parameters": {
                "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}})
    msgs = []
    system = _text(body.get("system"))
    if system:
        msgs.append({"role": "system", "content": system})
    for m in body["messages"]:
        c = m["content"]
        if m["role"] == "system":
            msgs.append({"role": "system", "content": _text(c)})
            continue
        if m["role"] == "assistant":
            msgs.append({"role": "assistant", "content": _text(c)})
            continue
        blocks = c if isinstance(c, list) else [{"type": "text", "text": c}]
        for b in blocks:
            if b.get("type") == "tool_result":
                msgs.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": _text(b.get("content"))})
        rest = [b for b in blocks if b.get("type") != "tool_result"]
        if rest or not blocks:
            msgs.append({"role": "user", "content": _text(rest)})
    return {"messages": msgs, "tools": fns}


def model_info(model_id: str) -> dict:
    """`GET /v1/models` as the Messages API lists a model (asked with an `anthropic-version` header)."""
    return {"type": "model", "id": model_id, "display_name": model_id, "created_at": "1970-01-01T00:00:00Z"}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"input_tokens": prompt_tokens, "output_tokens": completion_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0, "service_tier": "standard"}


def message(mid: str, model: str, call: tuple[str, dict] | None, text: str | None, use: dict) -> dict:
    """The answer: one `tool_use` block (stop_reason tool_use) or one `text` block (end_turn)."""
    if call is not None:
        content = [{"type": "tool_use", "id": "toolu_" + secrets.token_hex(12), "name": call[0], "input": call[1]}]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": text}]
        stop = "end_turn"
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop, "stop_sequence": None, "usage": use}


def _event(kind: str, obj: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **obj}) + b"\n\n"


def stream_events(msg: dict) -> list[bytes]:
    """The SSE events the API sends for `msg`, in its order, deltas cut in pieces as a model would stream them."""
    block = msg["content"][0]
    start = dict(msg, content=[], stop_reason=None, stop_sequence=None,
                 usage=dict(msg["usage"], output_tokens=1))
    out = [_event("message_start", {"message": start})]
    if block["type"] == "tool_use":
        out.append(_event("content_block_start", {"index": 0, "content_block": dict(block, input={})}))
        out.append(_event("ping", {}))
        args = orjson.dumps(block["input"]).decode()
        for i in range(0, len(args), 48):
            out.append(_event("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta",
                                                                            "partial_json": args[i:i + 48]}}))
    else:
        out.append(_event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}))
        out.append(_event("ping", {}))
        text = block["text"]
        for i in range(0, len(text), 24):
            out.append(_event("content_block_delta", {"index": 0, "delta": {"type": "text_delta",
                                                                            "text": text[i:i + 24]}}))
    out.append(_event("content_block_stop", {"index": 0}))
    out.append(_event("message_delta", {"delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                                        "usage": {"output_tokens": msg["usage"]["output_tokens"]}}))
    out.append(_event("message_stop", {}))
    return out
