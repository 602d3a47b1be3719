"""The scripted model in the Anthropic Messages and OpenAI Responses APIs (fleet/dialect_messages.py,
fleet/dialect_responses.py): the same step as Chat Completions for the same conversation, the APIs' shapes and
errors, and the real client SDKs (anthropic, openai) talking to the real endpoint through base_url only."""
from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet import dialect_messages, dialect_responses, dialects, workloads
from fleet.dialects import Dialect, detect, step_of
from fleet.model_endpoint import ModelEndpoint
from fleet.services import HttpError, TaskRegistry
from tests.unit.test_model_endpoint import logged as _logged
from tests.unit.test_model_endpoint import post

WL = workloads.get("patch-repo")
WL_TOOLS = {t["function"]["name"] for t in WL.tools()}
SEED, STEPS = 11, 6
A_TOOLS = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
            "input_schema": t["function"]["parameters"]} for t in WL.tools()]
R_TOOLS = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
           for t in WL.tools()]
BASH_A = {"name": "Bash", "description": "run", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
    "required": ["command"]}}


@pytest.fixture
def endpoint(tmp_path):
    reg = TaskRegistry()
    key = reg.register("t1", SEED, STEPS, "patch-repo")
    other = reg.register("t2", SEED + 1, STEPS, "patch-repo")
    reg.set_attempt("t1", 2)
    model = ModelEndpoint(reg, log_path=tmp_path / "calls.jsonl").start()
    yield model, key, other
    model.stop()


def logged(svc, n: int) -> list[dict]:
    """The log once it holds n records, in the order the calls came (a call is logged just after its answer is
    sent, so the next call of a fast client can be logged first)."""
    return sorted(_logged(svc, n), key=lambda c: c["t"])


def a_conv(n: int) -> list:
    """An Anthropic conversation after n tool results (each in a user turn of tool_result blocks)."""
    out = [{"role": "user", "content": "do the task"}]
    for i in range(n):
        out += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "x", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "ok"}]}]
    return out


def r_conv(n: int) -> list:
    out = [{"role": "user", "content": "do the task"}]
    for i in range(n):
        out += [{"type": "function_call", "call_id": f"c{i}", "name": "x", "arguments": "{}"},
                {"type": "function_call_output", "call_id": f"c{i}", "output": "ok"}]
    return out


# -- unit: the requests read into chat form --------------------------------------------------------------------

def test_messages_read_as_chat_count_tool_results_and_say_the_form():
    chat = dialect_messages.to_chat({"system": [{"type": "text", "text": "be brief"}], "tools": A_TOOLS,
                                     "messages": a_conv(3)})
    assert chat["messages"][0] == {"role": "system", "content": "be brief"}
    assert step_of(chat["messages"], Dialect("tools")) == 3
    assert detect(chat, WL_TOOLS)[0] == Dialect("tools")
    shell = dialect_messages.to_chat({"tools": [BASH_A], "messages": a_conv(0)})
    assert detect(shell, WL_TOOLS)[0] == Dialect("shell", "Bash", "command")
    builtin = dialect_messages.to_chat({"tools": [{"type": "bash_20250124", "name": "bash"}], "messages": a_conv(0)})
    assert detect(builtin, WL_TOOLS)[0] == Dialect("shell", "bash", "command")
    # Claude Code 2.1's `system` message among the turns is system text, not a turn
    sys_turn = dialect_messages.to_chat({"tools": A_TOOLS, "messages": a_conv(2)[:1] + [
        {"role": "system", "content": [{"type": "text", "text": "# Environment"}]}] + a_conv(2)[1:]})
    assert step_of(sys_turn["messages"], Dialect("tools")) == 2 and sys_turn["messages"][1]["role"] == "system"
    # text form: the instructions show a fenced block, each observation after an assistant turn is a step
    text = dialect_messages.to_chat({"system": "answer in one ```bash block", "messages": [
        {"role": "user", "content": "go"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "o1"},
        {"role": "assistant", "content": [{"type": "text", "text": "b"}]}, {"role": "user", "content": "o2"}]})
    d = detect(text, WL_TOOLS)[0]
    assert d.kind == "text" and step_of(text["messages"], d) == 2


