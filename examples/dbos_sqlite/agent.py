"""A DBOS durable workflow whose steps are the model calls and the tool calls, on SQLite.

DBOS Transact checkpoints every step's output in its system database and, on restart, recovers
the workflow and skips the steps already recorded. Here the system database is SQLite in the
workspace (`$SANDFLEET_WORKSPACE/state/dbos.sqlite`): durable against a crash of the Python
process, but it dies with the sandbox like the repo does. After a preemption the new attempt
starts the workflow over and asks the model again for every step (a control, like
`langgraph_sqlite`; a Postgres system database outside the sandbox is what would make it
durable). Its effects carry an Idempotency-Key, so the cost shows as model recalls, not as
double effects. DBOS runs fully offline here: no Postgres, no Conductor, no admin server.

It imports nothing of sandfleet; `OpenAI()` reads OPENAI_BASE_URL / OPENAI_API_KEY.
"""
from __future__ import annotations

import json
import os
import sys
import time
import urllib.request

from dbos import DBOS, SetWorkflowID
from openai import OpenAI

TASK = os.environ["SANDFLEET_TASK_ID"]
ATTEMPT = int(os.environ["SANDFLEET_ATTEMPT"])
FENCE = int(os.environ["SANDFLEET_FENCE"])
REPO = os.environ["SANDFLEET_REPO"]
EFFECTS_URL = os.environ["SANDFLEET_EFFECTS_URL"].rstrip("/")
EFFECTS_KEY = os.environ["SANDFLEET_EFFECTS_KEY"]
MODEL = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
STATE = os.path.join(os.environ.get("SANDFLEET_WORKSPACE", os.getcwd()), "state")
SYSTEM = "You are a coding agent. Patch the repository with the tools you are given, one call at a time."
TOOLS = [
    {"type": "function", "function": {
        "name": "apply_patch", "description": "Append one line to a file of the repository (path relative to repo/).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "append": {"type": "string"}},
                       "required": ["path", "append"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "publish", "description": "Send a message to a channel through the effects service.",
        "parameters": {"type": "object", "properties": {
            "effect_id": {"type": "string"}, "channel": {"type": "string"}, "text": {"type": "string"}},
            "required": ["effect_id", "channel", "text"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "run_tests", "description": "Run the repository's checks; read-only.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}},
]

os.makedirs(STATE, exist_ok=True)
DBOS(config={"name": "sandfleet-agent", "system_database_url": f"sqlite:///{STATE}/dbos.sqlite",
             "run_admin_server": False, "log_level": "WARNING"})
llm = OpenAI()


def log(msg: str) -> None:
    print(f"{time.time():.3f} [{TASK} a{ATTEMPT}] {msg}", flush=True)


@DBOS.step(retries_allowed=True, max_attempts=8, interval_seconds=0.2, backoff_rate=2.0)
def ask_model(messages: list[dict]) -> dict:
    msg = llm.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS).choices[0].message
    calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
             for c in msg.tool_calls or []]
    return {"content": msg.content, "tool_calls": calls}


@DBOS.step()
def apply_patch(path: str, append: str) -> str:
    full = os.path.join(REPO, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "a") as f:
        f.write(append + "\n")
    return "ok"


@DBOS.step(retries_allowed=True, max_attempts=10, interval_seconds=0.2, backoff_rate=2.0)
def publish(effect_id: str, channel: str, text: str) -> str:
    body = {"effect_id": effect_id, "channel": channel, "text": text}
    req = urllib.request.Request(EFFECTS_URL + "/effects", data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {EFFECTS_KEY}",
        "Idempotency-Key": f"{TASK}:{effect_id}"})  # a retried step is a deduplicated retry
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read().decode()


@DBOS.step()
def run_tests() -> str:
    return f"ok: {sum(len(files) for _, _, files in os.walk(REPO))} files checked"


STEPS = {"apply_patch": apply_patch, "publish": publish, "run_tests": run_tests}


@DBOS.workflow()
def agent(task_id: str) -> str:
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Task {task_id}: carry out the plan step by step."}]
    while True:
        reply = ask_model(messages)
        if not reply["tool_calls"]:
            return reply["content"] or ""
        call = reply["tool_calls"][0]
        name, args = call["function"]["name"], json.loads(call["function"]["arguments"] or "{}")
        result = STEPS[name](**args) if name in STEPS else f"error: unknown tool {name}"
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": result}]
        log(f"step {len(messages) // 2 - 2} {name} done")


def main() -> None:
    DBOS.launch()  # would recover this task's workflow if its database had survived (it never does here)
    log(f"start fence={FENCE}: DBOS system database {STATE}/dbos.sqlite")
    with SetWorkflowID(TASK):  # the workflow id is the task: one workflow per task and database
        final = agent(TASK)
    log(f"final: {final}")
    DBOS.destroy()


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # noqa: BLE001 - a failed attempt exits non-zero; the harness starts the next one
        log(f"runner failed: {type(exc).__name__}: {exc}")
        sys.exit(1)
