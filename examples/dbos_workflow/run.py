"""DBOS Transact 3.4.0 as its docs write a durable agent: the agent loop is a `@DBOS.workflow`, each model call
(the `openai` SDK, which reads OPENAI_BASE_URL and OPENAI_API_KEY at every start) and each tool call is a
`@DBOS.step`, with one generic `bash` tool. No tool of the workload's (the scripted model speaks the shell dialect),
no sandfleet import.

Persistence, as shipped: DBOS's default system database, SQLite (`sqlite:///sandfleet_agent.sqlite`, named after
the app, relative to the working directory: the workspace, the task's own disk). DBOS records each step's output
there when the step returns. A run started again calls `DBOS.launch()`, which recovers the workflow left PENDING,
and waits for it under the same workflow id (the task's): the recorded steps are not run again, their outputs are
read back; only the step in flight at the kill runs again (a model call asked again, or a `bash` command run again).
On a fresh disk there is no database and the workflow starts over. Exit 0 when the workflow ended with a final
answer.
"""
import json
import os
import subprocess
import sys

from dbos import DBOS, SetWorkflowID
from openai import OpenAI

PROMPT = "You are a coding agent. Use the bash tool to do the task."
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a bash command in the repository and return its exit code and output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
MODEL = os.environ.get("OPENAI_MODEL", "sandfleet-script")

# The admin server (port 3001) has nothing to serve in a sandbox; the system database is DBOS's default.
DBOS(config={"name": "sandfleet-agent", "run_admin_server": False})
client = OpenAI(max_retries=6)


@DBOS.step(retries_allowed=True, max_attempts=4, interval_seconds=0.5)
def ask_model(messages: list[dict]) -> dict:
    """One chat completion; its message (content and tool calls) is the step's recorded output."""
    msg = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS).choices[0].message
    return msg.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True)


@DBOS.step()
def bash(command: str) -> str:
    """Run a bash command in the repository and return its exit code and output."""
    p = subprocess.run(["bash", "-c", command], cwd=os.environ.get("SANDFLEET_REPO"), capture_output=True, text=True,
                       timeout=60)
    return f"exit {p.returncode}\n{p.stdout[-4000:]}{p.stderr[-4000:]}"


@DBOS.workflow()
def agent(task: str) -> str:
    messages: list[dict] = [{"role": "system", "content": PROMPT}, {"role": "user", "content": task}]
    for _ in range(200):
        msg = ask_model(messages)
        messages.append(msg)
        if not msg.get("tool_calls"):
            return msg.get("content") or ""
        for call in msg["tool_calls"]:
            args = json.loads(call["function"]["arguments"] or "{}")
            out = bash(args.get("command", "")) if call["function"]["name"] == "bash" else "error: no such tool"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
    raise RuntimeError("no final answer in 200 turns")


def main() -> int:
    workflow_id = os.environ.get("SANDFLEET_TASK_ID", "sandfleet-task")
    DBOS.launch()  # recovers this executor's PENDING workflows from the system database, if it survived
    status = DBOS.get_workflow_status(workflow_id)
    if status is not None:
        print(f"dbos: workflow {workflow_id} found ({status.status}): waiting for its recovery", file=sys.stderr,
              flush=True)
        handle = DBOS.retrieve_workflow(workflow_id)
    else:
        with SetWorkflowID(workflow_id):
            handle = DBOS.start_workflow(agent, "Patch the repository as the step script asks.")
    final = handle.get_result()
    print(f"dbos: {str(final)[:200]}", file=sys.stderr)
    DBOS.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