def test_a_call_an_agent_marks_aborted_is_no_finished_step():
    """Codex CLI, resumed after a kill, gives each call whose output it lost the output "aborted": a real model asks
    for that call again, so the scripted one does not count it as a step (it had skipped the cut step)."""
    conv = r_conv(3)
    conv[-1] = dict(conv[-1], output="aborted")
    chat = dialect_responses.to_chat({"tools": R_TOOLS}, conv)
    assert step_of(chat["messages"], Dialect("tools")) == 2
    conv[-1] = dict(conv[-1], output="the tool aborted early, here is its log")  # a real output that says so
    assert step_of(dialect_responses.to_chat({"tools": R_TOOLS}, conv)["messages"], Dialect("tools")) == 3


def test_responses_read_as_chat_count_outputs_and_take_earlier_items():
    chat = dialect_responses.to_chat({"instructions": "be brief", "tools": R_TOOLS + [{"type": "web_search"}]},
                                     r_conv(4))
    assert chat["messages"][0] == {"role": "system", "content": "be brief"}
    assert step_of(chat["messages"], Dialect("tools")) == 4 and detect(chat, WL_TOOLS)[0] == Dialect("tools")
    assert dialect_responses.validate({"model": "m", "input": "hi"})[0] == [{"role": "user", "content": "hi"}]
    mem = dialect_responses.Memory(limit=4)
    mem.remember("t1", "r1", None, r_conv(1))
    mem.remember("t1", "r2", "r1", r_conv(1)[1:])
    assert len(mem.chain("t1", "r2")) == 5
    with pytest.raises(HttpError, match="not found"):
        mem.chain("t2", "r2")  # another task's response is not this task's
    for i in range(3):
        mem.remember("t1", f"x{i}", None, [])
    with pytest.raises(HttpError, match="'r1' not found"):
        mem.chain("t1", "r2")  # forgotten, oldest first
    small = dialect_responses.Memory(max_bytes=400)
    for i in range(5):
        small.remember("t1", f"r{i}", None, r_conv(1))  # 170 bytes each: two fit
    assert len(small.chain("t1", "r4")) == 3 and len(small.chain("t1", "r3")) == 3
    with pytest.raises(HttpError):
        small.chain("t1", "r2")


def test_a_codex_like_tool_set_is_answered_with_an_argv_shell_command():
    """Codex CLI declares `shell` with `command` an array of strings, beside several one-string tools (its
    function-form apply_patch, view_image): the shell tool is the one named like a shell, answered as an argv."""
    tools = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {
        "command": {"type": "array", "items": {"type": "string"}}, "workdir": {"type": "string"},
        "timeout_ms": {"type": "number"}}, "required": ["command"]}},
        {"type": "function", "name": "apply_patch", "parameters": {"type": "object", "properties": {
            "input": {"type": "string"}}, "required": ["input"]}},
        {"type": "function", "name": "view_image", "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}}, "required": ["path"]}}]
    d = detect(dialect_responses.to_chat({"tools": tools}, r_conv(0)), WL_TOOLS)[0]
    assert d == Dialect("shell", "shell", "command", argv=True)
    name, args = dialects.tool_call_arguments(WL.script(SEED, STEPS)[0], d)
    assert name == "shell" and args["command"][:2] == ["sh", "-c"] and "SANDFLEET_REPO" in args["command"][2]


def test_codex_0_169s_tool_set_is_answered_through_exec_command():
    """The function tools Codex CLI 0.169 sends (`codex exec`, recorded against this endpoint): several have one
    required string; `exec_command` is the one named like a shell."""
    def fn(name, props, required):
        return {"type": "function", "name": name, "parameters": {"type": "object", "properties": {
            p: {"type": "string"} for p in props}, "required": required}}

    tools = [fn("exec_command", ["cmd", "justification", "shell", "workdir"], ["cmd"]),
             {"type": "function", "name": "write_stdin", "parameters": {"type": "object", "properties": {
                 "session_id": {"type": "number"}, "chars": {"type": "string"}}, "required": ["session_id"]}},
             fn("view_image", ["path"], ["path"]), fn("create_goal", ["objective"], ["objective"]),
             {"type": "namespace", "name": "multi_agent_v1"}, {"type": "web_search"}]
    d = detect(dialect_responses.to_chat({"tools": tools}, r_conv(2)), WL_TOOLS)[0]
    assert d == Dialect("shell", "exec_command", "cmd")


@pytest.mark.parametrize("body, match", [
    ({"max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}, "model: Field required"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": []}, "non-empty"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "x"}]}]}, "content"),
])
def test_a_messages_request_of_the_wrong_shape_is_named(body, match):
    with pytest.raises(HttpError, match=match):
        dialect_messages.validate(body)


