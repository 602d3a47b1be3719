"""What a test run may leave behind, found by the project's own markers only."""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from fleet.markers import proc_cmdline, proc_environ
from fleet import cgroups


def marked_processes() -> list[str]:
    """Processes that carry a sandfleet marker: sandboxes, the embedded store, the proxy, a lazy file system's
    (`fleet.lazyfs`: its mounts' source `sandfleet-lazyfs.*` is caught by `sandfleet_mounts`)."""
    out = []
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        cmd = proc_cmdline(pid)
        if not cmd:
            continue
        if (b"SANDFLEET_SANDBOX=" in proc_environ(pid) or "/tmp/sandfleet-" in cmd or "storage.proxy" in cmd
                or "sandfleet-launch" in cmd or "sandfleet-init" in cmd or "sandfleet-lazyfs" in cmd):
            out.append(f"{pid} {cmd[:160]}")
    return out


def forwarder_parents() -> dict[int, int]:
    """pid -> parent pid of every `sandfleet-relay forward` (a sandbox host's relay, fleet/netns.py)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or "sandfleet-relay forward" not in proc_cmdline(pid):
            continue
        try:
            out[int(pid)] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def forwarders() -> list[str]:
    """`sandfleet-relay forward` processes not started by this process: each ends when its host process does."""
    me = os.getpid()
    return [f"{pid} {proc_cmdline(str(pid))[:160]}" for pid, ppid in forwarder_parents().items() if ppid != me]


def ray_processes(tmpdir: str) -> list[str]:
    return [f"{pid} {proc_cmdline(pid)[:160]}" for pid in os.listdir("/proc")
            if pid.isdigit() and tmpdir in proc_cmdline(pid)]


def sandbox_cgroups() -> list[str]:
    found = []
    for own in cgroups.own_dirs().values():
        base = own / cgroups.MARK
        if base.exists():
            found += [str(p) for p in base.rglob("*") if p.is_dir()] or [str(base)]
    return found


def sandfleet_mounts() -> list[str]:
    return [l for l in Path("/proc/self/mountinfo").read_text().splitlines() if "sandfleet" in l]


def listening_ports() -> set[int]:
    out = subprocess.run(["ss", "-Htln"], capture_output=True, text=True).stdout
    ports = set()
    for line in out.splitlines():
        m = re.search(r":(\d+)\s", line.split(None, 4)[3] + " ")
        if m:
            ports.add(int(m.group(1)))
    return ports


def containers() -> list[str]:
    """Docker containers carrying a wave's label (the docker backend's marker)."""
    from fleet.dockerapi import list_containers

    return sorted(f"{c['name']} ({c['id'][:12]})" for c in list_containers() or [])


def snapshot() -> dict:
    return {"processes": marked_processes(), "cgroups": sandbox_cgroups(), "mounts": sandfleet_mounts(),
            "private_dirs": sorted(str(p) for p in Path("/tmp").glob("sandfleet-w-*")), "containers": containers()}


def wait_clean(baseline: dict | None = None, timeout_s: float = 15.0) -> dict:
    """Poll (bounded) until nothing beyond `baseline` is left; returns what is left."""
    baseline = baseline or {k: [] for k in ("processes", "cgroups", "mounts", "private_dirs", "containers")}
    deadline = time.monotonic() + timeout_s
    while True:
        now = snapshot()
        left = {k: [x for x in v if x not in baseline.get(k, [])] for k, v in now.items()}
        if not any(left.values()) or time.monotonic() > deadline:
            return {k: v for k, v in left.items() if v}
        time.sleep(0.2)


def private_ray(tmpdir: str) -> dict[int, str]:
    """pid -> command line of every process of the private Ray whose temp dir is `tmpdir`: its marker (the dir on
    the command line, or a retitled `ray::` process holding a file under it) and every descendant of those (the
    raylet's `ray::DashboardAgent` and `ray::RuntimeEnvAgent`, its workers)."""
    from fleet.markers import ray_processes

    found = {p["pid"]: p["cmd"] for p in ray_processes(tmpdir)}
    todo = list(found)
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                kids = [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
            except (OSError, ValueError):
                continue
            for kid in kids:
                if kid not in found:
                    found[kid] = proc_cmdline(str(kid))[:160]
                    todo.append(kid)
    return found


def still_running(procs: dict[int, str]) -> list[str]:
    """Those of `procs` (pid -> command line) that are still the same process."""
    return [f"{pid} {cmd}" for pid, cmd in procs.items() if cmd and proc_cmdline(str(pid))[:160] == cmd]
