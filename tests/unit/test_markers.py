"""The sweeps find a dead wave's Ray agents: they retitle themselves (`ray::DashboardAgent`), so only the files they
hold open under the wave's Ray temp dir name them (they outlived a killed driver for minutes, unseen)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson

from fleet.markers import RAY_RECORD, markers

HOLD = "import os, time; f = open(os.environ['HOLD'], 'a'); print('ready', flush=True); time.sleep(120)"


def _agent(title: str, path: str) -> subprocess.Popen:
    # the path reaches it by the environment: like a retitled agent, its command line does not name the dir
    p = subprocess.Popen([title, "-c", HOLD], executable=sys.executable, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, HOLD=path))
    assert p.stdout.readline().strip() == "ready"
    return p


def test_a_retitled_ray_agent_holding_the_waves_ray_dir_is_listed_and_a_stranger_is_not():
    wave = f"w-20261202T000000-s{os.getpid()}-abcd"
    private = Path(f"/tmp/sandfleet-{wave}")
    tmp = Path(f"/tmp/sfray-unit{os.getpid()}")
    procs = []
    try:
        private.mkdir()
        (tmp / "session_x" / "logs").mkdir(parents=True)
        (private / RAY_RECORD).write_bytes(orjson.dumps({"tmpdir": str(tmp)}))
        procs.append(_agent("ray::DashboardAgent", str(tmp / "session_x" / "logs" / "dashboard_agent.log")))
        elsewhere = Path(f"/tmp/sfray-other{os.getpid()}.log")
        procs.append(_agent("ray::RuntimeEnvAgent", str(elsewhere)))
        waves, _ = markers()
        listed = {p["pid"] for p in waves.get(wave, {}).get("processes", [])}
        assert procs[0].pid in listed, waves.get(wave)
        assert procs[1].pid not in listed
        assert waves[wave]["ray_tmpdir"] == str(tmp)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
        Path(f"/tmp/sfray-other{os.getpid()}.log").unlink(missing_ok=True)
    deadline = time.monotonic() + 5
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