# -- the endpoint over HTTP --------------------------------------------------------------------------------------

def test_messages_answer_the_same_step_as_chat_completions(endpoint):
    model, key, _ = endpoint
    script = WL.script(SEED, STEPS)
    for n in (0, 3, 3):
        code, r = post(model.url + "/v1/messages", key, {"model": "claude", "max_tokens": 1024, "tools": A_TOOLS,
                                                          "messages": a_conv(n)},
                       headers={"anthropic-version": "2023-06-01"})
        assert code == 200 and r["type"] == "message" and r["stop_reason"] == "tool_use", r
        block = r["content"][0]
        assert block["type"] == "tool_use" and block["id"].startswith("toolu_")
        assert (block["name"], block["input"]) == (script[n].tool, script[n].arguments)
        assert r["usage"]["input_tokens"] > 0 and r["usage"]["output_tokens"] == script[n].completion_tokens
    code, r = post(model.url + "/v1/messages", key, {"model": "c", "max_tokens": 9, "tools": A_TOOLS,
                                                      "messages": a_conv(STEPS)})
    assert r["stop_reason"] == "end_turn" and r["content"][0]["type"] == "text"
    calls = logged(model, 4)
    assert [(c["step"], c["kind"], c["dialect"], c["form"], c["task"], c["attempt"]) for c in calls] == [
        (0, "tool", "messages", "tools", "t1", 2), (3, "tool", "messages", "tools", "t1", 2),
        (3, "tool", "messages", "tools", "t1", 2), (STEPS, "final", "messages", "tools", "t1", 2)]
    assert model.delivered("t1") == 4


def test_messages_errors_are_anthropic_shaped_and_the_key_goes_in_x_api_key(endpoint):
    model, key, _ = endpoint
    ok = {"model": "c", "max_tokens": 9, "tools": A_TOOLS, "messages": a_conv(1)}
    code, r = post(model.url + "/v1/messages", "nope", ok)
    assert code == 401 and r == {"type": "error", "error": {"type": "authentication_error", "message": r["error"][
        "message"]}}
    code, r = post(model.url + "/v1/messages", "", ok, headers={"x-api-key": key, "Authorization": ""})
    assert code == 200 and r["content"][0]["name"] == WL.script(SEED, STEPS)[1].tool
    code, r = post(model.url + "/v1/messages", key, {"model": "c", "max_tokens": 9, "messages": [{"role": "x"}]})
    assert code == 400 and r["type"] == "error" and r["error"]["type"] == "invalid_request_error"
    code, r = post(model.url + "/v1/messages", key, {"model": "c", "max_tokens": 9, "messages": a_conv(0),
                                                      "tools": [{"name": "edit", "input_schema": {"type": "object"}}]})
    assert code == 400 and "cannot answer" in r["error"]["message"]  # no form serves it: a clear 400
    code, r = post(model.url + "/v1/messages", key, b"{not json")
    assert code == 400 and r["type"] == "error"
    code, r = post(model.url + "/v1/messages/count_tokens", key, {"model": "c", "messages": a_conv(2)})
    assert code == 200 and r["input_tokens"] > 0
    assert [c["kind"] for c in logged(model, 2)] == ["tool", "refused"]  # count_tokens is not a model call


