"""A lent fleet (a test session's, a campaign's, a league's) whose owner died leaves its store process in its state
dir: `sandfleet sweep` ends that process and removes the dir; a live owner's fleet and a stranger are left alone."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson

from cluster import results, sweep
from fleet.markers import proc_start_time

HOLD = "import time; print('ready', flush=True); time.sleep(120)"


def _proc(*args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, *args], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_a_dead_owners_fleet_is_swept_and_a_live_one_is_not():
    dead_dir = Path(f"/tmp/sandfleet-fleet-unit{os.getpid()}d")
    live_dir = Path(f"/tmp/sandfleet-fleet-unit{os.getpid()}l")
    ray_tmp = Path(f"/tmp/sfray-unit{os.getpid()}f")
    owner = subprocess.Popen(["true"])
    owner.wait()
    procs = []
    try:
        for d, rec in ((dead_dir, {"pid": owner.pid, "start": "gone"}),
                       (live_dir, {"pid": os.getpid(), "start": proc_start_time(os.getpid())})):
            d.mkdir()
            (d / results.DRIVER_RECORD).write_bytes(orjson.dumps(rec))
        ray_tmp.mkdir()
        (dead_dir / results.RAY_RECORD).write_bytes(orjson.dumps({"tmpdir": str(ray_tmp)}))
        store = _proc(f"-dir={dead_dir}/store-x/data")  # like weed's command line
        raylet = _proc(f"--temp-dir={ray_tmp}/session_x")  # like a raylet's
        live_store = _proc(f"-dir={live_dir}/store-y/data")
        stranger = _proc(f"-dir={dead_dir}-other/data")  # a name that only starts like the dir
        procs = [store, raylet, live_store, stranger]
        found = sweep.find()
        mine = found["fleets"].get(str(dead_dir), {})
        assert sorted(p["pid"] for p in mine["processes"]) == sorted([store.pid, raylet.pid]), found["fleets"]
        assert mine["ray_tmpdir"] == str(ray_tmp) and str(live_dir) not in found["fleets"]
        assert any(str(dead_dir) in line and str(ray_tmp) in line for line in sweep.summary(found))
        done = sweep.remove({"waves": {}, "harness_cgroups": [], "fleets": {str(dead_dir): mine}})
        assert store.wait(10) == -9 and raylet.wait(10) == -9 and not dead_dir.exists() and not ray_tmp.exists(), done
        assert live_store.poll() is None and stranger.poll() is None and live_dir.is_dir()
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        for d in (dead_dir, live_dir, ray_tmp):
            shutil.rmtree(d, ignore_errors=True)
