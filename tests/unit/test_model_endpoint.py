"""The model endpoint and the effects service on loopback, talked to by unmodified clients
(the OpenAI SDK, LangChain's ChatOpenAI inside a LangGraph graph) through base_url only."""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from fleet import workloads
from fleet.effects import EffectsService
from fleet.model_endpoint import ModelEndpoint
from fleet.services import MAX_IN_FLIGHT_PER_KEY, TaskRegistry

WL = workloads.get("patch-repo")
SEED, STEPS = 11, 6


@pytest.fixture
def services(tmp_path):
    reg = TaskRegistry()
    key = reg.register("t1", SEED, STEPS, "patch-repo")
    other = reg.register("t2", SEED + 1, STEPS, "patch-repo")
    reg.set_attempt("t1", 3)
    model = ModelEndpoint(reg, log_path=tmp_path / "calls.jsonl").start()
    fx = EffectsService(reg, log_path=tmp_path / "fx.jsonl").start()
    yield model, fx, key, other
    model.stop()
    fx.stop()


def post(url, key, body, headers=None):
    req = urllib.request.Request(url, data=body if isinstance(body, bytes) else json.dumps(body).encode(),
                                 method="POST", headers={"Authorization": f"Bearer {key}",
                                                         "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def logged(svc, n: int, timeout_s: float = 5.0) -> list[dict]:
    """The service's log once it holds n records (a call is logged just after its answer is sent)."""
    deadline = time.monotonic() + timeout_s
    while len(svc.log.snapshot()) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return svc.log.snapshot()


def tool_msgs(n):
    out = [{"role": "user", "content": "go"}]
    for i in range(n):
        out += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "x", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "ok"}]
    return out


def test_openai_sdk_gets_the_script_through_base_url(services):
    from openai import OpenAI

    model, _, key, _ = services
    client = OpenAI(base_url=model.base_url, api_key=key, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["sandfleet-script"]
    script = WL.script(SEED, STEPS)
    ids = set()
    for n in (0, 2, 2):  # the same conversation length is asked the same step (a replay)
        r = client.chat.completions.create(model="any", messages=tool_msgs(n))
        tc = r.choices[0].message.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls"
        assert tc.function.name == script[n].tool and json.loads(tc.function.arguments) == script[n].arguments
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens > 0
        ids.add(tc.id)
    assert len(ids) == 3  # every call gets a fresh id
    final = client.chat.completions.create(model="any", messages=tool_msgs(STEPS))
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content
    calls = logged(model, 4)
    assert [c["step"] for c in calls] == [0, 2, 2, STEPS] and all(c["task"] == "t1" and c["attempt"] == 3
                                                                   for c in calls)


def test_openai_sdk_streaming_assembles_the_same_tool_call(services):
    from openai import OpenAI

    model, _, key, _ = services
    client = OpenAI(base_url=model.base_url, api_key=key, max_retries=0)
    stream = client.chat.completions.create(model="m", messages=tool_msgs(1), stream=True,
                                            stream_options={"include_usage": True})
    name, args, usage, finish = "", "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or []:
                name += tc.function.name or ""
                args += tc.function.arguments or ""
    step = WL.script(SEED, STEPS)[1]
    assert name == step.tool and json.loads(args) == step.arguments
    assert finish == "tool_calls" and usage.total_tokens > 0
    assert logged(model, 1)[-1]["stream"] is True


def test_langgraph_agent_talks_to_the_endpoint_through_base_url(services, monkeypatch):
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    model, _, key, _ = services
    monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", key)
    done = []

    @tool
    def apply_patch(path: str, append: str) -> str:
        """Append a line to a file."""
        done.append(("apply_patch", path))
        return "ok"

    @tool
    def publish(effect_id: str, channel: str, text: str) -> str:
        """Send a message."""
        done.append(("publish", effect_id))
        return "sent"

    @tool
    def run_tests() -> str:
        """Run checks."""
        done.append(("run_tests", None))
        return "ok"

    tools = [apply_patch, publish, run_tests]
    llm = ChatOpenAI(model="sandfleet-script", max_retries=0).bind_tools(tools)
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda s: {"messages": [llm.invoke(s["messages"])]})
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    out = g.compile().invoke({"messages": [HumanMessage("patch the repo")]}, {"recursion_limit": 50})
    assert [t for t, _ in done] == [s.tool for s in WL.script(SEED, STEPS)]
    assert out["messages"][-1].content == WL.final_message(SEED, STEPS)


def test_errors_are_openai_shaped(services):
    model, _, key, _ = services
    url = model.base_url + "/chat/completions"
    status, body = post(url, "wrong", {"model": "m", "messages": tool_msgs(0)})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, body = post(url, key, b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = post(url, key, {"model": "m", "messages": []})
    assert status == 400 and body["error"]["param"] == "messages"
    status, body = post(url, key, {"model": "m", "messages": [{"role": "wizard"}]})
    assert status == 400 and "role" in body["error"]["message"]
    status, body = post(url, key, {"messages": tool_msgs(0)})
    assert status == 400 and body["error"]["param"] == "model"
    status, body = post(model.base_url + "/nope", key, {})
    assert status == 404
    assert model.log.snapshot() == []  # nothing malformed is recorded as a call


def test_a_flooding_key_gets_429_and_others_are_served(services):
    model, _, key, other = services
    model.think_ms = 300
    results = []

    def one(k):
        results.append((k, post(model.base_url + "/chat/completions", k, {"model": "m", "messages": tool_msgs(0)})[0]))

    threads = [threading.Thread(target=one, args=(key,)) for _ in range(MAX_IN_FLIGHT_PER_KEY + 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    one(other)
    flood = [s for k, s in results if k == key]
    assert 429 in flood and flood.count(200) >= 1
    assert [s for k, s in results if k == other] == [200]


def test_effects_deduplicate_a_repeated_idempotency_key(services):
    _, fx, key, other = services
    eid = next(iter(WL.effect_steps(SEED, STEPS)))
    url = fx.url + "/v1/effects"
    s1, a = post(url, key, {"effect_id": eid, "text": "x"}, {"Idempotency-Key": "k1"})
    s2, b = post(url, key, {"effect_id": eid, "text": "x"}, {"Idempotency-Key": "k1"})
    s3, c = post(url, key, {"effect_id": eid, "text": "x"})
    s4, d = post(url, other, {"effect_id": eid, "text": "x"}, {"Idempotency-Key": "k1"})  # keys are per task
    assert (s1, s2, s3, s4) == (200, 200, 200, 200)
    assert a["receipt"] == b["receipt"] and b["deduped"] and not a["deduped"] and not c["deduped"]
    assert not d["deduped"]
    log = fx.log.snapshot()
    assert [(r["task"], r["deduped"], r["step"]) for r in log] == [
        ("t1", False, WL.effect_steps(SEED, STEPS)[eid]), ("t1", True, WL.effect_steps(SEED, STEPS)[eid]),
        ("t1", False, WL.effect_steps(SEED, STEPS)[eid]), ("t2", False, None)]
    assert post(url, "nope", {"effect_id": eid})[0] == 401
    assert post(url, key, {"effect_id": ""})[0] == 400
