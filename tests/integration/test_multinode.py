"""Multi-node waves on a simulated Ray cluster (`--nodes 3`: a head with the harness, two sandbox nodes, every
one a real raylet on 127.0.0.1) and PK3 node loss, run through the CLI as a user runs it. The wave makes its own
cluster in its own temp dir; the suite's leftover check proves it went away whole."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _wave(tmp_path, body: str, *more: str) -> tuple[subprocess.CompletedProcess, Path]:
    cfg = tmp_path / "wave.yaml"
    cfg.write_text(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--nodes", "3", *more,
                        "--results", str(tmp_path / "r"), "--no-progress"],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
    return r, (tmp_path / "r" / "latest").resolve()


def _timeline(wave: Path) -> list[dict]:
    return [orjson.loads(line) for line in (wave / "timeline.jsonl").read_bytes().splitlines()]


def _check_node_loss(r, wave: Path) -> list[dict]:
    """Every applied PK3: the node's attempts ended with it, their tasks went on on the other node while it was
    gone, no attempt was placed on it meanwhile, it came back, and every task it hit passes."""
    assert r.returncode in (0, 2), (r.stdout[-3000:], r.stderr[-3000:])  # 2: some PK3 could not apply
    tl = _timeline(wave)
    assert next(e for e in tl if e["event"] == "wave_end")["harness_error"] is None
    plan = orjson.loads((wave / "plan.json").read_bytes())
    assert plan["placement"]["sandbox_nodes"] == ["node-1", "node-2"]
    receipts = [x for x in orjson.loads((wave / "faults.json").read_bytes()) if x["fault_id"] == "PK3"]
    applied = [x for x in receipts if x["status"] == "applied"]
    assert applied and all(x["status"] in ("applied", "not_applied") for x in receipts), receipts
    ends = {e["sandbox"]: e for e in tl if e["event"] == "attempt_end"}
    starts = [e for e in tl if e["event"] == "attempt_start"]
    for rec in applied:
        lost = rec["target"]["node"]
        other = "node-2" if lost == "node-1" else "node-1"
        assert rec["target"]["sandboxes"] and "back as a new Ray node" in rec["detail"], rec
        t_lost = next(e["wall"] for e in tl if e["event"] == "node_lost" and e["fault"] == rec["instance"])
        t_back = next(e["wall"] for e in tl if e["event"] == "node_back" and e["fault"] == rec["instance"])
        assert t_lost < t_back
        for sid in rec["target"]["sandboxes"]:
            tid, n = sid.rsplit("-a", 1)
            assert ends[sid]["exit_code"] != 0, ends[sid]  # it ended with the node (or on the drain's SIGTERM)
            nxt = [e for e in starts if e["task"] == tid and e["attempt"] == int(n) + 1]
            assert nxt and nxt[0]["node"] == other and nxt[0]["wall"] < t_back, (sid, nxt, t_back)
            grade = orjson.loads((wave / f"{tid}.grade.json").read_bytes())
            assert grade["verdict"] == "pass", (tid, grade["checks"])
        assert not [e for e in starts if e["node"] == lost and t_lost <= e["wall"] < t_back]
    for t in plan["tasks"]:
        assert orjson.loads((wave / f"{t['task_id']}.grade.json").read_bytes())["verdict"] in ("pass", "not_applied")
    sweep = orjson.loads((wave / "sandbox-sweep.json").read_bytes())
    assert not sweep["leaked"] and not sweep["problems"], sweep
    return applied


# isolated: each sandbox node a process tree in namespaces of its own (cluster/isolated.py), lost whole
ISOLATION = [pytest.param((), id="shared"), pytest.param(("--isolated-nodes",), id="isolated")]


@pytest.mark.parametrize("isolation", ISOLATION)
def test_pk3_abrupt_node_loss_tasks_finish_on_the_other_node(tmp_path, isolation):
    r, wave = _wave(tmp_path, "tasks: 4\nconcurrency: 4\nseed: 11\nfaults: [PK3]\n"
                              "fault_timing: {PK3: {mode: abrupt, after_model_calls: [2, 3], down_s: [11, 12]}}\nlease_ttl_s: 3\n"
                              "workload: {steps: 6, think_ms: 80}\n", *isolation)
    for rec in _check_node_loss(r, wave):
        assert "raylet and host killed at once" in rec["detail"]


@pytest.mark.parametrize("isolation", ISOLATION)
def test_pk3_drain_gives_notice_then_loses_the_node(tmp_path, isolation):
    r, wave = _wave(tmp_path, "tasks: 4\nconcurrency: 4\nseed: 12\nfaults: [PK3]\n"
                              "fault_timing: {PK3: {mode: drain, window_s: [1, 1.5], after_model_calls: [2, 3], "
                              "down_s: [11, 12]}}\nlease_ttl_s: 3\nworkload: {steps: 6, think_ms: 80}\n", *isolation)
    for rec in _check_node_loss(r, wave):
        assert "drained for PREEMPTION (accepted by the GCS)" in rec["detail"], rec["detail"]
        assert "notice + SIGTERM to " in rec["detail"] and "notice + SIGTERM to 0 " not in rec["detail"]


def test_pk3_needs_a_cluster(tmp_path):
    cfg = tmp_path / "w.yaml"
    cfg.write_text("tasks: 1\nfaults: [PK3]\n")
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--results",
                        str(tmp_path / "r"), "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 254, r
    assert "PK3" in r.stderr and "nodes >= 3" in r.stderr and "--nodes 3" in r.stderr
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())
