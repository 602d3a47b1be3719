"""Interruptions that keep the disk (`sandbox.disk: keep`): the next attempt starts in a new sandbox on the task's
own volume, as a restarted container or a rebooted VM does, and what the runner left there is what it meets. The
league can then tell a runner that persists locally from one that does not."""
from __future__ import annotations

from pathlib import Path

import pytest

from cluster import results
from cluster.grade import exit_code

pytestmark = pytest.mark.integration
PK1 = {"PK1": {"after_model_calls": [3, 4]}}
BASE = dict(faults=["PK1"], tasks=2, concurrency=2, workload={"steps": 6, "think_ms": 20}, deadline_s=90)


def _mounts() -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if "sandfleet-vol." in line]


def _starts(d) -> list[dict]:
    return [e for e in results.read_jsonl(Path(d) / results.TIMELINE) if e["event"] == "attempt_start"]


def test_a_local_journal_survives_a_kill_that_keeps_the_disk_and_not_one_that_wipes_it(run_wave):
    result, d = run_wave(runner="durable-local", sandbox={"disk": "keep"}, fault_timing=PK1, seed=71, **BASE)
    for g in result["tasks"]:
        assert g["verdict"] == "pass" and g["attempts"] == 2, (g["task_id"], g["signature"], g["checks"])
        assert g["model_recalls"] == 0
    second = [e for e in _starts(d) if e["attempt"] == 2 and not e["task"].startswith("ref-")]
    assert second and all(e["disk"]["mode"] == "keep" and e["disk"]["kept"] for e in second), second
    receipts = [r for r in __import__("orjson").loads((Path(d) / results.FAULTS).read_bytes())
                if r["status"] == "applied"]
    assert receipts and all(r["evidence"]["disk"] == {"mode": "keep", "kept": True} for r in receipts), receipts
    assert exit_code(result) == 0
    assert not _mounts(), _mounts()  # every task's volume went with its task

    result, d = run_wave(runner="durable-local", fault_timing=PK1, seed=71, **BASE)  # the default: wipe
    for g in result["tasks"]:
        assert g["verdict"] == "fail" and "no_model_recall" in g["signature"], (g["task_id"], g["signature"])
    assert exit_code(result) == 1


def test_a_crash_loops_own_disk_mode_is_the_one_each_of_its_kills_leaves(run_wave):
    """PK4 kills each new attempt in turn and names each kill `<instance>#<n>`: its own `disk: keep` (the wave's
    sandbox.disk is the default wipe) is what every attempt after a kill starts on, and its receipt says so."""
    result, d = run_wave(runner="durable-local", faults=["PK4"], tasks=1, concurrency=1, seed=79,
                         fault_timing={"PK4": {"kills": 2, "window_s": [0.4, 0.5], "disk": "keep"}},
                         workload={"steps": 8, "think_ms": 200}, deadline_s=90)
    g = result["tasks"][0]
    assert g["verdict"] == "pass" and g["model_recalls"] == 0, (g["signature"], g["checks"])
    later = [e for e in _starts(d) if e["attempt"] > 1 and not e["task"].startswith("ref-")]
    assert later and all(e["disk"]["mode"] == "keep" and e["disk"]["kept"] for e in later), later
    [rec] = [r for r in __import__("orjson").loads((Path(d) / results.FAULTS).read_bytes()) if r["fault_id"] == "PK4"]
    assert rec["status"] == "applied" and rec["evidence"]["disk"] == {"mode": "keep", "kept": True}, rec
    assert exit_code(result) == 0 and not _mounts()


def test_the_store_journaled_reference_passes_on_a_kept_disk(run_wave):
    """durable journals to the store and replays over a fresh repo: on a kept disk it lays the repo anew from the
    base it kept at its first attempt, or every recorded step would land twice."""
    result, d = run_wave(runner="durable", sandbox={"disk": "keep"}, fault_timing=PK1, seed=73, **BASE)
    assert result["verdict"] == "pass", [(g["task_id"], g["signature"]) for g in result["tasks"]]
    assert exit_code(result) == 0


def test_a_runner_that_replays_over_what_it_left_on_a_kept_disk_is_caught(run_wave):
    """naive mirrors its workspace in place and replays from its last checkpoint: on a kept disk the steps it had
    applied since land again (001: a hunk on the workspace disk before its step was recorded lands twice)."""
    result, d = run_wave(runner="naive", sandbox={"disk": "keep"}, seed=75, tasks=2, concurrency=2, faults=["PK1"],
                         fault_timing={"PK1": {"after_model_calls": [5, 5]}}, workload={"steps": 6, "think_ms": 20},
                         deadline_s=90)
    for g in result["tasks"]:
        assert g["verdict"] == "fail" and g["checks"]["no_double_apply"]["applied_twice"], (g["task_id"], g["checks"])
    assert exit_code(result) == 1


LOCAL = str(Path(__file__).resolve().parents[2] / "tests" / "runners" / "local_defects.py")


