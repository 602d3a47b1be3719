"""A fleet on three isolated nodes, with a leak and decoys planted on a sandbox node: what the sweep actor does.

Run by `test_isolated_nodes.py` as a process of its own (`python -m tests.integration.isolated_sweep_probe`): the
head's network namespace is the whole process's, as it is a wave driver's. Prints one JSON line of what it saw.

On node-1 it plants, from a Ray task pinned there (so every pid is that node's): a sandbox cgroup of the watched
wave with no lease whose process daemonized a child (the leak), a sandbox of the wave under a live lease, a process
with another wave's marker and an unmarked one (the decoys). The sweep actor must find the leak by node-1's own
scan, reap it there, and touch nothing else. Then node-2's host is killed: its scan does not answer, and the report
of a wave watched then must name it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson

W = "w-20261203T000000-s7-150d"
W2 = "w-20261203T000000-s8-150d"
W3 = "w-20261203T000000-s9-150d"
DAEMONIZING = "read -r go; (setsid sleep 300 &); exec sleep 300"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def plant(wave: str, other: str) -> dict:
    """On this node: the leak (daemonizing), the leased sandbox, the decoys. Returns their pids (this node's)."""
    from fleet import cgroups

    def marked(w: str, sid: str, cmd: str) -> subprocess.Popen:
        cg = cgroups.SandboxCgroup(w, sid)
        cg.create(64 * 1024 * 1024, 64)
        p = subprocess.Popen(["sh", "-c", cmd], stdin=subprocess.PIPE, start_new_session=True,
                             env={"PATH": "/usr/bin:/bin", "SANDFLEET_SANDBOX": f"{w}/{sid}"})
        for f in cg.procs_files():
            Path(f).write_text(str(p.pid))
        p.stdin.write(b"go\n")
        p.stdin.close()
        return p

    leak = marked(wave, "t900-a1", DAEMONIZING)
    live = marked(wave, "t901-a1", "read -r go; exec sleep 300")
    other_wave = subprocess.Popen(["sleep", "300"], start_new_session=True,
                                  env={"PATH": "/usr/bin:/bin", "SANDFLEET_SANDBOX": f"{other}/t900-a1"})
    plain = subprocess.Popen(["sleep", "300"], start_new_session=True, env={"PATH": "/usr/bin:/bin"})
    deadline = time.monotonic() + 10
    child: list[int] = []
    while time.monotonic() < deadline:  # the daemonized child carries the marker too
        # the subshell that forks it is in the cgroup for a moment (on a loaded machine, long enough to be seen):
        # the leak's child is the `sleep` that stays, once it is the only other pid there
        child = [int(p) for p in cgroups.SandboxCgroup(wave, "t900-a1").pids() if int(p) != leak.pid]
        if len(child) == 1 and _comm(child[0]) == "sleep":
            break
        time.sleep(0.05)
    return {"leak": [leak.pid] + child, "live": live.pid, "decoys": [other_wave.pid, plain.pid],
            "pidns": os.stat("/proc/self/ns/pid").st_ino}


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def clean(waves: list[str], pids: list[int]) -> None:
    import signal

    from fleet import cgroups

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for w in waves:
        for _, sid in cgroups.list_sandboxes(w):
            cg = cgroups.SandboxCgroup(w, sid)
            cg.kill_all()
            cg.remove()
        for d in cgroups.wave_dirs(w):
            try:
                d.rmdir()
            except OSError:
                pass


def main() -> int:
    from cluster import isolated

    isolated.check_available(3)
    isolated.enter_once()
    from cluster.raycluster import FleetSession

    fleet = FleetSession("local", nodes=3, isolation="namespaces", ray_tmpdir=f"/tmp/sfray-probe{os.getpid()}")
    out: dict = {}
    try:
        fleet.start()  # (it sets what Ray reads at import: Ray is imported after it)
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        on1 = NodeAffinitySchedulingStrategy(fleet.node_placement["node-1"], soft=False)

        def there(fn, *args):
            return ray.get(ray.remote(num_cpus=0)(fn).options(scheduling_strategy=on1).remote(*args), timeout=60)

        planted = there(plant, W, W2)
        out["planted"] = planted
        out["head_pidns"] = os.stat("/proc/self/ns/pid").st_ino
        lease = ray.get(fleet.ledger.acquire.remote(f"{W}/t901", "node-1", "t901-a1", 300.0), timeout=30)
        assert lease is not None
        ray.get(fleet.sweeper.watch.remote(W, 2.0), timeout=30)
        out["first"] = ray.get(fleet.sweeper.scan.remote(W, False), timeout=60)
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and there(alive, planted["leak"]):
            time.sleep(0.3)
        out["leak_alive_after"] = there(alive, planted["leak"])
        out["kept_alive"] = there(alive, [planted["live"]] + planted["decoys"])
        out["report"] = ray.get(fleet.sweeper.final.remote(W), timeout=90)
        # node-2's host goes: its scan cannot answer, and the sweep must say so rather than see nothing there
        ray.kill(fleet.hosts[fleet.node_ids.index("node-2")])
        ray.get(fleet.sweeper.watch.remote(W3, 2.0), timeout=30)
        out["unanswered_report"] = ray.get(fleet.sweeper.final.remote(W3), timeout=90)
        there(clean, [W, W2], [planted["live"]] + planted["decoys"])
        ray.get(fleet.ledger.release.remote(f"{W}/t901", lease.fence, None, "probe over"), timeout=30)
    finally:
        fleet.stop()
    sys.stdout.write(orjson.dumps(out, default=str).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
