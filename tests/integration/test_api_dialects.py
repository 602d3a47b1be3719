"""The Anthropic Messages and OpenAI Responses dialects end to end: a minimal agent on each real SDK
(tests/runners/anthropic_agent.py), configured by the contract's environment alone, does the workload through the
sandbox's model endpoint; uninterrupted it passes, and killed at a model-call boundary (PK1) it restarts from
scratch and is caught re-asking the model (`no_model_recall`), as any runner that keeps no journal is."""
from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from cluster import results
from cluster.grade import exit_code

pytestmark = pytest.mark.integration
AGENT = str(Path(__file__).resolve().parents[1] / "runners" / "anthropic_agent.py")
BASE = dict(tasks=2, concurrency=2, workload={"steps": 6, "think_ms": 20}, deadline_s=120)
API = {"messages": {}, "responses": {"AGENT_API": "responses"}}


def _agent(api: str) -> dict:
    return {"name": f"sdk-{api}", "command": [sys.executable, AGENT], "env": API[api]}


def _calls(d) -> list[dict]:
    return [orjson.loads(x) for x in (Path(d) / "model-calls.jsonl").read_bytes().splitlines()]


@pytest.mark.parametrize("api", sorted(API))
def test_an_sdk_agent_of_the_dialect_passes_an_uninterrupted_wave(run_wave, api):
    pytest.importorskip("anthropic")
    result, d = run_wave(runner=_agent(api), faults=[], seed=91, **BASE)
    for g in result["tasks"]:
        assert g["verdict"] == "pass", (g["task_id"], g["signature"], g["checks"])
    calls = _calls(d)
    assert calls and {c["dialect"] for c in calls} == {api} and {c["form"] for c in calls} == {"tools"}
    assert {c["kind"] for c in calls} == {"tool", "final"}
    assert {c["stream"] for c in calls} == {True, False}  # both forms of the API were spoken
    assert exit_code(result) == 0


@pytest.mark.parametrize("api", sorted(API))
def test_an_sdk_agent_killed_at_a_model_call_restarts_and_is_caught_re_asking(run_wave, api):
    pytest.importorskip("anthropic")
    result, d = run_wave(runner=_agent(api), faults=["PK1"], fault_timing={"PK1": {"after_model_calls": [2, 3]}},
                         seed=93, **BASE)
    receipts = [r for r in orjson.loads((Path(d) / results.FAULTS).read_bytes()) if r["status"] == "applied"]
    assert receipts, orjson.loads((Path(d) / results.FAULTS).read_bytes())
    for g in result["tasks"]:
        assert g["attempts"] == 2, (g["task_id"], g["attempts"], g["checks"])
        assert g["checks"]["completed"]["verdict"] == "pass", g["checks"]["completed"]
        assert g["checks"]["resume_equivalent"]["verdict"] == "pass", g["checks"]["resume_equivalent"]
        assert g["checks"]["no_double_apply"]["verdict"] == "pass", g["checks"]["no_double_apply"]
        assert g["verdict"] == "fail" and g["signature"] == "no_model_recall", (g["task_id"], g["signature"])
        assert g["model_recalls"] >= 1
    assert {c["dialect"] for c in _calls(d)} == {api}
    assert exit_code(result) == 1
