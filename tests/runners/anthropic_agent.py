"""A minimal agent loop on the `anthropic` SDK (the Messages API), or with AGENT_API=responses on the `openai`
SDK's Responses API: call the model with the workload's tools, run each tool call locally as the built-in runners
do (fleet/runners/durable.py's `run_tool`, by path), send its result back, stop at the first answer without one.

The client is configured by the contract's environment alone (`ANTHROPIC_BASE_URL` / `ANTHROPIC_API_KEY`, or
`OPENAI_BASE_URL` / `OPENAI_API_KEY`). It keeps no state: a resumed attempt starts the conversation over (the grader
names the re-asked steps `no_model_recall`). Odd steps stream (`messages.stream` / `stream=True`), even ones do not,
so one run proves both forms of each API end to end. Responses requests chain by `previous_response_id` on every
other step.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "fleet", "runners"))

from agentkit import Env, log, main_guard  # noqa: E402
from durable import run_tool  # noqa: E402

S = {"type": "string"}
SCHEMAS = {  # the contract's tools (docs/runner-contract.md, "The model endpoint")
    "apply_patch": {"type": "object", "properties": {"path": S, "append": S}, "required": ["path", "append"]},
    "apply_edits": {"type": "object", "properties": {"edits": {"type": "array", "items": {
        "type": "object", "properties": {"path": S, "old": S, "new": S}, "required": ["path", "old", "new"]}}},
        "required": ["edits"]},
    "run_command": {"type": "object", "properties": {"command": S, "timeout_s": {"type": "number"}},
                    "required": ["command"]},
    "publish": {"type": "object", "properties": {"effect_id": S, "channel": S, "text": S},
                "required": ["effect_id", "channel", "text"]},
    "run_tests": {"type": "object", "properties": {}},
}
PROMPT = "Carry out the task's plan step by step with the tools; answer without a tool when it is done."
MAX_STEPS = 200


def _call(name: str, arguments: str) -> dict:
    return {"function": {"name": name, "arguments": arguments}}


def messages_loop(env: Env) -> None:
    import anthropic

    client = anthropic.Anthropic()  # ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY
    tools = [{"name": n, "description": n.replace("_", " "), "input_schema": s} for n, s in SCHEMAS.items()]
    msgs: list[dict] = [{"role": "user", "content": f"Task {env.task_id}. {PROMPT}"}]
    for step in range(MAX_STEPS):
        kw = dict(model="sandfleet-script", max_tokens=4096, system="You are a coding agent.", tools=tools,
                  messages=msgs)
        if step % 2:
            with client.messages.stream(**kw) as stream:
                reply = stream.get_final_message()
        else:
            reply = client.messages.create(**kw)
        uses = [b for b in reply.content if b.type == "tool_use"]
        log(f"step {step}: stop_reason {reply.stop_reason}, {[u.name for u in uses]}")
        if reply.stop_reason != "tool_use" or not uses:
            return
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        msgs.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": u.id, "content": run_tool(env, _call(u.name, json.dumps(u.input)))}
            for u in uses]})
    raise RuntimeError(f"no end after {MAX_STEPS} model calls")


def responses_loop(env: Env) -> None:
    from openai import OpenAI

    client = OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY
    tools = [{"type": "function", "name": n, "description": n.replace("_", " "), "parameters": s}
             for n, s in SCHEMAS.items()]
    items: list[dict] = [{"role": "user", "content": f"Task {env.task_id}. {PROMPT}"}]
    prev, sent = None, 0  # the last response's id, and how many of `items` it already holds
    for step in range(MAX_STEPS):
        kw = dict(model="sandfleet-script", instructions="You are a coding agent.", tools=tools)
        if prev and step % 2:  # only what is new since the last response, named by its id
            kw.update(input=items[sent:], previous_response_id=prev)
        else:
            kw.update(input=items)
        if step % 2:
            done = [e for e in client.responses.create(stream=True, **kw) if e.type == "response.completed"]
            reply = done[0].response
        else:
            reply = client.responses.create(**kw)
        calls = [o for o in reply.output if o.type == "function_call"]
        log(f"step {step}: {[c.name for c in calls]}")
        if not calls:
            return
        items += [c.model_dump(exclude_none=True) for c in calls]
        prev, sent = reply.id, len(items)
        items += [{"type": "function_call_output", "call_id": c.call_id,
                   "output": run_tool(env, _call(c.name, c.arguments))} for c in calls]
    raise RuntimeError(f"no end after {MAX_STEPS} model calls")


def main() -> None:
    env = Env.load()
    os.makedirs(os.path.join(env.workspace, "repo"), exist_ok=True)
    (responses_loop if os.environ.get("AGENT_API") == "responses" else messages_loop)(env)


if __name__ == "__main__":
    main_guard(main)
