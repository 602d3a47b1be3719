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

On a kept disk (`sandbox.disk: keep`) the workspace holds what the killed attempt did; a resumed attempt first lays
the repo anew from the base it kept at its first attempt (`.durable/base.tar`), so no recorded step lands twice.

A record is trusted only if it reads back as the record of its step: the store can
hold an EMPTY object where a write was made (a PUT cut after its head, fault ST6,
docs/store-hazards.md). An unreadable record is removed and its step done again.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from agentkit import (Env, Snapshots, TaskStore, announce, apply_edits, apply_patch, chat, log,  # noqa: E402
                      main_guard, publish, repo_base, reset_repo, run_command, run_tests, tool_messages, untar_repo)

SNAPSHOT_EVERY = 3  # a workspace snapshot (multipart upload) after every 3rd step


def run_tool(env: Env, call: dict) -> str:
    name = call["function"]["name"]
    args = json.loads(call["function"]["arguments"] or "{}")
    if name == "apply_patch":
        return apply_patch(env, args)
    if name == "apply_edits":
        return apply_edits(env, args)
    if name == "run_command":
        out = run_command(env, args)
        if not out.startswith("exit 0"):  # e.g. ENOSPC: fail the attempt; the next one replays the step
            raise RuntimeError(f"tool run_command failed: {out[:300]}")
        return out
    if name == "publish":
        out = publish(env, args, idempotency_key=f"{env.task_id}:{args['effect_id']}")
        return json.dumps({"receipt": out["receipt"]})
    if name == "run_tests":
        return run_tests(env)
    return f"error: unknown tool {name}"


def parse(raw: bytes | None, step: int) -> dict | None:
    """The journal record of `step`, or None when the bytes are not one (missing, empty, torn, other step)."""
    try:
        rec = json.loads(raw or b"")
        return rec if rec.get("step") == step and rec.get("call", {}).get("function") else None
    except (ValueError, AttributeError):
        return None


def is_placeholder(raw: bytes | None, fence: int) -> bool:
    try:
        rec = json.loads(raw or b"")
        return bool(rec.get("placeholder")) and rec.get("fence") == fence
    except (ValueError, AttributeError):
        return False


def commit(store: TaskStore, key: str, record: dict) -> dict:
    """Create the step's record, or adopt the one already committed; replace one that is unreadable (or
    this attempt's own placeholder from `claim`, which a lagging store may not even show yet)."""
    for _ in range(3):
        if store.put_new(key, json.dumps(record).encode()):
            return record
        raw = store.get(key)
        got = parse(raw, record["step"])
        if got is not None:
            log(f"commit {key} lost the race; adopting the committed record")
            return got
        if raw is None or is_placeholder(raw, record["fence"]):
            # this attempt's own claim (a lagging store may not show it yet): overwrite it in one write, so
            # there is never a moment with neither the claim nor the record
            store.put(key, json.dumps(record).encode())
            log(f"commit {key}: replaced this attempt's placeholder")
            return record
        log(f"commit {key}: the committed object is unreadable (the store emptied it?); replacing it")
        store.delete(key)
    raise RuntimeError(f"cannot commit {key}: the store keeps an unreadable object there")


def claim(store: TaskStore, key: str, step: int, fence: int) -> bool:
    """Resuming: is step `step` really unrecorded? A store that lags after writes (reads and listings miss
    a new object for a while) can hide a record an earlier attempt made; only a conditional create tells:
    True = created a placeholder (not recorded), False = an object is there (recorded, not yet visible)."""
    return store.put_new(key, json.dumps({"step": step, "placeholder": True, "fence": fence}).encode())


def read_visible(store: TaskStore, key: str, wait_s: float = 30.0) -> bytes | None:
    """Read an object the store says exists, waiting (bounded) while it lags."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        raw = store.get(key)
        if raw is not None or time.monotonic() > deadline:
            return raw
        time.sleep(0.2)


def run() -> None:
    env = Env.load()
    base = repo_base(env)  # the repo as handed over (kept at the first attempt): a kept disk is replayed from it
    if env.attempt > 1:
        reset_repo(env, base)
    store = TaskStore(env)
    snaps = Snapshots(store)
    if env.attempt > 1:
        stale = snaps.abort_stale()
        if stale:
            log(f"aborted {stale} snapshot upload(s) an earlier attempt left incomplete")
    jprefix = f"{env.prefix}journal/"
    messages = env.first_messages()
    records = []
    listed = store.keys("journal/")  # a hint only: each record is read by its own key
    while True:
        done = len(records)
        key = f"{jprefix}{done:04d}.json"
        raw = store.get(key)
        if raw is None and any(k > key for k in listed):  # a later record is listed: this one lags
            raw = read_visible(store, key)
        if raw is None and env.attempt > 1 and not claim(store, key, done, env.fence):
            log(f"journal {key} exists but does not read yet (a lagging store); waiting for it")
            raw = read_visible(store, key)
        if raw is None or is_placeholder(raw, env.fence):
            break
        rec = parse(raw, done)
        if rec is None:  # not a record: the step was not durably recorded; do it again from here
            log(f"journal {key} is unreadable; removing it and resuming from step {done}")
            store.delete(key)
            break
        records.append(rec)
    done = len(records)
    snap = snaps.latest(below=done) if done else None
    if snap is not None:  # the workspace up to that step comes back from the snapshot, the rest is replayed
        log(f"restored snapshot of step {snap[0]} ({untar_repo(env, snap[1])} files)")
    for rec in records:
        restored = snap is not None and rec["step"] <= snap[0] and rec["call"]["function"]["name"] != "publish"
        messages += tool_messages(rec["call"], "ok (restored)" if restored else run_tool(env, rec["call"]))
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
        record = commit(store, key, record)
        log(f"step {step} committed fence={record['fence']}")
        announce(env, f"after-commit:{step}")
        messages += tool_messages(record["call"], run_tool(env, record["call"]))
        if (step + 1) % SNAPSHOT_EVERY == 0:
            snaps.save(step)
            log(f"snapshot of step {step} saved")
        step += 1
    if env.attempt > 1:
        snaps.abort_stale()  # nothing of this task's is left half-uploaded when it ends


if __name__ == "__main__":
    main_guard(run)