def test_responses_answer_the_step_and_remember_previous_responses(endpoint):
    model, key, other = endpoint
    script = WL.script(SEED, STEPS)
    code, r = post(model.url + "/v1/responses", key, {"model": "gpt", "tools": R_TOOLS, "input": "do the task"})
    assert code == 200 and r["object"] == "response" and r["status"] == "completed", r
    item = r["output"][0]
    assert item["type"] == "function_call" and item["name"] == script[0].tool
    assert json.loads(item["arguments"]) == script[0].arguments
    assert r["usage"]["total_tokens"] == r["usage"]["input_tokens"] + r["usage"]["output_tokens"]
    # the next turn sends only the tool's output and names the previous response
    code, r2 = post(model.url + "/v1/responses", key, {
        "model": "gpt", "tools": R_TOOLS, "previous_response_id": r["id"],
        "input": [{"type": "function_call_output", "call_id": item["call_id"], "output": "ok"}]})
    assert code == 200 and r2["output"][0]["name"] == script[1].tool and r2["previous_response_id"] == r["id"]
    code, r3 = post(model.url + "/v1/responses", key, {"model": "gpt", "tools": R_TOOLS, "input": r_conv(STEPS)})
    assert r3["output"][0]["type"] == "message" and r3["output"][0]["content"][0]["type"] == "output_text"
    code, e = post(model.url + "/v1/responses", other, {"model": "gpt", "tools": R_TOOLS, "input": "x",
                                                         "previous_response_id": r["id"]})
    assert code == 400 and e["error"]["code"] == "previous_response_not_found"  # never another task's
    code, e = post(model.url + "/v1/responses", key, {"model": "gpt", "input": 5})
    assert code == 400 and e["error"]["param"] == "input"
    calls = logged(model, 3)
    assert [(c["step"], c["kind"], c["dialect"]) for c in calls] == [(0, "tool", "responses"),
                                                                      (1, "tool", "responses"),
                                                                      (STEPS, "final", "responses")]


# -- the real SDKs ---------------------------------------------------------------------------------------------

def test_anthropic_sdk_create_and_stream_with_tools(endpoint):
    anthropic = pytest.importorskip("anthropic")
    model, key, _ = endpoint
    script = WL.script(SEED, STEPS)
    client = anthropic.Anthropic(base_url=model.url, api_key=key, max_retries=0)
    msgs = [{"role": "user", "content": "do the task"}]
    for n in range(STEPS):  # the agent loop: call, run the tool_use, send its tool_result
        r = client.messages.create(model="sandfleet-script", max_tokens=1024, tools=A_TOOLS, messages=msgs)
        assert r.stop_reason == "tool_use"
        use = next(b for b in r.content if b.type == "tool_use")
        assert (use.name, use.input) == (script[n].tool, script[n].arguments)
        msgs += [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "done"}]}]
    final = client.messages.create(model="c", max_tokens=1024, tools=A_TOOLS, messages=msgs)
    assert final.stop_reason == "end_turn" and final.content[0].text
    with client.messages.stream(model="c", max_tokens=1024, tools=A_TOOLS, messages=a_conv(2)) as stream:
        kinds = [ev.type for ev in stream]
        got = stream.get_final_message()
    assert got.stop_reason == "tool_use" and got.content[0].input == script[2].arguments
    assert got.usage.output_tokens == script[2].completion_tokens and got.usage.input_tokens > 0
    assert {"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
            "message_stop"} <= set(kinds)
    with client.messages.stream(model="c", max_tokens=9, tools=A_TOOLS, messages=a_conv(STEPS)) as stream:
        assert stream.get_final_text() == final.content[0].text
    assert [m.id for m in client.models.list()] == ["sandfleet-script"]  # (not a model call: not logged)
    assert client.models.retrieve("claude-x").id == "claude-x"
    bearer = anthropic.Anthropic(base_url=model.url, auth_token=key, max_retries=0)  # Claude Code's AUTH_TOKEN
    assert bearer.messages.count_tokens(model="c", messages=a_conv(1), tools=A_TOOLS).input_tokens > 0
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=model.url, api_key="wrong", max_retries=0).messages.create(
            model="c", max_tokens=9, messages=a_conv(0))
    calls = logged(model, STEPS + 3)
    assert [c["step"] for c in calls] == [*range(STEPS), STEPS, 2, STEPS]
    assert [c["stream"] for c in calls][-2:] == [True, True] and all(c["delivered"] for c in calls)


