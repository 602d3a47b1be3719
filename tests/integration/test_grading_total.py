"""A wave is always graded: what a runner sends can never erase the grade of its own task or any other."""
from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from cluster import results
from cluster.grade import exit_code

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
GARBAGE = str(ROOT / "tests" / "runners" / "garbage_s3.py")


def test_a_runner_that_sends_a_garbage_request_line_gets_a_graded_wave(run_wave):
    result, d = run_wave(runner={"name": "garbage-s3", "command": [sys.executable, GARBAGE]}, faults=["PK1"],
                         fault_timing={"PK1": {"after_model_calls": [2, 4]}}, tasks=2, concurrency=2, seed=39,
                         workload={"steps": 6, "think_ms": 20}, deadline_s=90)
    logged = results.read_jsonl(Path(d) / results.PROXY_REQUESTS)
    assert any(r.get("key") is None and r.get("status") == 400 for r in logged), "the proxy logged no garbage"
    for name in (results.SUMMARY, results.VERDICT, results.INDEX_HTML):
        assert (Path(d) / name).is_file(), name
    for g in result["tasks"]:
        assert "graded" not in g["checks"], g["checks"]
        assert results.ResultsDir(d).grade(g["task_id"]).is_file()
    assert orjson.loads((Path(d) / results.VERDICT).read_bytes())["verdict"] == result["verdict"]
    # apart from its garbage the runner is the durable reference: it passes
    assert result["verdict"] == "pass", [(g["task_id"], g["verdict"], g["signature"]) for g in result["tasks"]]
    assert exit_code(result) == 0
