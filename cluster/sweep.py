"""Crash cleanup: find and remove what a dead wave driver left behind, by the project's markers only.

Every wave records its driver in `/tmp/sandfleet-<wave>/driver.json` (pid and process start time) as
its first act. A wave is dead when that driver is gone (or the private dir is gone and nothing alive
refers to the wave). For a dead wave `sandfleet sweep` finds: its store and proxy processes (their
command lines carry the wave id), its sandbox processes (environment marker `SANDFLEET_SANDBOX=<wave>/`),
its sandbox cgroup dirs (`<own>/sandfleet/<wave>/...`), its workspace mounts (source
`sandfleet-ws.<wave>.<sandbox>`), its private dir (keys, identities) and harness cgroup dirs with no
process left. Nothing without a marker is touched; a live wave is never touched.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import orjson

from cluster import results
from fleet import cgroups

PRIVATE_GLOB = "sandfleet-w-*"
WAVE_RE = re.compile(r"w-\d{8}T\d{6}-s\d+-[0-9a-f]{4}")


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def record_driver(private: Path) -> None:
    """Called by a wave's driver first thing: who owns this wave."""
    (private / results.DRIVER_RECORD).write_bytes(orjson.dumps({"pid": os.getpid(), "start": _start_time(os.getpid())}))


def driver_alive(private: Path) -> bool:
    try:
        d = orjson.loads((private / results.DRIVER_RECORD).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return _start_time(d["pid"]) == d["start"]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _environ(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def find(wave: str | None = None, errors: list | None = None) -> dict:
    """Leftovers of dead waves, grouped by kind; nothing is changed. `errors` gets what could not be looked at
    (a docker engine that did not answer)."""
    waves, private = markers(errors)
    dead = {}
    for w, e in waves.items():
        if wave and w != wave:
            continue
        p = private.get(w)
        alive = driver_alive(p) if p is not None else False
        if not alive:
            dead[w] = e
    harness = []
    for d in cgroups.harness_dirs():
        try:
            if not Path(d, "cgroup.procs").read_text().split():
                harness.append(d)
        except OSError:
            pass
    return {"waves": dead, "harness_cgroups": harness}


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
            ray_tmp[w] = orjson.loads((p / results.RAY_RECORD).read_bytes())["tmpdir"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        cmd = _cmdline(pid)
        env = _environ(pid)
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
            if tmp + "/" in cmd or cmd.rstrip().endswith(tmp):
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
    from fleet.docker_backend import LISTING_ERROR, list_containers

    if engine_lost:
        if errors is not None:
            errors.append(f"{LISTING_ERROR} containers were not listed (the engine was lost: {engine_lost[:120]})")
        return waves, private
    for c in list_containers(errors=errors) or []:  # docker sandboxes: by their wave label
        if c["wave"] and WAVE_RE.fullmatch(c["wave"]):
            entry(c["wave"])["containers"].append(c)
    return waves, private


def remove(found: dict, keep_data: bool = False) -> list[str]:
    """Remove what `find` listed; returns what was done, one line each. `keep_data` (for `wave resume`) keeps
    the private dir's store data and ledger, removing only its keys, workspaces and driver record."""
    from fleet.sandbox import reap_leftover, unmount_workspace

    done = []
    for w, e in found["waves"].items():
        for p in e["processes"]:
            if _cmdline(str(p["pid"]))[:160] == p["cmd"]:  # still the same process
                try:
                    os.kill(p["pid"], signal.SIGKILL)
                    done.append(f"killed {p['pid']} ({p['cmd'][:60]})")
                except ProcessLookupError:
                    pass
        for sid in e["cgroups"]:
            r = reap_leftover(w, sid)
            done.append(f"reaped sandbox {w}/{sid} (pids {r['pids']})")
        for c in e.get("containers", []):
            from fleet.docker_backend import remove_container

            if remove_container(c["id"]):
                done.append(f"removed container {c['name']}")
        for m in e["mounts"]:
            unmount_workspace(m)
            done.append(f"unmounted {m}")
        tmp = e.get("ray_tmpdir")
        if tmp is None and e["private_dir"]:
            try:
                tmp = orjson.loads(Path(e["private_dir"], results.RAY_RECORD).read_bytes())["tmpdir"]
            except (OSError, ValueError, KeyError, TypeError):
                tmp = None
        if tmp and tmp.startswith("/tmp/sfray-") and Path(tmp).is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
            done.append(f"removed the dead wave's Ray temp dir {tmp}")
        if e["private_dir"] and keep_data:
            for sub in ("creds", "ws", results.DRIVER_RECORD):
                p = Path(e["private_dir"], sub)
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
            done.append(f"removed the keys and workspaces of {e['private_dir']} (kept its store and ledger)")
        elif e["private_dir"]:
            shutil.rmtree(e["private_dir"], ignore_errors=True)
            done.append(f"removed {e['private_dir']}")
    # a dead driver's harness cgroup holds its store and proxy until they are gone: look again now
    deadline = time.monotonic() + 5
    while True:
        empty = find(None)["harness_cgroups"] if found["waves"] else found["harness_cgroups"]
        for d in empty:
            try:
                os.rmdir(d)
                done.append(f"removed harness cgroup {d}")
            except OSError:
                pass
        busy = [d for d in cgroups.harness_dirs() if d.split("/")[-1].startswith("driver-")
                and not _start_time(int(d.rsplit("-", 1)[1]))]
        if not busy or time.monotonic() > deadline:
            return done
        time.sleep(0.1)


def summary(found: dict) -> list[str]:
    lines = []
    for w, e in sorted(found["waves"].items()):
        lines.append(f"{w}: {len(e['processes'])} process(es), {len(e['cgroups'])} sandbox cgroup(s), "
                     f"{len(e.get('containers', []))} container(s), "
                     f"{len(e['mounts'])} mount(s), private dir {'yes' if e['private_dir'] else 'no'}")
    for d in found["harness_cgroups"]:
        lines.append(f"empty harness cgroup {d}")
    return lines
