"""The sweep reaps sandboxes that carry a wave's marker but hold no active lease."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import ray

from fleet import cgroups

pytestmark = pytest.mark.integration


LEAKER = """
import asyncio, os, sys
from fleet.sandbox import ProcessBackend, SandboxSpec
spec = SandboxSpec(wave_id=sys.argv[1], sandbox_id=sys.argv[2], task_id="t-leak", attempt=1,
                   argv=["/bin/sh", "-c", "sleep 300"], env={}, state_dir=sys.argv[3])
os.makedirs(spec.state_dir)
print(asyncio.run(ProcessBackend().start(spec)).pid)
"""


def _leak(tmp_path, wave_id: str, sandbox_id: str) -> int:
    """A sandbox whose owner died right after starting it (as when a host actor crashes):
    the host never knew about it and it is an orphan of init."""
    out = subprocess.run([sys.executable, "-c", LEAKER, wave_id, sandbox_id, str(tmp_path / sandbox_id)],
                         capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout.strip())


def _dead(pid: int, timeout_s: float = 5.0) -> bool:
    """Gone, or a zombie waiting for init to reap it (it runs nothing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_sweep_reaps_a_sandbox_without_lease(fleet, tmp_path):
    wave = "w-test-leak"
    pid = _leak(tmp_path, wave, "leaked-1")
    assert (wave, "leaked-1") in cgroups.list_sandboxes(wave)
    report = ray.get(fleet.hosts[0].sweep.remote(wave, []))
    assert [r["sandbox_id"] for r in report["reaped"]] == ["leaked-1"]
    assert report["reaped"][0]["emptied"] and report["reaped"][0]["removed"]
    assert cgroups.list_sandboxes(wave) == []
    assert _dead(pid)


def test_sweep_never_reaps_a_leased_sandbox(fleet, tmp_path):
    wave = "w-test-live"
    _leak(tmp_path, wave, "live-1")
    try:
        lease = ray.get(fleet.ledger.acquire.remote(f"{wave}/t0", "node-0", "live-1", 30.0))
        live = [l["sandbox_id"] for l in ray.get(fleet.ledger.active.remote())
                if l["task_id"].startswith(wave + "/")]
        report = ray.get(fleet.hosts[0].sweep.remote(wave, live))
        assert report["reaped"] == [] and report["live"] == ["live-1"]
        assert (wave, "live-1") in cgroups.list_sandboxes(wave)
        ray.get(fleet.ledger.release.remote(f"{wave}/t0", lease.fence))
    finally:
        report = ray.get(fleet.hosts[0].sweep.remote(wave, []))
    assert [r["sandbox_id"] for r in report["reaped"]] == ["live-1"]
    assert cgroups.list_sandboxes(wave) == []