def local_defect(defect: str) -> dict:
    import sys

    return {"name": f"local-{defect}", "command": [sys.executable, LOCAL], "env": {"DEFECT": defect}}


def test_a_journal_never_fsynced_survives_keep_and_not_a_power_loss(run_wave):
    """The lazy file system (fleet/lazyfs/) under the task's volume drops what was not fsynced at the kill: a
    journal appended with no fsync, beside repo changes that were synced, passes a kill that keeps the disk and
    applies its steps twice after a power loss. Nothing of the layer is left behind."""
    kill = {"after_model_calls": [4, 4]}
    result, d = run_wave(runner=local_defect("nosync_journal"), sandbox={"disk": "keep"},
                         fault_timing={"PK1": kill}, seed=77, **BASE)
    assert result["verdict"] == "pass", [(g["task_id"], g["signature"]) for g in result["tasks"]]
    result, d = run_wave(runner=local_defect("nosync_journal"), sandbox={"disk": "lose-unsynced"},
                         fault_timing={"PK1": kill}, seed=77, **BASE)
    for g in result["tasks"]:
        assert g["verdict"] == "fail" and g["checks"]["no_double_apply"]["applied_twice"], (g["task_id"],
                                                                                            g["checks"])
    receipts = [r for r in __import__("orjson").loads((Path(d) / results.FAULTS).read_bytes())
                if r["status"] == "applied"]
    assert receipts and all(r["evidence"]["disk"]["mode"] == "lose-unsynced" and
                            r["evidence"]["disk"]["done"]["crash"] == "drop" for r in receipts), receipts
    assert exit_code(result) == 1
    assert not _mounts() and not [x for x in Path("/proc/self/mountinfo").read_text().splitlines()
                                  if "sandfleet-lazyfs" in x]


def test_the_local_journal_reference_survives_a_power_loss_and_a_torn_write(run_wave):
    """durable-local writes each record to a temp file, fsyncs it, renames it and fsyncs the directory (and every
    directory it made): a power loss, or one that tears the write in flight, loses no record it relied on."""
    for mode in ("lose-unsynced", "torn"):
        result, d = run_wave(runner="durable-local", sandbox={"disk": mode}, fault_timing=PK1, seed=79, **BASE)
        assert result["verdict"] == "pass", (mode, [(g["task_id"], g["signature"], g["checks"]) for g in
                                                    result["tasks"] if g["verdict"] != "pass"])


def test_a_kill_mid_journal_append_tears_it_and_only_a_runner_with_frame_checks_survives(run_wave):
    """DCP-2.0's SENTINEL_WRITE on every run: PK1 armed at the runner's own 3rd disk write (held by the lazy file
    system while the sandbox is killed), on a torn disk. The write-ahead journal's 2nd append is that write: a
    runner that reads its journal back with no frame check chokes on the torn line on every attempt; the same
    runner that stops at the first bad frame (nosync_journal fsyncs nothing, so here it has nothing to tear) and the
    durable-local reference survive."""
    torn = dict(BASE, tasks=1, concurrency=1, sandbox={"disk": "torn"},
                fault_timing={"PK1": {"after_disk_writes": [3, 3]}})
    result, d = run_wave(runner=local_defect("unchecked_frames"), seed=81, max_attempts=3, **torn)
    g = result["tasks"][0]
    receipts = [r for r in __import__("orjson").loads((Path(d) / results.FAULTS).read_bytes())
                if r["task_id"] == "t000"]
    assert receipts[0]["status"] == "applied" and "disk write #3" in receipts[0]["detail"], receipts
    assert ".journal.jsonl" in receipts[0]["detail"], receipts
    torn_receipt = receipts[0]["evidence"]["disk"]["done"]
    assert torn_receipt["crash"] == "tear", torn_receipt
    assert g["verdict"] == "fail" and g["checks"]["completed"]["verdict"] == "fail", (g["signature"], g["checks"])
    result, d = run_wave(runner="durable-local", seed=81, **torn)
    assert result["verdict"] == "pass", [(g["task_id"], g["signature"], g["checks"]) for g in result["tasks"]]


