"""Node-level faults that fit the cluster (issue 45): on three isolated nodes (a head and two sandbox nodes) every task
of a 4-task wave plans PK3, or NP1, and the wave exits 0 with the durable runner. The tasks with a node-level fault
take turns (one fewer than the sandbox nodes), each owning a node of its own for its turn, so no two of them take or
cut the same node, and every fault applies; none comes out `not_applied` for a node another fault held."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from cluster import isolated
from tests import leftovers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _wave(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess, Path]:
    cfg = tmp_path / "wave.yaml"
    cfg.write_text("tasks: 4\nconcurrency: 4\nnodes: 3\nnode_isolation: namespaces\nrunner: durable\n" + body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--results",
                        str(tmp_path / "r"), "--no-progress"], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    return r, (tmp_path / "r" / "latest").resolve()


def _check_turns(r, wave: Path, fid: str, taken: str, back: str) -> list[dict]:
    """Exit 0; every `fid` applied on the node its task's turn owned; the turns' node windows (`taken` to `back`)
    never overlap; every task passes."""
    receipts = [x for x in orjson.loads((wave / "faults.json").read_bytes()) if x["fault_id"] == fid]
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:],
                               [(x["task_id"], x["status"], x["detail"]) for x in receipts])
    assert len(receipts) == 4 and all(x["status"] == "applied" for x in receipts), \
        [(x["task_id"], x["status"], x["detail"]) for x in receipts]
    tl = [orjson.loads(line) for line in (wave / "timeline.jsonl").read_bytes().splitlines()]
    turns = {e["task"]: e for e in tl if e["event"] == "node_fault_turn"}
    assert sorted(turns) == ["t000", "t001", "t002", "t003"], turns
    windows = []
    for x in receipts:
        assert x["target"]["node"] == turns[x["task_id"]]["node"], (x, turns[x["task_id"]])
        t0 = next(e["wall"] for e in tl if e["event"] == taken and e["fault"] == x["instance"])
        t1 = next(e["wall"] for e in tl if e["event"] == back and e["fault"] == x["instance"])
        windows.append((t0, t1))
    windows.sort()
    assert all(a[1] <= b[0] for a, b in zip(windows, windows[1:])), windows  # one node-level fault at a time
    for t in orjson.loads((wave / "plan.json").read_bytes())["tasks"]:
        grade = orjson.loads((wave / f"{t['task_id']}.grade.json").read_bytes())
        assert grade["verdict"] == "pass", (t["task_id"], grade["checks"])
    return receipts


def test_a_pk3_wave_of_4_tasks_on_3_isolated_nodes_exits_0_every_node_loss_applied(tmp_path):
    before = leftovers.snapshot()
    r, wave = _wave(tmp_path, "seed: 11\nfaults: [PK3]\nlease_ttl_s: 3\nworkload: {steps: 6, think_ms: 80}\n"
                              "fault_timing: {PK3: {after_model_calls: [2, 3], down_s: [2, 3]}}\n")
    for rec in _check_turns(r, wave, "PK3", "node_lost", "node_back"):
        assert "back as a new Ray node" in rec["detail"], rec["detail"]
    left = leftovers.wait_clean(before)
    assert not left, left
    assert not isolated.leftover_node_cgroups()


def test_an_np1_wave_of_4_tasks_on_3_isolated_nodes_exits_0_every_cut_applied(tmp_path):
    before = leftovers.snapshot()
    r, wave = _wave(tmp_path, "seed: 11\nfaults: [NP1]\nworkload: {steps: 6, think_ms: 50}\n"
                              "fault_timing: {NP1: {after_model_calls: [2, 2], window_s: [1.5, 2.0]}}\n")
    for rec in _check_turns(r, wave, "NP1", "link_cut", "link_healed"):
        assert "keys revoked" in rec["detail"], rec["detail"]
    left = leftovers.wait_clean(before)
    assert not left, left
    assert not isolated.leftover_node_cgroups()
