"""The scripted model's dialects (fleet/dialects.py): which one a request speaks, the step a conversation is at,
and shell commands that do what the workload's tools do (run for real here, against a real effects service)."""
from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from types import SimpleNamespace

import pytest

from fleet import dialects, workloads
from fleet.dialects import Dialect, DialectError, detect
from fleet.effects import EffectsService
from fleet.model_endpoint import ModelEndpoint
from fleet.runners import agentkit
from fleet.services import TaskRegistry
from fleet.workloads.base import ToolStep

WL_TOOLS = {"apply_patch", "publish", "run_tests"}


def _fn(name, props, required):
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": required}}}


BASH = _fn("bash", {"command": {"type": "string"}}, ["command"])
PY = _fn("python", {"code": {"type": "string"}}, ["code"])
EDIT = _fn("str_replace", {"path": {"type": "string"}, "old": {"type": "string"}}, ["path", "old"])


def test_a_request_says_its_dialect():
    wl = [t for t in workloads.get("patch-repo").tools()]
    assert detect({"tools": wl}, WL_TOOLS) == (Dialect("tools"), None)
    assert detect({"tools": [BASH]}, WL_TOOLS) == (Dialect("shell", "bash", "command"), None)
    assert detect({"tools": [EDIT, BASH]}, WL_TOOLS)[0] == Dialect("shell", "bash", "command")
    assert detect({"messages": [{"role": "system", "content": "one ```bash block```"}]}, WL_TOOLS)[0].kind == "text"
    msa = {"role": "system", "content": "Format:\n```mswea_bash_command\nyour_command_here\n```"}  # mini-swe-agent 2
    assert detect({"messages": [msa]}, WL_TOOLS)[0] == Dialect("text", fence="mswea_bash_command")
    # no tools and no fenced block in the instructions: a runner of the contract's first form
    assert detect({"messages": [{"role": "user", "content": "go"}]}, WL_TOOLS)[0].kind == "tools"
    assert detect({"messages": [{"role": "user", "content": "go"}]}, WL_TOOLS, pinned="text")[0].kind == "text"
    seen, note = detect({"tools": [BASH]}, WL_TOOLS, pinned="text")
    assert seen.kind == "shell" and "pinned to 'text'" in note


def test_a_request_no_dialect_can_serve_is_refused_naming_why():
    with pytest.raises(DialectError, match="neither the workload's .* nor a command-style tool"):
        detect({"tools": [EDIT]}, WL_TOOLS)
    two = _fn("run_py", {"src": {"type": "string"}}, ["src"])
    with pytest.raises(DialectError, match="2 command-style tools .* none is the one shell tool"):
        detect({"tools": [two, _fn("go", {"x": {"type": "string"}}, ["x"])]}, WL_TOOLS)
    assert detect({"tools": [two, BASH]}, WL_TOOLS)[0].tool == "bash"  # one is named like a shell: that one
    with pytest.raises(DialectError):
        detect({"tools": [PY, BASH]}, WL_TOOLS)  # two shell-like names: which one is not ours to guess


def test_the_step_is_counted_from_the_conversation_in_every_dialect():
    tool_turns = [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": []},
                  {"role": "tool", "content": "ok"}, {"role": "assistant", "tool_calls": []},
                  {"role": "tool", "content": "ok"}]
    assert dialects.step_of(tool_turns, Dialect("shell", "bash", "command")) == 2
    text = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"},
            {"role": "assistant", "content": "a"}, {"role": "user", "content": "obs"},
            {"role": "assistant", "content": "b"}, {"role": "user", "content": "obs"}]
    assert dialects.step_of(text, Dialect("text")) == 2
    assert dialects.step_of(text[:2], Dialect("text")) == 0


