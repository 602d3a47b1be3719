"""SIGINT and SIGTERM stop a wave in order: sandboxes killed, leases released, faults cleared, parts
stopped, what finished graded, SUMMARY.md marked interrupted, exit 130 / 143, nothing left running.
The CLI joins the session's Ray through --address (one Ray per test run)."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import orjson
import pytest

from tests import leftovers

pytestmark = pytest.mark.integration


def _gcs_address() -> str:
    import ray

    return ray.get_runtime_context().gcs_address


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_wave_in_order(fleet, tmp_path, sig, code):
    results = tmp_path / "results"
    before = leftovers.snapshot()  # what this test leaves, not what a dead earlier run left on the machine
    p = subprocess.Popen([sys.executable, "-m", "cluster.cli", "wave", "run", "--tasks", "4", "--concurrency", "2",
                          "--faults", "ST1", "--seed", "6", "--address", _gcs_address(), "--results", str(results),
                          "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        started = False
        while time.monotonic() < deadline and p.poll() is None and not started:
            tl = list(results.glob("w-*/timeline.jsonl"))
            started = bool(tl) and b'"attempt_start"' in tl[0].read_bytes()
            time.sleep(0.1)
        assert started, "the wave never started an attempt"
        time.sleep(0.5)
        p.send_signal(sig)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == code, (out, err)
    d = next(results.glob("w-*"))
    assert f"SUMMARY: {d / 'SUMMARY.md'}" in out
    assert f"Interrupted by {sig.name}" in (d / "SUMMARY.md").read_text()
    events = [orjson.loads(l) for l in (d / "timeline.jsonl").read_bytes().splitlines() if l.strip()]
    assert any(e["event"] == "wave_interrupted" for e in events)
    leases = [orjson.loads(l) for l in (d / "ledger.jsonl").read_bytes().splitlines() if l.strip()]
    assert all(r["state"] != "active" for r in leases if r["kind"] == "lease"), "a lease was left active"
    receipts = orjson.loads((d / "faults.json").read_bytes())
    assert all(r.get("cleared_at") or r["status"] != "applied" for r in receipts)
    grades = [orjson.loads(p.read_bytes()) for p in d.glob("t*.grade.json")]
    assert grades and all(g["verdict"] in ("pass", "unknown", "not_applied") for g in grades)
    assert not leftovers.wait_clean(before), "something of the interrupted wave is still running"


def test_a_signal_while_a_zombie_waits_for_its_newer_attempt_stops_its_wait_and_its_receipt_says_so(fleet, tmp_path):
    """PK6's zombie waits (up to 120 s) for a newer attempt to take its task; a SIGINT while that attempt waits on
    the zombie's lease (20 s TTL) ends the wait: the zombie is thawed, watched and killed, and its receipt says the
    wave stopped, not that no newer attempt came."""
    results, cfg = tmp_path / "results", tmp_path / "wave.yaml"
    cfg.write_text("tasks: 1\nconcurrency: 1\nfaults: [PK6]\nlease_ttl_s: 20\ndeadline_s: 90\n"
                   "fault_timing: {PK6: {after_model_calls: [2, 3]}}\nworkload: {steps: 6, think_ms: 80}\n")
    before = leftovers.snapshot()
    p = subprocess.Popen([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--address", _gcs_address(),
                          "--results", str(results), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline, busy = time.monotonic() + 120, False
        while time.monotonic() < deadline and p.poll() is None and not busy:
            tl = list(results.glob("w-*/timeline.jsonl"))
            busy = bool(tl) and b'"lease_busy"' in tl[0].read_bytes()
            time.sleep(0.1)
        assert busy, "the new attempt never found the zombie's lease busy"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == 130, (out, err[-2000:])
    d = next(results.glob("w-*"))
    [r] = orjson.loads((d / "faults.json").read_bytes())
    assert r["status"] == "applied" and "the wave stopped (interrupted by SIGINT) before a newer attempt" in r["detail"]
    assert "NO newer attempt" not in r["detail"] and "thawed at once" in r["detail"], r["detail"]
    assert not leftovers.wait_clean(before), "something of the interrupted wave is still running"


def test_sweep_removes_what_a_killed_driver_left(fleet, tmp_path):
    """SIGKILL of the driver mid-wave leaves the store, the proxy, sandbox cgroups, mounts and key files;
    `sandfleet sweep` finds them by their markers (the wave's driver is dead) and removes every one."""
    results = tmp_path / "results"
    before = leftovers.snapshot()
    p = subprocess.Popen([sys.executable, "-m", "cluster.cli", "wave", "run", "--tasks", "4", "--concurrency", "2",
                          "--faults", "none", "--seed", "8", "--address", _gcs_address(), "--results", str(results),
                          "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        started = False
        while time.monotonic() < deadline and p.poll() is None and not started:
            tl = list(results.glob("w-*/timeline.jsonl"))
            started = bool(tl) and b'"attempt_start"' in tl[0].read_bytes()
            time.sleep(0.1)
        assert started
        time.sleep(0.5)
        p.kill()
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    wave = next(results.glob("w-*")).name
    time.sleep(1.0)
    left = {k: [x for x in v if x not in before[k]] for k, v in leftovers.snapshot().items()}
    assert left["processes"] and left["private_dirs"], f"the killed driver left nothing to sweep: {left}"
    dry = subprocess.run([sys.executable, "-m", "cluster.cli", "sweep", "--dry-run"], capture_output=True,
                         text=True, timeout=60)
    assert dry.returncode == 0 and f"would remove: {wave}" in dry.stdout, dry.stdout
    after_dry = leftovers.snapshot()  # --dry-run changed nothing
    assert {k: [x for x in left[k] if x not in after_dry[k]] for k in ("private_dirs", "cgroups", "mounts")} == \
        {"private_dirs": [], "cgroups": [], "mounts": []}
    # a killed driver's wave can be resumed: a plain sweep keeps its store and ledger (issue 42); the user who wants
    # everything gone says so
    run = subprocess.run([sys.executable, "-m", "cluster.cli", "sweep", "--include-resumable"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0 and f"found: {wave}" in run.stdout, run.stdout + run.stderr
    assert not leftovers.wait_clean(before), "sweep left something of the dead wave"
    again = subprocess.run([sys.executable, "-m", "cluster.cli", "sweep"], capture_output=True, text=True,
                           timeout=60)
    assert "nothing left behind" in again.stdout


def test_sigint_ends_every_process_of_the_waves_own_ray(tmp_path):
    """A CLI wave on its own private Ray, stopped by SIGINT once its first attempt started: exit 130, and nothing of
    the wave is left, its Ray's `DashboardAgent` and `RuntimeEnvAgent` included (found by PID while the wave ran,
    and by the Ray's temp dir, the wave's marker, after)."""
    import hashlib
    import os

    results = tmp_path / "results"
    before = leftovers.snapshot()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # its own Ray, not the session's
    p = subprocess.Popen([sys.executable, "-m", "cluster.cli", "wave", "run", "--tasks", "4", "--concurrency", "2",
                          "--faults", "none", "--seed", "11", "--results", str(results), "--no-progress"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ray_tmp, during = None, {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:
            tl = list(results.glob("w-*/timeline.jsonl"))
            if tl and b'"attempt_start"' in tl[0].read_bytes():
                ray_tmp = f"/tmp/sfray-{hashlib.sha256(tl[0].parent.name.encode()).hexdigest()[:10]}"
                break
            time.sleep(0.1)
        assert ray_tmp, "the wave never started an attempt"
        during = leftovers.private_ray(ray_tmp)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    agents = [c for c in during.values() if c.startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent"))]
    assert len(agents) == 2, f"the wave's Ray agents were not found while it ran: {during}"
    assert p.returncode == 130, (out, err)
    assert not leftovers.wait_clean(before), "something of the interrupted wave is still running"
    assert leftovers.still_running(during) == [], "a process of the wave's own Ray outlived it"
    assert leftovers.private_ray(ray_tmp) == {} and not os.path.exists(ray_tmp)
