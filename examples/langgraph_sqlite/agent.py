"""The same LangGraph agent with `SqliteSaver` in the workspace: local state.

Its checkpoints are in `$SANDFLEET_WORKSPACE/state/checkpoints.sqlite`, which dies
with the sandbox, so after a preemption it starts over and asks the model again
for every step (its effects keep their Idempotency-Key, and the workspace is
fresh, so what it costs shows as recalls, wasted calls and time, not as a
corrupted artifact). This is the point: the league shows what local state costs.
It never imports sandfleet.
"""
from __future__ import annotations

import json
import os
import sqlite3
import sys
import urllib.error
import urllib.request
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

TASK = os.environ["SANDFLEET_TASK_ID"]
REPO = os.environ["SANDFLEET_REPO"]
EFFECTS, EFFECTS_KEY = os.environ["SANDFLEET_EFFECTS_URL"], os.environ["SANDFLEET_EFFECTS_KEY"]


def transient(exc: BaseException) -> bool:
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code == 429
    return isinstance(exc, OSError)


retrying = retry(retry=retry_if_exception(transient), wait=wait_exponential(multiplier=0.05, max=1),
                 stop=stop_after_delay(120), reraise=True)


def _append(path: str, line: str) -> None:
    full = os.path.join(REPO, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "a") as f:
        f.write(line + "\n")


@tool
def apply_patch(path: str, append: str) -> str:
    """Append one line to a file of the repository."""
    _append(path, append)
    return "ok"


@tool
@retrying
def publish(effect_id: str, channel: str, text: str) -> str:
    """Send a message to a channel (an external effect)."""
    body = json.dumps({"effect_id": effect_id, "channel": channel, "text": text}).encode()
    req = urllib.request.Request(EFFECTS + "/effects", data=body, method="POST", headers={
        "Authorization": f"Bearer {EFFECTS_KEY}", "Content-Type": "application/json",
        "Idempotency-Key": f"{TASK}:{effect_id}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


@tool
def run_tests() -> str:
    """Run the repository's checks (read-only)."""
    return "ok"


def build(saver):
    tools = [apply_patch, publish, run_tests]
    llm = ChatOpenAI(model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini")).bind_tools(tools)
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda s: {"messages": [llm.invoke(s["messages"])]})
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=saver)


def replay_workspace(messages) -> int:
    """Re-apply the recorded apply_patch calls (the workspace is fresh at every attempt)."""
    done = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    n = 0
    for m in messages:
        if isinstance(m, AIMessage):
            for tc in m.tool_calls:
                if tc["name"] == "apply_patch" and tc["id"] in done:
                    _append(tc["args"]["path"], tc["args"]["append"])
                    n += 1
    return n


def main() -> None:
    state_dir = os.path.join(os.environ["SANDFLEET_WORKSPACE"], "state")
    os.makedirs(state_dir, exist_ok=True)
    conn = sqlite3.connect(os.path.join(state_dir, "checkpoints.sqlite"), check_same_thread=False)
    graph = build(SqliteSaver(conn))
    config = {"configurable": {"thread_id": TASK}, "recursion_limit": 1000}
    state = graph.get_state(config)
    if state.values.get("messages"):
        n = replay_workspace(state.values["messages"])
        print(f"resuming from checkpoint: {len(state.values['messages'])} messages, {n} patches replayed, "
              f"next={state.next}", flush=True)
        out = graph.invoke(None, config)
    else:
        out = graph.invoke({"messages": [SystemMessage("You are a coding agent. Use the tools."),
                                         HumanMessage(f"Task {TASK}: carry out the plan.")]}, config)
    print("done:", out["messages"][-1].content, flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # noqa: BLE001
        print(f"failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