def test_shell_commands_do_what_the_workloads_tools_do(tmp_path):
    """The same steps, once by the built-in runners' tools and once by the dialect's commands: the same files."""
    a, b = tmp_path / "a", tmp_path / "b"
    fixture = workloads.get("rename4").fixture(3)
    for root in (a, b):
        for path, text in fixture.items():
            (root / "repo" / path).parent.mkdir(parents=True, exist_ok=True)
            (root / "repo" / path).write_text(text)
    steps = [s for s in workloads.get("rename4").script(3, 8) if s.tool in ("apply_patch", "apply_edits")]
    steps += [ToolStep(99, "apply_patch", {"path": "new/dir/notes.md", "append": "it's \"quoted\" $HOME `x`"})]
    assert {s.tool for s in steps} == {"apply_patch", "apply_edits"}
    env = SimpleNamespace(workspace=str(a))  # what the tools read of the runner's environment
    for s in steps:
        getattr(agentkit, s.tool)(env, s.arguments)
        p = subprocess.run(["sh", "-c", dialects.command(s)], env={"PATH": "/usr/bin:/bin",
                                                                   "SANDFLEET_REPO": str(b / "repo")},
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, (s, p.stderr)
    def files(root):
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert files(a) == files(b)


def test_the_publish_command_posts_the_effect_with_the_attempts_key(tmp_path):
    reg = TaskRegistry()
    key = reg.register("t1", 5, 6, "patch-repo")
    reg.set_attempt("t1", 1)
    fx = EffectsService(reg, log_path=tmp_path / "fx.jsonl").start()
    try:
        step = next(s for s in workloads.get("patch-repo").script(5, 6) if s.tool == "publish")
        p = subprocess.run(["sh", "-c", dialects.command(step)], capture_output=True, text=True, timeout=30,
                           env={"PATH": "/usr/bin:/bin", "SANDFLEET_EFFECTS_URL": fx.url + "/v1",
                                "SANDFLEET_EFFECTS_KEY": key})
        assert p.returncode == 0, p.stderr
        assert [e["effect_id"] for e in fx.log.snapshot()] == [step.arguments["effect_id"]]
    finally:
        fx.stop()


def test_the_endpoint_answers_each_dialect_and_refuses_what_it_cannot_serve(tmp_path):
    reg = TaskRegistry()
    key = reg.register("t1", 7, 3, "patch-repo")
    reg.set_attempt("t1", 1)
    model = ModelEndpoint(reg, log_path=tmp_path / "calls.jsonl", finish="echo DONE").start()

    def ask(body):
        req = urllib.request.Request(model.base_url + "/chat/completions", method="POST",
                                     data=json.dumps({"model": "m", **body}).encode(),
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        first = workloads.get("patch-repo").script(7, 3)[0]
        st, r = ask({"messages": [{"role": "user", "content": "go"}], "tools": [BASH]})
        call = r["choices"][0]["message"]["tool_calls"][0]["function"]
        assert st == 200 and call["name"] == "bash" and json.loads(call["arguments"]) == {
            "command": dialects.command(first)}
        sys_msg = {"role": "system", "content": "answer with one ```bash``` block"}
        st, r = ask({"messages": [sys_msg, {"role": "user", "content": "go"}]})
        assert st == 200 and "```bash\n" + dialects.command(first) + "\n```" in r["choices"][0]["message"]["content"]
        done = [sys_msg, {"role": "user", "content": "go"}] + [
            m for _ in range(3) for m in ({"role": "assistant", "content": "x"}, {"role": "user", "content": "o"})]
        st, r = ask({"messages": done})
        assert st == 200 and "```bash\necho DONE\n```" in r["choices"][0]["message"]["content"]
        st, r = ask({"messages": [{"role": "user", "content": "go"}], "tools": [EDIT]})
        assert st == 400 and r["error"]["code"] == "unsupported_dialect" and "command-style" in r["error"]["message"]
        # a call is logged once its answer is sent, so the next call's record can be appended first: order by
        # when each call arrived (each was sent after the one before it was answered)
        log = sorted(model.log.snapshot(), key=lambda c: c["t"])
        assert [c["dialect"] for c in log] == ["shell", "text", "text", None] and log[-1]["kind"] == "refused"
    finally:
        model.stop()
        os.environ.pop("SANDFLEET_REPO", None)
