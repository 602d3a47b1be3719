"""The OpenAI Responses API as the scripted model speaks it (`POST /v1/responses`).

A request (its `instructions`, its `input` items, and the items of the response named by `previous_response_id`)
is read into the chat form fleet/dialects.py knows: `function_call_output` items are tool messages, function tools
are functions. So the form of the answer and the step are chosen as for Chat Completions. The answer is a
`response` whose `output` is one `function_call` item (`call_id`, `name`, `arguments` as a JSON string) or one
`message` item with `output_text`; with `stream: true`, the API's typed SSE events, each with its
`sequence_number`. Errors keep OpenAI's `{"error": {...}}` shape.

`previous_response_id` is served: the endpoint remembers each stored response's items (the request's `store` is
not false), per task, the latest `REMEMBERED` of them and `REMEMBERED_BYTES` of items at most; an id it does not
hold (another task's, forgotten, or from before the driver restarted) is a 400 `previous_response_not_found`, as
the API answers.
"""
from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict

import orjson

from fleet.services import HttpError

NAME = "responses"
PATHS = ("/v1/responses", "/responses")
REMEMBERED = 4096  # stored responses the endpoint keeps (all tasks), oldest forgotten first
REMEMBERED_BYTES = 64 * 1024 * 1024  # and their items' JSON size at most (an agent that resends its whole
# conversation with `store` on costs the square of its length: the driver's heap stays bounded all the same)
OUTPUT_TYPES = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def validate(body: dict) -> tuple[list, bool]:
    """The API's checks on what a step needs; returns (input items, stream)."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise HttpError(400, "Missing required parameter: 'model'.", param="model", code="missing_required_parameter")
    inp = body.get("input")
    if isinstance(inp, str):
        inp = [{"role": "user", "content": inp}]
    if not isinstance(inp, list) or not all(isinstance(i, dict) for i in inp):
        raise HttpError(400, "'input' must be a string or an array of input items", param="input")
    for n, item in enumerate(inp):
        if item.get("type") in (None, "message") and item.get("role") not in ("user", "assistant", "system",
                                                                                "developer"):
            raise HttpError(400, f"input[{n}].role must be one of user, assistant, system, developer",
                            param=f"input[{n}].role")
        if item.get("type") in OUTPUT_TYPES and not isinstance(item.get("call_id"), str):
            raise HttpError(400, f"input[{n}].call_id: Missing required parameter", param=f"input[{n}].call_id",
                            code="missing_required_parameter")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise HttpError(400, "'tools' must be an array of tool objects", param="tools")
    prev = body.get("previous_response_id")
    if prev is not None and not isinstance(prev, str):
        raise HttpError(400, "'previous_response_id' must be a string", param="previous_response_id")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise HttpError(400, "'stream' must be a boolean", param="stream")
    return inp, bool(stream)


class Memory:
    """Stored responses' items by id, per task (what `previous_response_id` names): a response keeps its parent's
    id and only its own input and output items, so a long chain costs one copy of each item."""

    def __init__(self, limit: int = REMEMBERED, max_bytes: int = REMEMBERED_BYTES):
        self.limit, self.max_bytes = limit, max_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[str, str | None, list, int]] = OrderedDict()
        self._bytes = 0

    def chain(self, task_id: str, rid: str) -> list:
        """The items of the conversation up to and including response `rid`, oldest first."""
        parts = []
        with self._lock:
            cur: str | None = rid
            while cur is not None:
                got = self._items.get(cur)
                if got is None or got[0] != task_id:
                    raise HttpError(400, f"Previous response with id '{cur}' not found.",
                                    param="previous_response_id", code="previous_response_not_found")
                parts.append(got[2])
                cur = got[1]
        return [i for p in reversed(parts) for i in p]

    def remember(self, task_id: str, rid: str, parent: str | None, items: list) -> None:
        size = len(orjson.dumps(items))
        with self._lock:
            self._items[rid] = (task_id, parent, items, size)
            self._bytes += size
            while len(self._items) > self.limit or (self._bytes > self.max_bytes and len(self._items) > 1):
                self._bytes -= self._items.popitem(last=False)[1][3]


def to_chat(body: dict, items: list) -> dict:
    """`instructions` and the items (earlier responses' first) in chat form."""
    fns = [{"type": "function", "function": {"name": t["name"], "parameters": t.get("parameters") or {}}}
           for t in body.get("tools") or [] if t.get("type") == "function" and isinstance(t.get("name"), str)]
    msgs = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        msgs.append({"role": "system", "content": body["instructions"]})
    for item in items:
        kind = item.get("type")
        if kind in (None, "message"):
            msgs.append({"role": item.get("role"), "content": _text(item.get("content"))})
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            msgs.append({"role": "assistant", "content": None})
        elif kind in OUTPUT_TYPES:
            out = item.get("output")
            msgs.append({"role": "tool", "tool_call_id": item.get("call_id"),
                         "content": out if isinstance(out, str) else _text(out)})
    return {"messages": msgs, "tools": fns}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens}


