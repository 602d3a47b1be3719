"""`sandfleet wave resume` continues a wave whose driver was SIGKILLed: tasks that ended keep their results
(none runs again), the ones it left running get a new attempt with the next fence, every task passes (no
step asked twice, nothing applied twice), and nothing is left behind."""
from __future__ import annotations

import subprocess
import sys
import time

import orjson
import pytest

from fleet import cgroups
from tests import leftovers

pytestmark = pytest.mark.integration

CONFIG = """
tasks: 6
concurrency: 3
seed: 23
runner: durable
faults: [PK1]
fault_timing: {PK1: {after_model_calls: [2, 5]}}
workload: {steps: 8, think_ms: 100}
deadline_s: 120
"""


def _gcs_address() -> str:
    import ray

    return ray.get_runtime_context().gcs_address


def _events(d):
    return [orjson.loads(l) for l in (d / "timeline.jsonl").read_bytes().splitlines() if l.strip()]


def test_a_wave_whose_driver_was_killed_resumes_and_no_task_runs_twice(fleet, tmp_path):
    results = tmp_path / "results"
    cfg = tmp_path / "wave.yaml"
    cfg.write_text(CONFIG)
    before, harness_before = leftovers.snapshot(), cgroups.harness_dirs()
    p = subprocess.Popen([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--address", _gcs_address(),
                          "--results", str(results), "--no-progress"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        ready = False
        while time.monotonic() < deadline and p.poll() is None and not ready:
            tl = list(results.glob("w-*/timeline.jsonl"))
            if tl:
                ev = [orjson.loads(l) for l in tl[0].read_bytes().splitlines() if l.strip()]
                ended = {e["task"] for e in ev if e["event"] == "task_end"}
                running = {e["task"] for e in ev if e["event"] == "attempt_start"} - ended
                # some faulted tasks done, some mid-attempt
                ready = any(not t.startswith("ref-") for t in ended) and any(not t.startswith("ref-") for t in running)
            time.sleep(0.05)
        assert ready, "the wave never had finished and running tasks at once"
        p.kill()  # the driver dies: no teardown, no grade
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    d = next(results.glob("w-*"))
    before_kill = _events(d)
    done_before = {e["task"] for e in before_kill if e["event"] == "task_end"}
    cut_off = {e["task"] for e in before_kill if e["event"] == "attempt_start"} - done_before
    fences = {}
    for e in before_kill:
        if e["event"] == "attempt_start":
            fences[e["task"]] = max(fences.get(e["task"], 0), e["fence"])

    # the sweep the fleet's error tells the user to run (issue 42: it deleted the store, and resume then failed
    # with "store data gone"): the dead wave is listed as resumable, its store and ledger are kept
    sw = subprocess.run([sys.executable, "-m", "cluster.cli", "sweep", "--wave", d.name], capture_output=True,
                        text=True, timeout=120)
    assert sw.returncode == 0 and "resumable by `sandfleet wave resume`" in sw.stdout, (sw.stdout, sw.stderr)
    assert f"kept the store data and ledger of resumable wave {d.name}" in sw.stdout, sw.stdout
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "resume", str(d), "--address", _gcs_address(),
                        "--no-progress"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"SUMMARY: {d / 'SUMMARY.md'}" in r.stdout
    events = _events(d)
    resumed = next(i for i, e in enumerate(events) if e["event"] == "wave_resumed")
    after = events[resumed:]
    # no task that had ended runs again; each task ended exactly once
    assert not [e for e in after if e["event"] == "attempt_start" and e["task"] in done_before]
    ends = [e["task"] for e in events if e["event"] == "task_end"]
    assert sorted(ends) == sorted(set(ends)), "a task ended twice"
    plan = orjson.loads((d / "plan.json").read_bytes())
    assert set(ends) == {t["task_id"] for t in plan["tasks"] + plan["references"]}
    # a task cut off mid-attempt continues with the next fence
    for tid in cut_off:
        nxt = [e["fence"] for e in after if e["event"] == "attempt_start" and e["task"] == tid]
        assert nxt and min(nxt) > fences[tid], (tid, nxt, fences[tid])
    grades = [orjson.loads(g.read_bytes()) for g in d.glob("*.grade.json")]
    bad = {g["task_id"]: g["signature"] or g["verdict"] for g in grades if g["verdict"] != "pass"}
    assert not bad, bad
    assert not leftovers.wait_clean(before), "the resumed wave left something behind"
    assert not set(cgroups.harness_dirs()) - set(harness_before)
    again = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "resume", str(d), "--address",
                            _gcs_address()], capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already ended" in again.stderr, again.stderr
