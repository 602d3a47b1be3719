"""The sweep reaps sandboxes that carry a wave's marker but hold no active lease."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
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


def test_sweep_cluster_runs_on_every_node_through_ray_and_reaps_there(fleet, tmp_path):
    """`sandfleet sweep --cluster HOST:PORT`: a task on every alive node of that Ray (here the session's, one
    node) runs the sweep there; a dead wave's sandbox is reaped by it and the output names the node."""
    wave = "w-20261203T000000-s5-c1a5"
    pid = _leak(tmp_path, wave, "t000-a1")
    try:
        _sweep_cluster(wave, pid)
    finally:
        ray.get(fleet.hosts[0].sweep.remote(wave, []))


def _sweep_cluster(wave: str, pid: int) -> None:
    import os

    gcs = ray.get_runtime_context().gcs_address
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    dry = subprocess.run([sys.executable, "-m", "cluster.cli", "sweep", "--cluster", gcs, "--wave", wave, "--dry-run"],
                         env=env, capture_output=True, text=True, timeout=180)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert f"would remove: {wave}: " in dry.stdout and "1 sandbox cgroup(s)" in dry.stdout, dry.stdout
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "sweep", "--cluster", gcs, "--wave", wave],
                       env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    node = ray.nodes()[0]["NodeManagerAddress"]
    assert f"node {node} (" in r.stdout and f"reaped sandbox {wave}/t000-a1" in r.stdout, r.stdout
    from fleet.markers import markers

    assert _dead(pid) and cgroups.list_sandboxes(wave) == []
    assert not markers()[0].get(wave, {}).get("processes"), markers()[0].get(wave)
    bad = subprocess.run([sys.executable, "-m", "cluster.cli", "sweep", "--cluster", "nohost"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 254 and "--cluster: value 'nohost'" in bad.stderr, bad.stderr


def test_sweep_removes_an_empty_cgroup_a_dead_isolated_node_left_and_not_a_busy_one():
    import os
    import signal

    from cluster import isolated, sweep

    base = cgroups.procs_base()
    empty, busy = base / f"{isolated.NODE_MARK}.sfray-t{os.getpid()}.node-8", \
        base / f"{isolated.NODE_MARK}.sfray-t{os.getpid()}.node-9"
    p = None
    try:
        for d in (empty, busy):
            (d / "sub").mkdir(parents=True)
        p = subprocess.Popen(["sleep", "300"])
        (busy / "sub" / "cgroup.procs").write_text(str(p.pid))
        tmp = Path(f"/tmp/sfray-t{os.getpid()}")

        def mine(tags=frozenset()):  # (only this test's dirs: not another run's leftovers)
            return [d for d in sweep.dead_node_cgroups(tags) if tmp.name in d]

        tmp.mkdir()  # its wave's Ray is there: both too young, a node being made
        try:
            assert mine() == []
            assert mine({tmp.name}) == [str(empty)]  # that wave is dead: at once
        finally:
            tmp.rmdir()
        assert mine() == [str(empty)]  # no Ray of its wave left: not a node being made
        old = time.time() - 60
        for d in (empty, busy):
            os.utime(d, (old, old))
        assert mine() == [str(empty)]
        done = sweep.remove({"waves": {}, "harness_cgroups": [], "node_cgroups": [str(empty)]})
        assert not empty.exists() and busy.is_dir() and any("isolated node" in x for x in done), done
    finally:
        if p is not None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(5)
        for d in (empty, busy):
            for sub in (d / "sub", d):
                deadline = time.monotonic() + 5
                while sub.is_dir() and time.monotonic() < deadline:
                    try:
                        sub.rmdir()
                    except OSError:
                        time.sleep(0.05)


def test_sweep_ends_the_orphaned_agents_of_a_dead_private_ray_and_leaves_a_live_one():
    """A private Ray (`/tmp/sfray-*`) whose GCS and raylets are gone, with agents living on (retitled
    `ray::DashboardAgent`, holding its log open: what a killed driver or GCS leaves for minutes), is listed and
    ended, its temp dir removed; one whose GCS still runs is left alone. Real processes, started here."""
    import os
    import signal

    from cluster import sweep

    dead, live = Path(f"/tmp/sfray-d{os.getpid()}"), Path(f"/tmp/sfray-l{os.getpid()}")
    procs = []
    try:
        for d in (dead, live):
            (d / "logs").mkdir(parents=True)
            (d / "logs" / "dashboard_agent.out").write_text("")
        for d, title in ((dead, "ray::DashboardAgent"), (dead, "ray::RuntimeEnvAgent"), (live, "ray::DashboardAgent"),
                         (live, f"{live}/gcs_server")):
            procs.append(subprocess.Popen(["bash", "-c", f'exec -a "{title}" sleep 300 3<"{d}/logs/dashboard_agent.out"']))
        deadline = time.monotonic() + 10
        titles = [f"/proc/{p.pid}/cmdline" for p in procs]
        while time.monotonic() < deadline:  # until every title is in place (each exec done)
            if all(Path(t).read_bytes().startswith(b"ray::") or Path(t).read_bytes().startswith(str(live).encode())
                   for t in titles):
                break
            time.sleep(0.05)
        found = sweep.dead_private_rays()
        assert sorted(p["pid"] for p in found[str(dead)]) == sorted(p.pid for p in procs[:2]), found
        assert str(live) not in found, found
        lines = sweep.summary({"waves": {}, "harness_cgroups": [], "dead_rays": {str(dead): found[str(dead)]}})
        assert any("a dead private Ray" in x and "2 orphaned" in x for x in lines), lines
        done = sweep.remove({"waves": {}, "harness_cgroups": [], "dead_rays": {str(dead): found[str(dead)]}})
        assert any("temp dir" in x for x in done), done
        for p in procs[:2]:
            assert p.wait(10) == -signal.SIGKILL
        assert not dead.exists() and live.is_dir()
        assert all(p.poll() is None for p in procs[2:])
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
        for d in (dead, live):
            import shutil

            shutil.rmtree(d, ignore_errors=True)


def _dead_resumable_wave(age_s: float = 0.0) -> Path:
    """A dead wave's private dir as a killed driver leaves it: its store data and ledger, keys, a driver record
    whose process is gone."""
    import secrets

    w = f"w-20261206T000000-s42-{secrets.token_hex(2)}"
    p = Path(f"/tmp/sandfleet-{w}")
    (p / "store" / "data").mkdir(parents=True)
    (p / "store" / "weed.log").write_text("weed\n")
    (p / "ledger.db").write_bytes(b"SQLite format 3\0")
    (p / "creds").mkdir()
    (p / "driver.json").write_text('{"pid": 999999999, "start": "0"}')
    for f in (p / "store", p / "store" / "weed.log", p / "ledger.db"):
        t = time.time() - age_s
        os.utime(f, (t, t))
    return p


def _sweep(*args):
    return subprocess.run([sys.executable, "-m", "cluster.cli", "sweep", *args], capture_output=True, text=True,
                          timeout=120)


def test_sweep_keeps_a_resumable_dead_waves_store_unless_asked_or_past_the_bound():
    """Issue 42: `sandfleet sweep` deleted a dead wave's resumable store without asking, and `wave resume` then
    failed with "store data gone". Listed as resumable, its store and ledger kept; removed with
    --include-resumable, or once the wave has been dead longer than the README's bound (7 days)."""
    from cluster import sweep

    kept, asked, old = _dead_resumable_wave(), _dead_resumable_wave(), _dead_resumable_wave(8 * 86400)
    try:
        w = kept.name[len("sandfleet-"):]
        dry = _sweep("--wave", w, "--dry-run")
        assert dry.returncode == 0 and f"{w}: " in dry.stdout and "resumable by `sandfleet wave resume`" in dry.stdout
        assert "kept; --include-resumable removes them" in dry.stdout, dry.stdout
        r = _sweep("--wave", w)
        assert r.returncode == 0 and f"kept the store data and ledger of resumable wave {w}" in r.stdout, r.stdout
        assert (kept / "store" / "data").is_dir() and (kept / "ledger.db").is_file() and not (kept / "creds").exists()
        again = _sweep("--wave", w)  # still listed as resumable, still kept
        assert "resumable" in again.stdout and (kept / "store").is_dir(), again.stdout

        w = asked.name[len("sandfleet-"):]
        r = _sweep("--wave", w, "--include-resumable")
        assert r.returncode == 0 and "removed, as --include-resumable asks" in r.stdout, r.stdout
        assert not asked.exists()

        w = old.name[len("sandfleet-"):]
        assert sweep.RESUMABLE_KEEP_S == 7 * 86400
        r = _sweep("--wave", w)
        assert r.returncode == 0 and "past the 7-day bound, so removed" in r.stdout, r.stdout
        assert not old.exists()
    finally:
        for p in (kept, asked, old):
            shutil.rmtree(p, ignore_errors=True)
