"""The sweep actor on the real fleet: planted leaks (a sandbox cgroup whose process daemonized a child, a
marked process that escaped its cgroup, a sandbox whose lease expired under it) are reaped after the settle
window; a sandbox under a live lease, unmarked processes, a process with a malformed marker, another wave's
sandbox and a cgroup outside the project's tree are left alone; a lease with no sandbox is reported dangling."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
W = "w-20261201T000000-s1-5eef"  # this test's own wave ids (the marker pattern of real waves)
W2 = "w-20261201T000000-s2-5eef"
GATED = "read -r go; (setsid sleep 300 &); exec sleep 300"  # a sandbox process that daemonizes a child


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _marked(wave: str) -> list[int]:
    from cluster import sweep

    return [p["pid"] for p in sweep.markers()[0].get(wave, {}).get("processes", [])]


def test_sweep_actor_reaps_leaks_and_leaves_live_leases_and_decoys(fleet):
    import ray

    from fleet import cgroups

    ledger, sweeper = fleet.ledger, fleet.sweeper
    spawned: list[subprocess.Popen] = []
    made: list[cgroups.SandboxCgroup] = []
    decoy_cg = cgroups.procs_base() / f"sfdecoy-{os.getpid()}"

    def sandbox(wave: str, sid: str, daemon: bool = True) -> subprocess.Popen:
        cg = cgroups.SandboxCgroup(wave, sid)
        cg.create(64 * 1024 * 1024, 64)
        made.append(cg)
        p = subprocess.Popen(["sh", "-c", GATED if daemon else "read -r go; exec sleep 300"], stdin=subprocess.PIPE,
                             env={"PATH": "/usr/bin:/bin", "SANDFLEET_SANDBOX": f"{wave}/{sid}"})
        for f in cg.procs_files():
            Path(f).write_text(str(p.pid))
        p.stdin.write(b"go\n")
        p.stdin.close()
        spawned.append(p)
        return p

    def process(env: dict, cmd: str = "exec sleep 300") -> subprocess.Popen:
        p = subprocess.Popen(["sh", "-c", cmd], env={"PATH": "/usr/bin:/bin", **env}, start_new_session=True)
        spawned.append(p)
        return p

    import docker

    from fleet.dockerimage import ensure_base_image

    dk = docker.from_env()
    image = ensure_base_image(dk)
    containers = []

    def container(labels: dict, env: dict) -> object:
        c = dk.containers.create(image, command=["/bin/sh", "-c", "exec sleep 300"], network_mode="none",
                                 labels=labels, environment=env, user="65534:65534", read_only=True)
        containers.append(c)
        c.start()
        return c

    try:
        leaked_ct = container({"sandfleet.wave": W, "sandfleet.sandbox": "t905-a1"},
                              {"SANDFLEET_SANDBOX": f"{W}/t905-a1"})
        decoy_ct = container({"sandfleet.decoy": "1"}, {})  # no wave label: never touched
        leak = sandbox(W, "t900-a1")  # no lease at all; its child daemonizes (setsid, reparented)
        escaped = process({"SANDFLEET_SANDBOX": f"{W}/t901-a1"}, "(setsid sleep 300 &); exec sleep 300")
        live = sandbox(W, "t902-a1", daemon=False)
        assert ray.get(ledger.acquire.remote(f"{W}/t902", "node-0", "t902-a1", 120.0))
        assert ray.get(ledger.acquire.remote(f"{W}/t903", "node-0", "t903-a1", 120.0))  # no sandbox: dangling
        expired = sandbox(W, "t904-a1", daemon=False)
        # runs out under it: after the first scan (4 s leaves a loaded host time to set the rest up first)
        assert ray.get(ledger.acquire.remote(f"{W}/t904", "node-0", "t904-a1", 4.0))
        other_wave = sandbox(W2, "t900-a1", daemon=False)  # same marker scheme, a wave not watched
        plain = process({})
        malformed = process({"SANDFLEET_SANDBOX": "not-a-wave/t900-a1"})
        decoy_cg.mkdir()
        in_decoy = process({})
        (decoy_cg / "cgroup.procs").write_text(str(in_decoy.pid))
        deadline = time.monotonic() + 10
        while True:  # the two daemonized sleeps
            leak_child = [p for p in _marked(W) if p not in (leak.pid, escaped.pid, live.pid, expired.pid)]
            if len(leak_child) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(leak_child) >= 2, leak_child

        ray.get(sweeper.watch.remote(W, 2.0))
        first = ray.get(sweeper.scan.remote(W, False))  # a pass that only looks
        assert {x["sandbox_id"] for x in first["leaked"]} == {"t900-a1", "t901-a1", "t905-a1"}
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and any(_alive(p) for p in [leak.pid, escaped.pid, expired.pid] + leak_child):
            time.sleep(0.2)
        report = ray.get(sweeper.final.remote(W), timeout=60)

        # the leaks are gone, daemonized children and the escaped process too
        for p in [leak.pid, escaped.pid, expired.pid] + leak_child:
            assert not _alive(p), (p, report)
        assert not cgroups.SandboxCgroup(W, "t900-a1").exists() and not cgroups.SandboxCgroup(W, "t904-a1").exists()
        # nothing else was touched
        for p in (live, other_wave, plain, malformed, in_decoy):
            assert _alive(p.pid), (p.args, report)
        assert cgroups.SandboxCgroup(W, "t902-a1").exists() and decoy_cg.is_dir()
        leaked = {x["sandbox_id"] for x in report["leaked"]}
        assert leaked == {"t900-a1", "t901-a1", "t904-a1", "t905-a1"}, report["leaked"]
        gone = [c for c in dk.containers.list(all=True) if c.id in (leaked_ct.id, decoy_ct.id)]
        assert [c.id for c in gone] == [decoy_ct.id] and gone[0].status == "running"
        assert {x["sandbox_id"] for x in report["reaped"]} == leaked
        assert [x["sandbox_id"] for x in report["expired_but_running"]] == ["t904-a1"]
        assert [x["sandbox_id"] for x in report["dangling_leases"]] == ["t903-a1"]
        assert not report["left_at_end"] and not report["errors"], report
        for x in report["reaped"]:  # a leak is reaped only after being one for the settle window (2 s here)
            assert x["leaked_for_s"] >= 2.0, x
    finally:
        for c in containers:
            try:
                c.remove(force=True)
            except docker.errors.NotFound:
                pass
        for p in spawned:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            p.wait(5)
        for wave in (W, W2):
            for pid in _marked(wave):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for cg in made:
            cg.kill_all()
            cg.remove()
        for wave in (W, W2):
            for d in cgroups.wave_dirs(wave):
                try:
                    d.rmdir()
                except OSError:
                    pass
        if decoy_cg.is_dir():
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    decoy_cg.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
        for t in ("t902", "t903", "t904"):
            for lease in ray.get(ledger.active.remote()):
                if lease["task_id"] == f"{W}/{t}":
                    ray.get(ledger.release.remote(lease["task_id"], lease["fence"], None, "test over"))