def test_openai_sdk_responses_plain_and_streamed(endpoint):
    from openai import OpenAI

    model, key, _ = endpoint
    script = WL.script(SEED, STEPS)
    client = OpenAI(base_url=model.base_url, api_key=key, max_retries=0)
    items: list = [{"role": "user", "content": "do the task"}]
    prev = None
    for n in range(STEPS):
        r = client.responses.create(model="gpt-5", tools=R_TOOLS, input=items[-1:] if prev else items,
                                    previous_response_id=prev) if n % 2 else \
            client.responses.create(model="gpt-5", tools=R_TOOLS, input=items)
        call = r.output[0]
        assert call.type == "function_call" and call.name == script[n].tool
        assert json.loads(call.arguments) == script[n].arguments and r.usage.total_tokens > 0
        items += [call.model_dump(exclude_none=True),
                  {"type": "function_call_output", "call_id": call.call_id, "output": "done"}]
        prev = r.id
    final = client.responses.create(model="gpt-5", tools=R_TOOLS, input=items)
    assert final.output_text
    events = list(client.responses.create(model="gpt-5", tools=R_TOOLS, input=r_conv(3), stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds and "response.output_item.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response
    assert done.output[0].name == script[3].tool and json.loads(done.output[0].arguments) == script[3].arguments
    assert done.usage.output_tokens == script[3].completion_tokens
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == script[3].arguments
    text = [e for e in client.responses.create(model="m", tools=R_TOOLS, input=r_conv(STEPS), stream=True)]
    assert "".join(e.delta for e in text if e.type == "response.output_text.delta") == final.output_text
    calls = logged(model, STEPS + 3)
    assert [c["step"] for c in calls] == [*range(STEPS), STEPS, 3, STEPS]
    assert all(c["dialect"] == "responses" for c in calls)


def test_server_time_per_call_in_each_api(endpoint):
    """Not a gate: the server time of a call at step 20 in each API (printed for BENCHMARKS.md), from the call
    log's t / t_done as the bench reads it; a key per API keeps each under the per-key rate."""
    model, _, _ = endpoint
    steps = 24
    bodies = {"chat": ("/v1/chat/completions", {"model": "m", "tools": WL.tools(), "messages": [
        {"role": "user", "content": "go"}] + [m for i in range(20) for m in (
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "x", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "ok"})]}),
        "messages": ("/v1/messages", {"model": "m", "max_tokens": 9, "tools": A_TOOLS, "messages": a_conv(20)}),
        "responses": ("/v1/responses", {"model": "m", "tools": R_TOOLS, "input": r_conv(20)})}
    for name, (path, body) in bodies.items():
        key = model.registry.register(f"bench-{name}", SEED, steps, "patch-repo")
        for _ in range(60):
            assert post(model.url + path, key, body)[0] == 200
    calls = logged(model, 180)
    for name in bodies:
        t = sorted(c["t_done"] - c["t"] for c in calls if c["task"] == f"bench-{name}")
        assert len(t) == 60 and all(c["step"] == 20 for c in calls if c["task"] == f"bench-{name}")
        print(f"{name}: server time at step 20 p50 {t[30] * 1000:.2f} ms p99 {t[59] * 1000:.2f} ms")


# -- bad input: the API's 400, never a 500 ---------------------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                         st.sampled_from(["type", "role", "content", "name", "input_schema", "parameters",
                                          "properties", "required", "call_id", "output", "text", "tool_use_id"]),
                         inner, max_size=4), max_leaves=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens", "/v1/responses"]),
       field=st.sampled_from(["messages", "input", "tools", "system", "instructions", "previous_response_id",
                              "max_tokens", "stream", "model"]), value=_json)
