"""Runners that keep their state on the task's own disk, each with one planted crash-safety defect ($DEFECT). They
follow the runner contract and import nothing of the harness (only the built-in runners' toolkit, by path).

Each step is journaled first (one JSON line, write-ahead), then its tool runs; the journal is the first write of
each step, so a kill at the runner's Nth disk write lands on a journal append or a tool's write the same way on
every run.

- nosync_journal: it fsyncs every change it makes to the repo, but appends its journal with no fsync. On resume it
  trusts what the journal says was done and does not run those steps' tools again (the disk was kept, so their
  changes are there). A kill that keeps the disk (keep) leaves journal and repo agreeing: it passes. A power loss
  (lose-unsynced) keeps the repo's synced changes but loses the journal's lines: the steps are asked again and
  applied a second time (no_double_apply).
- unchecked_frames: the same journal with an fsync after every append, but read back with no frame check: a line
  torn by a power loss mid-append (torn) is not JSON, and it chokes on it (exit 1 on every attempt).
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "fleet", "runners"))

from agentkit import Env, chat, log, main_guard, tool_messages  # noqa: E402
from durable import run_tool  # noqa: E402

DEFECT = os.environ.get("DEFECT", "nosync_journal")


def journal_path(env: Env) -> str:
    return os.path.join(env.workspace, ".journal.jsonl")


def read_journal(env: Env) -> list[dict]:
    try:
        with open(journal_path(env)) as f:
            lines = [x for x in f.read().split("\n") if x]
    except FileNotFoundError:
        return []
    if DEFECT == "unchecked_frames":
        return [json.loads(x) for x in lines]  # a torn line is not JSON: it raises
    out = []
    for x in lines:  # (a torn last line is dropped: this defect is the missing fsync, not the frames)
        try:
            out.append(json.loads(x))
        except ValueError:
            break
    return out


def sync_repo(env: Env) -> None:
    for root, _, files in os.walk(os.path.join(env.workspace, "repo")):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def run() -> None:
    env = Env.load()
    messages = env.first_messages()
    records = read_journal(env)
    for rec in records:  # done before the kill, and on this kept disk: not run again
        messages += tool_messages(rec["call"], "ok (recorded)")
    log(f"resumed attempt={env.attempt} recorded_steps={len(records)} ({DEFECT})")
    step = len(records)
    while True:
        reply = chat(env, messages)
        if not reply.get("tool_calls"):
            log(f"final: {reply.get('content')}")
            break
        call = reply["tool_calls"][0]
        call = {"id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}
        new = not os.path.exists(journal_path(env))
        with open(journal_path(env), "a") as f:  # write-ahead: the step's record, then its tool
            f.write(json.dumps({"step": step, "call": call}) + "\n")
            if DEFECT == "unchecked_frames":
                f.flush()
                os.fsync(f.fileno())
        if DEFECT == "unchecked_frames" and new:  # its name is durable too (the directory fsynced once)
            fd = os.open(env.workspace, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        result = run_tool(env, call)
        sync_repo(env)
        messages += tool_messages(call, result)
        step += 1


if __name__ == "__main__":
    main_guard(run)