@pytest.mark.parametrize("runner", ["durable", "durable-local"])
def test_the_durable_references_pass_every_mode_at_a_sample_of_their_disk_boundaries(run_wave, runner):
    """--enumerate-boundaries on a kept disk counts the uninterrupted run's own writes, fsyncs and renames (the lazy
    file system serves the volume, under keep too) and kills a seeded sample of them: the store-journaled reference
    and the local-journal one pass keep, lose-unsynced and torn at each. Nothing of the layer is left behind."""
    for mode in ("keep", "lose-unsynced", "torn"):
        result, d = run_wave(runner=runner, sandbox={"disk": mode}, enumerate_boundaries=True, boundaries=4, seed=83,
                             concurrency=2, workload={"steps": 3, "think_ms": 20}, deadline_s=90)
        plan = __import__("orjson").loads((Path(d) / results.PLAN).read_bytes())
        counts = plan["enumerate"]["counts"]
        assert counts.get("disk_write", 0) > 0, (mode, counts)  # the runner writes its repo on the volume
        at_disk = [t for t in plan["tasks"] if t["boundary"]["kind"].startswith("disk_")]
        assert len(at_disk) == 2 and len(plan["tasks"]) == 4, (mode, [t["boundary"] for t in plan["tasks"]])
        receipts = {r["task_id"]: r for r in __import__("orjson").loads((Path(d) / results.FAULTS).read_bytes())}
        by_id = {g["task_id"]: g for g in result["tasks"]}
        for t in plan["tasks"]:  # a pass; or a kill that could not land, or landed before the runner's first
            g, r = by_id[t["task_id"]], receipts[t["task_id"]]  # model answer (not_exercised: tests nothing)
            assert g["verdict"] == "pass" or (g["verdict"] == "not_applied" and (
                r["status"] == "not_applied" or g["not_exercised"] == [f"{t['task_id']}-PK1"])), (
                mode, t["boundary"], r["status"], r["detail"], g["signature"], g["checks"])
        for t in at_disk:  # each disk kill landed while the runner's op was held, and the mode was done after it
            r = receipts[t["task_id"]]
            if r["status"] == "applied":
                assert "was held by the lazy file system" in r["detail"], r
                assert r["evidence"]["disk"]["mode"] == mode and r["evidence"]["disk"]["kept"], r["evidence"]
        assert sum(receipts[t["task_id"]]["status"] == "applied" for t in at_disk) >= 1, (mode, receipts)
        assert exit_code(result) in (0, 2), (mode, exit_code(result))
    assert not _mounts() and not [x for x in Path("/proc/self/mountinfo").read_text().splitlines()
                                  if "sandfleet-lazyfs" in x]


def _isolated_pk3_wave(tmp_path: Path, disk: str):
    """One durable-local task on three isolated nodes; its node is lost (abrupt) right after its 2nd model answer,
    and the loss leaves its disk as `disk` says."""
    import os
    import subprocess
    import sys

    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "pk3.yaml"
    cfg.write_text("tasks: 1\nconcurrency: 1\nseed: 11\nrunner: durable-local\nfaults: [PK3]\nnodes: 3\n"
                   "node_isolation: namespaces\nlease_ttl_s: 3\nworkload: {steps: 6, think_ms: 80}\n"
                   "fault_timing: {PK3: {mode: abrupt, after_model_calls: [2, 2], down_s: [11, 12], disk: "
                   f"{disk}}}}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--results",
                        str(tmp_path / "r"), "--no-progress"], env=env, cwd=root, capture_output=True, text=True,
                       timeout=400)
    return r, (tmp_path / "r" / "latest").resolve()


def test_move_re_attaches_the_volume_on_another_node_after_a_node_loss_on_isolated_nodes(tmp_path):
    """`move` (PK3): before the node goes, its host stops the sandbox and reads the task's volume back; only Ray
    carries it to the driver and on to the next attempt's host, on the other node, which lays it on a fresh volume.
    The local-journal reference resumes from its journal there (no model call asked again); with the disk wiped
    the same task asks the model again (no_model_recall). Nothing is left behind."""
    import orjson

    from cluster import isolated
    from tests import leftovers

    before = leftovers.snapshot()
    r, wave = _isolated_pk3_wave(tmp_path / "move", "move")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    pk3 = [x for x in orjson.loads((wave / results.FAULTS).read_bytes()) if x["fault_id"] == "PK3"]
    assert pk3 and pk3[0]["status"] == "applied", pk3
    starts = [e for e in results.read_jsonl(wave / results.TIMELINE)
              if e["event"] == "attempt_start" and e["task"] == "t000"]
    assert len(starts) >= 2 and starts[0]["node"] == pk3[0]["target"]["node"], starts
    moved = starts[1]["disk"]
    assert moved["mode"] == "move" and moved["kept"], moved
    assert moved["moved"]["from"] == starts[0]["node"] != moved["moved"]["to"] == starts[1]["node"], moved
    assert moved["moved"]["files"] >= 1 and moved["moved"]["bytes"] > 0, moved
    assert pk3[0]["evidence"]["moved"]["t000"]["moved"] and pk3[0]["evidence"]["moved"]["t000"]["stopped"] >= 1, \
        pk3[0]["evidence"]
    g = orjson.loads((wave / "t000.grade.json").read_bytes())
    assert g["verdict"] == "pass" and g["model_recalls"] == 0, (g["signature"], g["checks"])

    r, wave = _isolated_pk3_wave(tmp_path / "wipe", "wipe")
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-3000:])
    g = orjson.loads((wave / "t000.grade.json").read_bytes())
    assert g["verdict"] == "fail" and "no_model_recall" in g["signature"], (g["signature"], g["checks"])
    left = leftovers.wait_clean(before)
    assert not left, left
    assert not isolated.leftover_node_cgroups()
