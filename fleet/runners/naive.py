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

from agentkit import (Env, TaskStore, announce, apply_edits, apply_patch, chat, log, main_guard,  # noqa: E402
                      publish, run_command, run_tests, tool_messages)

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

    def mirror(path: str) -> None:
        with open(os.path.join(repo, path), "rb") as f:
            store.put(f"{env.prefix}naive/repo/{path}", f.read())

    def snapshot() -> dict[str, bytes]:
        out = {}
        for root, _, names in os.walk(repo):
            for n in names:
                p = os.path.join(root, n)
                with open(p, "rb") as f:
                    out[os.path.relpath(p, repo)] = f.read()
        return out
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
            mirror(args["path"])
            log(f"step {step} applied in place")
        elif name == "apply_edits":
            result = apply_edits(env, args, after_file=mirror)  # each file mirrored as soon as it is edited
            log(f"step {step} edited in place")
        elif name == "run_command":
            before = snapshot()
            result = run_command(env, args)
            for path in sorted(p for p, body in snapshot().items() if before.get(p) != body):
                mirror(path)
            log(f"step {step} ran a command in place")
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
