"""The reference runner's local-journal variant: its state lives on the task's own disk, never in the store.

For each step it asks the model once, records the tool call as `.durable/journal/<step>.json` (a temp file,
fsync, rename, directory fsync: a power loss keeps a whole record or none) and then runs the tool. On resume it
lays the repo anew from the base it kept at its first attempt, replays the recorded calls (never asking the model
again for a recorded step; an external effect carries an `Idempotency-Key`, so its replay is deduplicated), and
stops at the first record that does not read back as its step (a torn or foreign file is removed with every record
after it: frame checks with truncation of a torn tail).

It survives every interruption that keeps the disk (`sandbox.disk: keep`). Under `wipe` its journal goes with the
disk, so a resumed attempt starts over and asks the model again: the league's way to tell local persistence from
none.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from agentkit import (Env, announce, chat, durable_write, log, main_guard, repo_base, reset_repo,  # noqa: E402
                      tool_messages)
from durable import parse, run_tool  # noqa: E402


def journal_dir(env: Env) -> str:
    return os.path.join(env.workspace, ".durable", "journal")


def read_journal(env: Env) -> list[dict]:
    """The recorded steps in order, up to the first record that is missing or does not read back as its step;
    anything after it (a torn tail) is removed, so a later record can never be mistaken for a contiguous one."""
    d = journal_dir(env)
    records: list[dict] = []
    names = sorted(os.listdir(d)) if os.path.isdir(d) else []
    while True:
        want = len(records)
        try:
            with open(os.path.join(d, f"{want:04d}.json"), "rb") as f:
                rec = parse(f.read(), want)
        except FileNotFoundError:
            rec = None
        if rec is None:
            break
        records.append(rec)
    keep = {f"{i:04d}.json" for i in range(len(records))}
    for name in names:
        if name not in keep:  # past the last whole record, or a temp file a kill left
            os.unlink(os.path.join(d, name))
            log(f"journal {name} is past the last whole record: removed")
    return records


def run() -> None:
    env = Env.load()
    base = repo_base(env)
    if env.attempt > 1:
        reset_repo(env, base)
    messages = env.first_messages()
    records = read_journal(env)
    for rec in records:
        messages += tool_messages(rec["call"], run_tool(env, rec["call"]))
    log(f"resumed attempt={env.attempt} fence={env.fence} recorded_steps={len(records)} (local journal)")
    step = len(records)
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
        durable_write(os.path.join(journal_dir(env), f"{step:04d}.json"), json.dumps(record).encode())
        log(f"step {step} recorded locally fence={env.fence}")
        announce(env, f"after-commit:{step}")
        messages += tool_messages(call, run_tool(env, call))
        step += 1


if __name__ == "__main__":
    main_guard(run)
