"""The scale bench's hollow nodes (fleet/hollow.py) through the CLI: a wave on 3 hollow nodes runs every task's
attempt on a real sandbox host whose sandbox follows the runner protocol against the real head (model, store
through the proxy, effects), the sweep actor merges the 3 hosts' scans, and the suite's leftover check proves
nothing outlives it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_a_wave_on_hollow_nodes_runs_on_each_and_ends_with_nothing_left(tmp_path):
    cfg = tmp_path / "wave.yaml"
    cfg.write_text("tasks: 6\nconcurrency: 6\nseed: 5\nrunner: durable\nfaults: none\n"
                   "workload: {steps: 3, think_ms: 20}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["SANDFLEET_BENCH_HOLLOW_NODES"] = "3"
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--results",
                        str(tmp_path / "r"), "--no-progress"], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=400)
    wave = (tmp_path / "r" / "latest").resolve()
    assert r.returncode in (0, 1), (r.stdout[-3000:], r.stderr[-3000:])
    tl = [orjson.loads(x) for x in (wave / "timeline.jsonl").read_bytes().splitlines()]
    assert next(e for e in tl if e["event"] == "wave_end")["harness_error"] is None
    starts = [e for e in tl if e["event"] == "attempt_start"]
    assert {e["node"] for e in starts} == {"hollow-0", "hollow-1", "hollow-2"}
    ends = [e for e in tl if e["event"] == "attempt_end"]
    assert ends and all(e["exit_code"] == 0 for e in ends), ends
    calls = (wave / "model-calls.jsonl").read_bytes().splitlines()
    puts = [x for x in (wave / "proxy-requests.jsonl").read_bytes().splitlines() if b'"PUT"' in x]
    assert len(calls) >= 6 * 3 and len(puts) >= 6 * 3  # every step asked the model and committed its record
    sweeper = orjson.loads((wave / "sweeper.json").read_bytes())
    assert sweeper, sweeper
