"""A LangGraph agent whose checkpoints live in the store (a small saver on boto3).

It never imports sandfleet. `ChatOpenAI()` reads OPENAI_BASE_URL / OPENAI_API_KEY,
boto3 reads AWS_ENDPOINT_URL_S3 / AWS_CONFIG_FILE. The graph is the usual agent
loop (model node -> ToolNode -> model ...) compiled with `S3Saver`, an
`InMemorySaver` whose whole state is written to `<prefix>langgraph/saver.pkl`
after every checkpoint and every pending write, and read back at start. The
thread id is the task id, so a new attempt resumes from the last checkpoint.

The workspace is fresh at every attempt, so on resume the agent re-applies the
`apply_patch` calls whose tool results are in the checkpointed conversation;
`publish` carries an Idempotency-Key derived from the task and the effect.
"""
from __future__ import annotations

import json
import os
import pickle
import sys
import urllib.error
import urllib.request
from collections import defaultdict

import boto3
import botocore.exceptions
from botocore.config import Config
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

TASK = os.environ["SANDFLEET_TASK_ID"]
BUCKET, PREFIX = os.environ["SANDFLEET_S3_BUCKET"], os.environ["SANDFLEET_S3_PREFIX"]
REPO = os.environ["SANDFLEET_REPO"]
EFFECTS, EFFECTS_KEY = os.environ["SANDFLEET_EFFECTS_URL"], os.environ["SANDFLEET_EFFECTS_KEY"]
TRANSIENT = {"ServiceUnavailable", "SlowDown", "InternalError", "RequestTimeout", "503", "500"}


def transient(exc: BaseException) -> bool:
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code")) in TRANSIENT
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code == 429
    return isinstance(exc, (botocore.exceptions.BotoCoreError, OSError))


retrying = retry(retry=retry_if_exception(transient), wait=wait_exponential(multiplier=0.05, max=1),
                 stop=stop_after_delay(120), reraise=True)


class S3Saver(InMemorySaver):
    """InMemorySaver persisted to one object in the store after every write."""

    def __init__(self, key: str):
        super().__init__()
        self.key = key
        self.s3 = boto3.client("s3", config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                                                   request_checksum_calculation="when_required",
                                                   response_checksum_validation="when_required"))
        body = self._load()
        if body is not None:
            data = pickle.loads(body)
            for thread, nss in data["storage"].items():
                for ns, ckpts in nss.items():
                    self.storage[thread][ns].update(ckpts)
            self.writes = defaultdict(dict, data["writes"])
            self.blobs = defaultdict(None, data["blobs"])

    @retrying
    def _load(self) -> bytes | None:
        try:
            return self.s3.get_object(Bucket=BUCKET, Key=self.key)["Body"].read()
        except botocore.exceptions.ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) in ("NoSuchKey", "404"):
                return None
            raise

    @retrying
    def _save(self) -> None:
        data = {"storage": {t: {ns: dict(c) for ns, c in nss.items()} for t, nss in self.storage.items()},
                "writes": dict(self.writes), "blobs": dict(self.blobs)}
        self.s3.put_object(Bucket=BUCKET, Key=self.key, Body=pickle.dumps(data))

    def put(self, *args, **kwargs):
        out = super().put(*args, **kwargs)
        self._save()
        return out

    def put_writes(self, *args, **kwargs):
        super().put_writes(*args, **kwargs)
        self._save()


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
    graph = build(S3Saver(PREFIX + "langgraph/saver.pkl"))
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