def test_a_request_of_the_wrong_shape_is_the_apis_400_never_a_500(endpoint, path, field, value):
    model, key, _ = endpoint
    body = {"model": "m", "max_tokens": 9, "messages": a_conv(1), "input": r_conv(1), "tools": A_TOOLS
            if "messages" in path else R_TOOLS, field: value}
    if body.get("stream") is True:
        body["stream"] = False  # (an answer of SSE events is not what this test reads)
    code, r = post(model.url + path, key, body)
    while code == 429:  # the key's rate (50 a second): this test sends faster
        time.sleep(0.05)
        code, r = post(model.url + path, key, body)
    assert code in (200, 400), (code, r)
    if code == 400 and path.startswith("/v1/messages"):
        assert r["type"] == "error" and r["error"]["type"] == "invalid_request_error" and r["error"]["message"]
    elif code == 400:
        assert r["error"]["message"] and r["error"]["type"] == "invalid_request_error"


def test_a_claude_code_like_tool_set_is_answered_through_its_bash_tool(endpoint):
    """Claude Code declares Bash beside other one-string tools (Read, Glob, WebSearch...): the step comes as a
    Bash tool_use whose command does it; a text agent (no tools, a fenced block in `system`) gets one block."""
    model, key, _ = endpoint

    def one(name, param):
        return {"name": name, "input_schema": {"type": "object", "properties": {param: {"type": "string"}},
                                               "required": [param], "additionalProperties": False}}

    tools = [one("Read", "file_path"), one("Glob", "pattern"), BASH_A, one("WebSearch", "query")]
    code, r = post(model.url + "/v1/messages?beta=true", key, {"model": "c", "max_tokens": 9, "tools": tools,
                                                                "messages": a_conv(1)})
    use = r["content"][0]
    assert code == 200 and use["name"] == "Bash" and "SANDFLEET_REPO" in use["input"]["command"], r
    code, r = post(model.url + "/v1/messages", key, {"model": "c", "max_tokens": 9, "system": "Reply with one "
                                                      "```bash block.", "messages": [{"role": "user", "content": "go"}]})
    assert r["stop_reason"] == "end_turn" and "```bash\n" in r["content"][0]["text"]
    code, r = post(model.url + "/v1/responses", key, {"model": "m", "instructions": "Reply with one ```bash block.",
                                                       "input": "go", "stream": False})
    assert r["output"][0]["type"] == "message" and "```bash\n" in r["output"][0]["content"][0]["text"]
    assert [(c["dialect"], c["form"]) for c in logged(model, 3)] == [("messages", "shell"), ("messages", "text"),
                                                                    ("responses", "text")]


def test_a_side_request_with_no_tools_is_answered_but_is_no_step(endpoint):
    """Claude Code asks a small model for a title, a topic or its quota with no tools: in the Messages and
    Responses APIs such a request (no tools, no fenced block) gets a short text and is not a model call of a step
    (a step-0 answer each time would read as recalls of step 0); a pinned dialect keeps the old answer."""
    model, key, _ = endpoint
    code, r = post(model.url + "/v1/messages", key, {"model": "haiku", "max_tokens": 1, "messages": [
        {"role": "user", "content": "quota"}]})
    assert code == 200 and r["stop_reason"] == "end_turn" and r["content"][0]["text"] == "OK."
    code, r = post(model.url + "/v1/responses", key, {"model": "m", "input": "a title for this"})
    assert code == 200 and r["output"][0]["type"] == "message"
    post(model.url + "/v1/messages", key, {"model": "c", "max_tokens": 9, "tools": A_TOOLS, "messages": a_conv(0)})
    assert [c["kind"] for c in logged(model, 1)] == ["tool"] and model.asides == {"t1": 2}
    assert model.delivered("t1") == 1  # an aside is no boundary either
    pinned = ModelEndpoint(model.registry, dialect="tools").start()
    try:
        code, r = post(pinned.url + "/v1/messages", key, {"model": "c", "max_tokens": 9, "messages": a_conv(0)})
        assert r["stop_reason"] == "tool_use"
    finally:
        pinned.stop()
