"""The same LangGraph agent as `langgraph_s3`, with `SqliteSaver` in the workspace: local state.

Its checkpoints are in `$SANDFLEET_WORKSPACE/state/checkpoints.sqlite`. That is how many
LangGraph agents are deployed, and it is durable against a crash of the Python process, but
the file dies with the sandbox: after a preemption the new attempt finds no checkpoint and
starts the task over, asking the model again for every step it had already answered. Its
effects keep their Idempotency-Key and the repo is fresh at every attempt, so what local state
costs shows up as model recalls (wasted calls, tokens and time), not as a corrupted artifact.
That is the point of this example (a control in the league): do not make it durable.

It imports nothing of sandfleet; `ChatOpenAI(model=$OPENAI_MODEL)` reads OPENAI_BASE_URL /
OPENAI_API_KEY. The graph, tools and `durability="sync"` are those of `langgraph_s3`.
"""
from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
import urllib.error
import urllib.request

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

TASK = os.environ["SANDFLEET_TASK_ID"]
ATTEMPT = int(os.environ["SANDFLEET_ATTEMPT"])
FENCE = int(os.environ["SANDFLEET_FENCE"])
REPO = os.environ["SANDFLEET_REPO"]
EFFECTS_URL = os.environ["SANDFLEET_EFFECTS_URL"].rstrip("/")
EFFECTS_KEY = os.environ["SANDFLEET_EFFECTS_KEY"]
SYSTEM = "You are a coding agent. Patch the repository with the tools you are given, one call at a time."


def log(msg: str) -> None:
    print(f"{time.time():.3f} [{TASK} a{ATTEMPT}] {msg}", flush=True)


# ------------------------------------------------------------------ tools
def append_line(path: str, line: str) -> None:
    full = os.path.join(REPO, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "a") as f:
        f.write(line + "\n")


def _retryable_http(exc: BaseException) -> bool:
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in (408, 409, 429) or exc.code >= 500
    return isinstance(exc, OSError)


@retry(retry=retry_if_exception(_retryable_http), wait=wait_exponential(multiplier=0.05, max=1.0),
       stop=stop_after_delay(120), reraise=True)
def post_effect(body: dict) -> str:
    req = urllib.request.Request(EFFECTS_URL + "/effects", data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {EFFECTS_KEY}",
        "Idempotency-Key": f"{TASK}:{body['effect_id']}"})  # same task + effect -> same key, every attempt
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read().decode()


@tool
def apply_patch(path: str, append: str) -> str:
    """Append one line to a file of the repository (path relative to repo/)."""
    append_line(path, append)
    return "ok"


@tool
def publish(effect_id: str, channel: str, text: str) -> str:
    """Send a message to a channel through the effects service (an external effect)."""
    return post_effect({"effect_id": effect_id, "channel": channel, "text": text})


@tool
def run_tests() -> str:
    """Run the repository's checks; read-only."""
    return f"ok: {sum(len(files) for _, _, files in os.walk(REPO))} files checked"


TOOLS = [apply_patch, publish, run_tests]


def build_graph(checkpointer):
    llm = ChatOpenAI(model=os.environ["OPENAI_MODEL"], max_retries=5).bind_tools(TOOLS)
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda state: {"messages": [llm.invoke(state["messages"])]})
    g.add_node("tools", ToolNode(TOOLS))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)  # tool calls -> "tools", else the end
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=checkpointer)


# ------------------------------------------------------------------ run
def main() -> None:
    state_dir = os.path.join(os.environ.get("SANDFLEET_WORKSPACE", os.getcwd()), "state")
    os.makedirs(state_dir, exist_ok=True)
    conn = sqlite3.connect(os.path.join(state_dir, "checkpoints.sqlite"), check_same_thread=False)
    saver = SqliteSaver(conn)
    graph = build_graph(saver)
    config = {"configurable": {"thread_id": TASK}, "recursion_limit": 10_000}
    tup = saver.get_tuple(config)
    if tup is None:  # always, in sandfleet: the workspace (and this file) is new at every attempt
        log(f"start fence={FENCE}: no checkpoint in {state_dir}, a new thread")
        inputs = {"messages": [SystemMessage(SYSTEM), HumanMessage(f"Task {TASK}: carry out the plan step by step.")]}
    else:
        # Only after a crash that kept the workspace: the repo survived with the file, so no replay.
        log(f"start fence={FENCE}: resuming checkpoint {tup.config['configurable']['checkpoint_id']}")
        inputs = None
    for update in graph.stream(inputs, config, stream_mode="updates", durability="sync"):
        for node, out in update.items():
            for m in (out or {}).get("messages", []):
                what = ",".join(c["name"] for c in m.tool_calls) if isinstance(m, AIMessage) and m.tool_calls \
                    else (m.content[:60] if isinstance(m.content, str) else "")
                log(f"{node}: {type(m).__name__} {what}")
    conn.close()
    log("done")


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # noqa: BLE001 - a failed attempt exits non-zero; the harness starts the next one
        log(f"runner failed: {type(exc).__name__}: {exc}")
        sys.exit(1)
