"""The project's markers, and the finder that lists everything on this machine carrying one.

Every process, cgroup, mount, container and private dir a wave makes carries its wave id: a sandbox's processes
the environment marker `SANDFLEET_SANDBOX=<wave>/<sandbox>`, the store's and proxy's command lines the wave id,
sandbox cgroups `<own>/sandfleet/<wave>/<sandbox>`, workspace mounts the source `sandfleet-ws.<wave>.<sandbox>`,
docker sandboxes the label `sandfleet.wave`, and the wave's private dir `/tmp/sandfleet-<wave>/` (its driver's
record, its private Ray's temp dir). `sandfleet sweep` (cluster/sweep.py) and the sweep actor (fleet/sweeper.py)
both find through `markers()`. Nothing here changes anything but `kill_listed`, which ends the processes a caller
listed (the sweep's, and a Ray session's own at its stop).
"""
from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import orjson

from fleet import cgroups
from fleet.dockerapi import LISTING_ERROR, list_containers

PRIVATE_GLOB = "sandfleet-w-*"
WAVE_RE = re.compile(r"w-\d{8}T\d{6}-s\d+-[0-9a-f]{4}")
# the wave's private dir: who drives it, and its private Ray's temp dir (cluster/results.py re-exports these)
DRIVER_RECORD = "driver.json"
RAY_RECORD = "ray.json"
# an attempt's key, in the dir its sandbox sees read-only (the driver's private dir, or its host's on a remote node)
ATTEMPT_CREDENTIALS = "credentials.json"


def proc_start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/<pid>/stat), or None when it is gone or a zombie (dead, not yet
    reaped by its parent): a pid with another start time is another process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if len(fields) < 20 or fields[0] in ("Z", "X") else fields[19]


def proc_cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _holds(pid: str, tmp: str) -> bool:
    """Does the process hold a file open under `tmp`? Ray's agents retitle themselves (`ray::DashboardAgent`), so
    their command lines no longer name the temp dir; their open log files there do (a dead Ray's agents live on
    for minutes with ppid 1)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(tmp + "/"):
                return True
        except OSError:
            continue
    return False


def of_ray(pid: str, cmd: str, tmp: str) -> bool:
    """Is the process one of the private Ray whose temp dir is `tmp`: its command line names the dir, or (an agent
    that retitled itself) it holds a file open under it."""
    return tmp + "/" in cmd or cmd.rstrip().endswith(tmp) or (cmd.startswith("ray::") and _holds(pid, tmp))


def proc_environ(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def processes():
    """(pid, command line) of every process on the machine but this one (those that have a command line)."""
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if pid.isdigit() and pid != me:
            cmd = proc_cmdline(pid)
            if cmd:
                yield pid, cmd


def ray_processes(tmp: str) -> list[dict]:
    """The processes of the private Ray whose temp dir is `tmp` (its marker): the dir on their command line, or held
    open by the agents that retitle themselves; as `kill_listed` takes them."""
    return [{"pid": int(pid), "cmd": cmd[:160]} for pid, cmd in processes() if of_ray(pid, cmd, tmp)]


def kill_listed(procs: list[dict]) -> list[str]:
    """SIGKILL each listed process that is still the same one (its command line unchanged)."""
    done = []
    for p in procs:
        if proc_cmdline(str(p["pid"]))[:160] == p["cmd"]:
            try:
                os.kill(p["pid"], signal.SIGKILL)
                done.append(f"killed {p['pid']} ({p['cmd'][:60]})")
            except ProcessLookupError:
                pass
    return done


SANDBOX_MARK = re.compile(rb"(?:^|\0)SANDFLEET_SANDBOX=(" + WAVE_RE.pattern.encode()
                          + rb")/([A-Za-z0-9._-]{1,100})(?:\0|$)")


def markers(errors: list | None = None, engine_lost: str | None = None) -> tuple[dict, dict]:
    """Everything on this machine that carries a wave's marker, live waves too, grouped by wave: processes
    (a sandbox's environment marker `SANDFLEET_SANDBOX=<wave>/<sandbox>` names its sandbox; store and proxy
    command lines; the wave's private Ray by its temp dir), sandbox cgroups, workspace mounts, private dirs.
    Used by `sandfleet sweep` (dead waves) and the sweep actor (reconciled with the ledger). Changes nothing.
    `engine_lost`: the docker engine is known not to answer, so containers are not listed (a listing would only
    wait out its timeout); `errors` says so, as for a listing that failed."""
    waves: dict[str, dict] = {}

    def entry(w: str) -> dict:
        return waves.setdefault(w, {"processes": [], "cgroups": [], "mounts": [], "containers": [],
                                    "private_dir": None})

    private = {p.name[len("sandfleet-"):]: p for p in Path("/tmp").glob(PRIVATE_GLOB) if p.is_dir()}
    ray_tmp = {}  # a wave's private Ray: its temp dir, recorded in the wave's private dir
    for w, p in private.items():
        entry(w)["private_dir"] = str(p)
        try:
            ray_tmp[w] = orjson.loads((p / RAY_RECORD).read_bytes())["tmpdir"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        cmd = proc_cmdline(pid)
        env = proc_environ(pid)
        m = SANDBOX_MARK.search(env)
        if m:
            entry(m.group(1).decode())["processes"].append({"pid": int(pid), "cmd": cmd[:160],
                                                            "sandbox": m.group(2).decode()})
            continue
        if "weed mini" in cmd or "storage.proxy" in cmd:
            m2 = WAVE_RE.search(cmd)
            if m2:
                entry(m2.group(0))["processes"].append({"pid": int(pid), "cmd": cmd[:160]})
                continue
        for w, tmp in ray_tmp.items():  # Ray's processes name their temp dir on their command lines
            if of_ray(pid, cmd, tmp):
                entry(w)["processes"].append({"pid": int(pid), "cmd": cmd[:160]})
                entry(w).setdefault("ray_tmpdir", tmp)
                break
    for w, sid in cgroups.list_sandboxes():
        entry(w)["cgroups"].append(sid)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        parts = line.split(" - ", 1)
        if len(parts) == 2:
            src = parts[1].split()[1]
            if src.startswith("sandfleet-ws."):
                w = src.split(".")[1]
                entry(w)["mounts"].append(line.split()[4])
                entry(w).setdefault("mount_sandboxes", {})[line.split()[4]] = src.split(".", 2)[2]
            elif src.startswith("sandfleet-vol."):  # a task's kept volume (sandbox.disk keep): the wave's, no sandbox's
                entry(src.split(".")[1])["mounts"].append(line.split()[4])
    if engine_lost:
        if errors is not None:
            errors.append(f"{LISTING_ERROR} containers were not listed (the engine was lost: {engine_lost[:120]})")
        return waves, private
    for c in list_containers(errors=errors) or []:  # docker sandboxes: by their wave label
        if c["wave"] and WAVE_RE.fullmatch(c["wave"]):
            entry(c["wave"])["containers"].append(c)
    return waves, private
