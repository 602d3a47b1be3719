"""The reference runner (a black box that follows the runner contract).

For each step it asks the model once, commits the tool call to the store in one
conditional write (`IfNoneMatch="*"` on `journal/<step>`, carrying the fence),
then runs the tool. On resume it replays the journal: the workspace is rebuilt
by re-running the recorded patches, the conversation is rebuilt from the
recorded calls, and the model is never asked again for a recorded step. An
external effect carries an `Idempotency-Key` derived from the task and the
effect, so re-running a recorded `publish` after a kill is a deduplicated retry,
never a second effect. A commit that loses the race (412: a zombie or an earlier
attempt committed that step) adopts the committed record.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from agentkit import (Env, TaskStore, announce, apply_patch, chat, log, main_guard, publish,  # noqa: E402
                      run_tests, tool_messages)


def run_tool(env: Env, call: dict) -> str:
    name = call["function"]["name"]
    args = json.loads(call["function"]["arguments"] or "{}")
    if name == "apply_patch":
        return apply_patch(env, args)
    if name == "publish":
        out = publish(env, args, idempotency_key=f"{env.task_id}:{args['effect_id']}")
        return json.dumps({"receipt": out["receipt"]})
    if name == "run_tests":
        return run_tests(env)
    return f"error: unknown tool {name}"


def run() -> None:
    env = Env.load()
    store = TaskStore(env)
    jprefix = f"{env.prefix}journal/"
    messages = env.first_messages()
    done = 0
    for key in store.keys("journal/"):
        rec = json.loads(store.get(key))
        if rec["step"] != done:
            raise RuntimeError(f"journal gap: expected step {done}, found {rec['step']} at {key}")
        messages += tool_messages(rec["call"], run_tool(env, rec["call"]))
        done += 1
    log(f"resumed attempt={env.attempt} fence={env.fence} recorded_steps={done}")

    step = done
    while True:
        announce(env, f"before-model:{step}")
        reply = chat(env, messages)
        if not reply.get("tool_calls"):
            log(f"final: {reply.get('content')}")
            break
        call = reply["tool_calls"][0]
        call = {"id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}
        record = {"step": step, "call": call, "fence": env.fence, "attempt": env.attempt}
        announce(env, f"before-commit:{step}")
        key = f"{jprefix}{step:04d}.json"
        if not store.put_new(key, json.dumps(record).encode()):
            log(f"commit {key} lost the race; adopting the committed record")
            record = json.loads(store.get(key))
        log(f"step {step} committed fence={record['fence']}")
        announce(env, f"after-commit:{step}")
        messages += tool_messages(record["call"], run_tool(env, record["call"]))
        step += 1


if __name__ == "__main__":
    main_guard(run)
