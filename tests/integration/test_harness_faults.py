"""The harness survives its own faults: SIGKILL of the fault proxy, the store or the sandbox host actor
mid-wave ends the wave with exit 2 and one line naming the part; no task is graded `fail` for it, and
nothing is left behind. The CLI joins the session's Ray through --address, so the actors it makes (and
the host killed here) are its own, not the session's."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from fleet import cgroups
from tests import leftovers

pytestmark = pytest.mark.integration

CONFIG = """
tasks: 6
concurrency: 3
seed: 21
runner: durable
faults: none
workload: {steps: 12, think_ms: 200}
deadline_s: 120
health: {answer_s: 1.5, actor_timeout_s: 2.5}
"""
# a hung part is called hung after 3 unanswered probes of 1.5 s (services) or 2.5 s (actors) instead of the
# defaults' 3 s and 5 s: the SIGSTOP cases end in about 6 s and 10 s instead of 11 s and 18 s; still many times
# what a live part needs to answer on a loaded host


def _gcs_address() -> str:
    import ray

    return ray.get_runtime_context().gcs_address


def _events(d):
    return [orjson.loads(l) for l in (d / "timeline.jsonl").read_bytes().splitlines() if l.strip()]


def _two_attempts_running(p: subprocess.Popen, results) -> Path:
    """Wait (bounded) until the CLI wave `p` has two attempts running; returns its results dir."""
    deadline = time.monotonic() + 120
    running = 0
    while time.monotonic() < deadline and p.poll() is None and running < 2:
        tl = list(results.glob("w-*/timeline.jsonl"))
        running = tl[0].read_bytes().count(b'"attempt_start"') if tl else 0
        time.sleep(0.1)
    if running < 2:
        out, err = p.communicate(timeout=60) if p.poll() is not None else ("(still running)", "")
        pytest.fail(f"the wave never had two attempts running (exit {p.returncode}); its output: "
                    f"{out[-2000:]} {err[-3000:]}")
    return next(results.glob("w-*"))


def _cont(pid: int) -> None:
    """A process the test stopped goes on (if the wave left it): nothing stays stopped after a test."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def _relay_of(host_pid: int) -> int:
    """The compiled sandbox relay (`sandfleet-relay forward`) a sandbox host started: its child."""
    kids = [pid for pid, ppid in leftovers.forwarder_parents().items() if ppid == host_pid]
    assert kids, f"sandbox host {host_pid} runs no compiled relay"
    return kids[0]


_NO_RELAY = pytest.mark.skipif(__import__("storage.process", fromlist=["x"]).installed_binary("sandfleet-relay")
                               is None, reason="sandfleet-relay is not installed (no cargo at setup)")


@pytest.mark.parametrize("part, sig", [("fault proxy", signal.SIGKILL), ("store", signal.SIGKILL),
                                       ("sandbox host", signal.SIGKILL), ("lease ledger", signal.SIGKILL),
                                       ("sweep actor", signal.SIGKILL),
                                       ("fault proxy", signal.SIGSTOP), ("sandbox host", signal.SIGSTOP),
                                       ("sweep actor", signal.SIGSTOP), ("lease ledger", signal.SIGSTOP),
                                       ("store", signal.SIGSTOP),
                                       pytest.param("sandbox relay", signal.SIGKILL, marks=_NO_RELAY),
                                       pytest.param("sandbox relay", signal.SIGSTOP, marks=_NO_RELAY)])
