"""The negative control (a black box that follows the runner contract).

It mirrors the repository into the store in place after every step, saves its
conversation only every 3 steps, sends external effects without an
Idempotency-Key, and on resume starts again from the saved conversation over the
mirrored (already patched) files, asking the model again for every step since.
An interruption between two saves therefore applies patches twice, sends
effects twice and re-asks the model.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from agentkit import (Env, TaskStore, apply_patch, announce, chat, log, main_guard, publish,  # noqa: E402
                      run_tests, tool_messages)

CHECKPOINT_EVERY = 3


def run() -> None:
    env = Env.load()
    store = TaskStore(env)
    repo = os.path.join(env.workspace, "repo")
    saved = store.get(f"{env.prefix}naive/progress.json")
    messages = json.loads(saved)["messages"] if saved else env.first_messages()
    for key in store.keys("naive/repo/"):  # whatever is mirrored now, including unsaved in-place patches
        path = os.path.join(repo, key[len(env.prefix + "naive/repo/"):])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(store.get(key))
    step = sum(1 for m in messages if m["role"] == "tool")
    log(f"resumed attempt={env.attempt} from progress={step}")
    while True:
        announce(env, f"before-model:{step}")
        reply = chat(env, messages)
        if not reply.get("tool_calls"):
            break
        call = reply["tool_calls"][0]
        name, args = call["function"]["name"], json.loads(call["function"]["arguments"] or "{}")
        if name == "apply_patch":
            result = apply_patch(env, args)
            with open(os.path.join(repo, args["path"]), "rb") as f:
                store.put(f"{env.prefix}naive/repo/{args['path']}", f.read())
            log(f"step {step} applied in place")
        elif name == "publish":
            result = json.dumps(publish(env, args, idempotency_key=None))
            log(f"step {step} published")
        else:
            result = run_tests(env)
        messages += tool_messages({"id": call["id"], "type": "function", "function": call["function"]}, result)
        step += 1
        if step % CHECKPOINT_EVERY == 0:
            store.put(f"{env.prefix}naive/progress.json", json.dumps({"messages": messages}).encode())
            log(f"progress saved at {step}")


if __name__ == "__main__":
    main_guard(run)