def output_item(call: tuple[str, dict] | None, text: str | None) -> dict:
    if call is not None:
        return {"type": "function_call", "id": "fc_" + secrets.token_hex(12), "call_id": "call_" +
                secrets.token_hex(12), "name": call[0], "arguments": orjson.dumps(call[1]).decode(),
                "status": "completed"}
    return {"type": "message", "id": "msg_" + secrets.token_hex(12), "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def response(rid: str, body: dict, item: dict, use: dict, created: float) -> dict:
    return {"id": rid, "object": "response", "created_at": int(created), "status": "completed",
            "completed_at": int(time.time()), "model": body["model"], "output": [item], "usage": use,
            "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
            "metadata": body.get("metadata") or {}, "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"), "store": body.get("store", True) is not False,
            "temperature": 1.0, "top_p": 1.0, "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "reasoning": {"effort": None, "summary": None}, "background": False, "max_output_tokens": None,
            "service_tier": "default", "user": None}


def stream_events(resp: dict) -> list[bytes]:
    """The API's events for `resp`, in its order, each with its `sequence_number`."""
    out: list[bytes] = []

    def ev(kind: str, **obj) -> None:
        out.append(b"event: " + kind.encode() + b"\ndata: " +
                   orjson.dumps({"type": kind, "sequence_number": len(out), **obj}) + b"\n\n")

    pending = dict(resp, status="in_progress", output=[], usage=None, completed_at=None)
    ev("response.created", response=pending)
    ev("response.in_progress", response=pending)
    item = resp["output"][0]
    if item["type"] == "function_call":
        ev("response.output_item.added", output_index=0, item=dict(item, arguments="", status="in_progress"))
        args = item["arguments"]
        for i in range(0, len(args), 48):
            ev("response.function_call_arguments.delta", item_id=item["id"], output_index=0, delta=args[i:i + 48])
        ev("response.function_call_arguments.done", item_id=item["id"], output_index=0, name=item["name"],
           arguments=args)
    else:
        part = item["content"][0]
        ev("response.output_item.added", output_index=0, item=dict(item, content=[], status="in_progress"))
        ev("response.content_part.added", item_id=item["id"], output_index=0, content_index=0,
           part=dict(part, text=""))
        for i in range(0, len(part["text"]), 24):
            ev("response.output_text.delta", item_id=item["id"], output_index=0, content_index=0,
               delta=part["text"][i:i + 24], logprobs=[])
        ev("response.output_text.done", item_id=item["id"], output_index=0, content_index=0, text=part["text"],
           logprobs=[])
        ev("response.content_part.done", item_id=item["id"], output_index=0, content_index=0, part=part)
    ev("response.output_item.done", output_index=0, item=item)
    ev("response.completed", response=resp)
    return out