def test_a_killed_or_hung_part_ends_the_wave_as_a_harness_fault(fleet, tmp_path, part, sig):
    """SIGSTOP: the part is alive but hung (a stopped process still accepts connections; only an answer
    counts), which must be found too, within bounded probes. The sandbox relay (regression, a hostile user's
    find): its death or hang cut the running sandboxes' network and their tasks were graded `fail`."""
    results = tmp_path / "results"
    cfg = tmp_path / "wave.yaml"
    cfg.write_text(CONFIG)
    before, harness_before = leftovers.snapshot(), cgroups.harness_dirs()
    p = subprocess.Popen([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--address", _gcs_address(),
                          "--results", str(results), "--no-progress"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = None
    try:
        d = _two_attempts_running(p, results)
        pids = next(e for e in _events(d) if e["event"] == "parts_ready")["pids"]
        victim = (pids["sandbox hosts"][0] if part == "sandbox host" else
                  _relay_of(pids["sandbox hosts"][0]) if part == "sandbox relay" else pids[part])
        time.sleep(0.5)
        os.kill(victim, sig)
        killed_at = time.monotonic()
        out, err = p.communicate(timeout=120)
        took = time.monotonic() - killed_at
        print(f"{part} {sig.name}: the wave ended {took:.1f} s after the signal")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        if sig == signal.SIGSTOP and victim is not None:
            _cont(victim)  # normally already gone: the wave kills a hung part
    # (bounded by communicate's 120 s: a hung part is found by the wave's bounded probes; no wall-clock assert)
    assert p.returncode == 2, (out, err)
    assert f"harness fault: {part}" in err, err
    events = _events(d)
    fault = next(e for e in events if e["event"] == "harness_fault")
    assert fault["part"].startswith(part)
    grades = [orjson.loads(g.read_bytes()) for g in d.glob("*.grade.json")]
    assert grades, "nothing was graded"
    assert not [g["task_id"] for g in grades if g["verdict"] == "fail"], "a runner was blamed for the harness"
    assert any((g["harness_fault"] or "").startswith(part) for g in grades)
    assert "harness fault" in (d / "SUMMARY.md").read_text()
    # no task started after the fault was seen
    t_fault = fault["t"]
    assert not [e for e in events if e["event"] == "attempt_start" and e["t"] > t_fault + 0.5]
    assert not leftovers.wait_clean(before), "the wave left something behind"
    assert not set(cgroups.harness_dirs()) - set(harness_before), "a harness cgroup was left behind"


def _ray_leftovers(tmpdir: str) -> list[str]:
    """Processes of a wave's private Ray: its temp dir on their command line, or (the retitled agents) open."""
    from fleet.markers import proc_cmdline, of_ray

    return [f"{pid} {proc_cmdline(pid)[:100]}" for pid in os.listdir("/proc")
            if pid.isdigit() and pid != str(os.getpid()) and of_ray(pid, proc_cmdline(pid), tmpdir)]


@pytest.mark.parametrize("part, sig", [("Ray GCS", signal.SIGKILL), ("raylet node-0", signal.SIGKILL),
                                       ("Ray GCS", signal.SIGSTOP), ("raylet node-0", signal.SIGSTOP)])
def test_a_killed_or_stopped_gcs_or_raylet_of_the_waves_own_ray_is_a_harness_fault(tmp_path, part, sig):
    """The wave's own Ray (no --address): SIGKILL of its GCS or its raylet mid-wave is a harness fault named on
    stderr (it was exit 0, `pass`: actors kept answering without the GCS), no task is `fail`, and the Ray
    processes it left (the agents, orphaned) are ended by the wave's own markers. SIGSTOP of either (a hostile
    user's find: the tasks finished, teardown then waited without a bound, and after SIGCONT the wave passed)
    ends the wave within a bound too."""
    results = tmp_path / "results"
    cfg = tmp_path / "wave.yaml"
    cfg.write_text(CONFIG)
    before, harness_before = leftovers.snapshot(), cgroups.harness_dirs()
    p = subprocess.Popen([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--results", str(results),
                          "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tmpdir = None
    victim = None
    try:
        d = _two_attempts_running(p, results)
        ready = next(e for e in _events(d) if e["event"] == "parts_ready")
        ray_pids = ready["pids"]["ray"]
        assert {"Ray GCS", "raylet node-0"} <= set(ray_pids), ray_pids
        tmpdir = f"/tmp/sfray-{hashlib.sha256(d.name.encode()).hexdigest()[:10]}"  # the wave's own Ray (driver.py)
        victim = ray_pids[part]
        os.kill(victim, sig)
        killed_at = time.monotonic()
        out, err = p.communicate(timeout=180)
        took = time.monotonic() - killed_at
        print(f"{part} {sig.name}: the wave ended {took:.1f} s after the signal")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        if sig == signal.SIGSTOP and victim is not None:
            _cont(victim)
    # (bounded by communicate's timeout; the wave's own probes are bounded; no wall-clock assert)
    assert p.returncode == 2, (out, err)
    assert f"harness fault: {part}" in err, err
    fault = next(e for e in _events(d) if e["event"] == "harness_fault")
    assert fault["part"] == part
    grades = [orjson.loads(g.read_bytes()) for g in d.glob("*.grade.json")]
    assert grades and not [g["task_id"] for g in grades if g["verdict"] == "fail"]
    assert any(g["harness_fault"] == part for g in grades)
    if part == "Ray GCS":  # its agents outlive it (for minutes): the wave ended them by its Ray's temp dir
        assert any(e["event"] == "ray_leftovers_ended" for e in _events(d)), "the orphaned agents were not ended"
    deadline = time.monotonic() + 15
    while _ray_leftovers(tmpdir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _ray_leftovers(tmpdir), "the wave's dead Ray left processes"
    assert not leftovers.wait_clean(before), "the wave left something behind"
    assert not set(cgroups.harness_dirs()) - set(harness_before), "a harness cgroup was left behind"


@pytest.mark.parametrize("part", ["sweep actor", "Ray GCS"])
def test_a_part_stopped_as_the_wave_ends_is_found_through_the_teardown(tmp_path, part):
    """Regression (a hostile user's find): the health watch ended with the attempts, so a part stopped as the last
    task ended went unseen, and the teardown waited on it (the sweep actor's last pass: settle + 60 s; Ray's own
    stop without a bound), and after SIGCONT the wave passed. The watch runs until the parts stop: the stopped part
    is found, named and ended, and the wave is exit 2 within a bound, nothing left."""
    results = tmp_path / "results"
    cfg = tmp_path / "wave.yaml"
    cfg.write_text(CONFIG)
    before, harness_before = leftovers.snapshot(), cgroups.harness_dirs()
    p = subprocess.Popen([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--results", str(results),
                          "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = None
    try:
        d = _two_attempts_running(p, results)
        ready = next(e for e in _events(d) if e["event"] == "parts_ready")
        victim = ready["pids"]["ray"][part] if part == "Ray GCS" else ready["pids"][part]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None and \
                (d / "timeline.jsonl").read_bytes().count(b'"task_end"') < 6:
            time.sleep(0.02)
        assert p.poll() is None, "the wave ended before its last task did"
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.monotonic()
        out, err = p.communicate(timeout=120)
        took = time.monotonic() - stopped_at
        print(f"{part} SIGSTOP after the last task: the wave ended {took:.1f} s after the signal")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        if victim is not None:
            _cont(victim)
    assert p.returncode == 2, (out[-2000:], err[-3000:])
    assert f"harness fault: {part}" in err, err
    fault = next(e for e in _events(d) if e["event"] == "harness_fault")
    assert fault["part"] == part and "is stopped" in fault["why"] and "ended by the wave" in fault["why"], fault
    grades = [orjson.loads(g.read_bytes()) for g in d.glob("*.grade.json")]
    assert grades and not [g["task_id"] for g in grades if g["verdict"] == "fail"]
    assert not leftovers.wait_clean(before), "the wave left something behind"
    assert not set(cgroups.harness_dirs()) - set(harness_before), "a harness cgroup was left behind"
