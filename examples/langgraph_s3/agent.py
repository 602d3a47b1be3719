"""A LangGraph agent whose checkpoints live in the S3 store (`s3_saver.S3Saver`, on boto3).

It imports nothing of sandfleet. `ChatOpenAI(model=$OPENAI_MODEL)` reads OPENAI_BASE_URL /
OPENAI_API_KEY; boto3 reads AWS_ENDPOINT_URL_S3 / AWS_CONFIG_FILE. The graph is the usual
agent loop: model node -> ToolNode -> model ..., compiled with the S3 saver; thread_id is the
task id, so a new attempt continues from the task's last checkpoint (and the pending writes of
nodes that finished after it), and the model is not asked again for a step it answered.

Two things the framework does not do for you:

* `durability="sync"`: LangGraph's default ("async") saves a checkpoint while the next step
  already runs, so the tool (an effect!) can run before the model's answer is durable; a kill
  then makes the next attempt ask the model again for a step whose effect was applied.
* The workspace is fresh at every attempt, but the checkpoint only holds the conversation. So
  on resume the agent re-applies every `apply_patch` call whose ToolMessage is in the restored
  state (checkpoint + pending writes): those are exactly the tool runs LangGraph will not run
  again. A call without a ToolMessage is run by the ToolNode when the graph continues. Each
  patch thus lands once, in step order, as in an uninterrupted run.

`publish` sends an Idempotency-Key derived from the task and the effect: a ToolNode re-run after
a kill is a deduplicated retry, not a second effect.
"""
from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from s3_saver import S3Saver

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


# ------------------------------------------------------------------ resume
def restored_messages(tup) -> list[BaseMessage]:
    """The conversation LangGraph resumes with: the checkpoint's plus its nodes' pending writes."""
    out = list(tup.checkpoint["channel_values"].get("messages") or [])
    for _task, channel, value in tup.pending_writes or []:
        if channel == "messages":
            out += value if isinstance(value, list) else [value]
    return out


def replay_patches(messages: list[BaseMessage]) -> int:
    """Re-apply, in order, the apply_patch calls whose result is recorded (LangGraph won't run them again)."""
    done = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    n = 0
    for m in messages:
        for call in m.tool_calls if isinstance(m, AIMessage) else []:
            if call["name"] == "apply_patch" and call["id"] in done:
                append_line(call["args"]["path"], call["args"]["append"])
                n += 1
    return n


def main() -> None:
    saver = S3Saver(os.environ["SANDFLEET_S3_BUCKET"], os.environ["SANDFLEET_S3_PREFIX"], fence=FENCE, log=log)
    graph = build_graph(saver)
    config = {"configurable": {"thread_id": TASK}, "recursion_limit": 10_000}
    tup = saver.get_tuple(config)
    if tup is None:
        log(f"start fence={FENCE}: no checkpoint, a new thread")
        inputs = {"messages": [SystemMessage(SYSTEM), HumanMessage(f"Task {TASK}: carry out the plan step by step.")]}
    else:
        messages = restored_messages(tup)
        n = replay_patches(messages)
        log(f"start fence={FENCE}: resuming checkpoint {tup.config['configurable']['checkpoint_id']} "
            f"(step {tup.metadata.get('step')}, {len(messages)} messages, {n} patches re-applied)")
        inputs = None  # continue the thread from its last checkpoint
    for update in graph.stream(inputs, config, stream_mode="updates", durability="sync"):
        for node, out in update.items():
            for m in (out or {}).get("messages", []):
                what = ",".join(c["name"] for c in m.tool_calls) if isinstance(m, AIMessage) and m.tool_calls \
                    else (m.content[:60] if isinstance(m.content, str) else "")
                log(f"{node}: {type(m).__name__} {what}")
    log("done")


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # noqa: BLE001 - a failed attempt exits non-zero; the harness starts the next one
        log(f"runner failed: {type(exc).__name__}: {exc}")
        sys.exit(1)
