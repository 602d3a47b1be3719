"""Crash cleanup: find and remove what a dead wave driver left behind, by the project's markers only.

Every wave records its driver in `/tmp/sandfleet-<wave>/driver.json` (pid and process start time) as
its first act. A wave is dead when that driver is gone (or the private dir is gone and nothing alive
refers to the wave). For a dead wave `sandfleet sweep` finds: its store and proxy processes (their
command lines carry the wave id), its sandbox processes (environment marker `SANDFLEET_SANDBOX=<wave>/`),
its sandbox cgroup dirs (`<own>/sandfleet/<wave>/...`), its workspace mounts (source
`sandfleet-ws.<wave>.<sandbox>`), its private dir (keys, identities) and harness cgroup dirs with no
process left. Nothing without a marker is touched; a live wave is never touched.

A fleet lent to many waves (a test session's, a campaign's, a league's, the daemon of `sandfleet up`) records its
owner the same way in its state dir `/tmp/sandfleet-fleet-*`; a dead owner's fleet leaves its store process there,
which the sweep ends (by the dir in its command line) before removing the dir. A live `sandfleet up` fleet is a
live owner: never touched; the record of a dead one (`/run/sandfleet/fleet.json`) is removed.

A dead wave whose private dir still holds its store data or its lease ledger is **resumable** (`sandfleet wave
resume` needs exactly those): it is listed as such, and the sweep keeps its store and ledger (removing its
processes, sandboxes, keys and workspaces) unless asked with `include_resumable` (`--include-resumable`) or the
wave has been dead longer than RESUMABLE_KEEP_S (7 days, as the README states).
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import orjson

from cluster import results
from fleet import cgroups
from fleet.markers import (PRIVATE_GLOB, kill_listed, markers, of_ray, proc_cmdline, proc_start_time, processes,
                           ray_processes)

RESUMABLE_KEEP_S = 7 * 24 * 3600  # a dead resumable wave's store and ledger are kept this long by a plain sweep


def record_driver(private: Path) -> None:
    """Called by a wave's driver first thing: who owns this wave."""
    me = {"pid": os.getpid(), "start": proc_start_time(os.getpid())}
    (private / results.DRIVER_RECORD).write_bytes(orjson.dumps(me))


def driver_alive(private: Path) -> bool:
    try:
        d = orjson.loads((private / results.DRIVER_RECORD).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return proc_start_time(d["pid"]) == d["start"]


def live_waves() -> list[str]:
    """Waves whose driver runs on this machine (its private dir here names a live process)."""
    return sorted(p.name[len("sandfleet-"):] for p in Path("/tmp").glob(PRIVATE_GLOB)
                  if p.is_dir() and driver_alive(p))


def find(wave: str | None = None, errors: list | None = None, live: frozenset | set = frozenset()) -> dict:
    """Leftovers of dead waves, grouped by kind; nothing is changed. `errors` gets what could not be looked at
    (a docker engine that did not answer). `live`: waves whose driver runs on another machine of the cluster (a
    node has no private dir of theirs: without it, their sandboxes there would be taken for a dead wave's)."""
    waves, private = markers(errors)
    live_rays = live_ray_tmpdirs()
    dead = {}
    for w, e in waves.items():
        if (wave and w != wave) or w in live:
            continue
        p = private.get(w)
        alive = driver_alive(p) if p is not None else False
        if not alive:
            dead[w] = _without_live_ray(e, live_rays)
            dead[w]["resumable"] = resumable(dead[w]["private_dir"])
    harness = []
    # harness cgroups name no wave but a process (`driver-<pid>`, `host-<node>-<pid>`): with --wave only that wave's
    # driver's, by the pid its private dir records (a host's may serve other waves)
    drivers = {f"driver-{_recorded_driver_pid(e['private_dir'])}" for e in dead.values() if e.get("private_dir")}
    for d in cgroups.harness_dirs():
        if wave and Path(d).name not in drivers and not _dead_host_group(Path(d).name):
            continue
        try:
            if not Path(d, "cgroup.procs").read_text().split():
                harness.append(d)
        except OSError:
            pass
    # the dead waves' own Ray temp dirs name their isolated nodes' cgroups (`sandfleet-node.<its basename>.<node>`)
    def ray_tmpdir(e):
        return e.get("ray_tmpdir") or (_recorded_ray_tmpdir(e["private_dir"]) if e["private_dir"] else None)
    dead_tags = {os.path.basename(t) for e in dead.values() for t in [ray_tmpdir(e)] if t}
    nodes = [d for d in dead_node_cgroups(dead_tags) if not wave or _node_tag(d) in dead_tags]
    from cluster import fleetrecord

    try:
        record, bad_record = (fleetrecord.stale() if not wave else None), None
    except fleetrecord.FleetError as exc:  # a file there that is not a fleet's record: named, never removed
        record, bad_record = None, str(exc)
    from fleet import hostdirs

    return {"waves": dead, "wave": wave, "harness_cgroups": harness, "fleets": dead_fleets() if not wave else {},
            "host_dirs": hostdirs.dead_host_dirs(wave),
            "fleet_record": str(fleetrecord.fleet_file()) if record is not None else None,
            "bad_fleet_record": bad_record,
            "node_cgroups": nodes, "dead_rays": dead_private_rays() if not wave else {}}


def _dead_host_group(name: str) -> bool:
    """A sandbox host's harness cgroup (`host-<node>-<pid>`) whose process is gone: it serves no wave any more, so
    a sweep limited to one wave may remove it too once it is empty (a dead wave's own Ray left it)."""
    pid = name.rpartition("-")[2]
    return name.startswith("host-") and pid.isdigit() and not os.path.exists(f"/proc/{pid}")


def dead_private_rays(root: str = "/tmp") -> dict[str, list[dict]]:
    """Private Rays (`<root>/sfray-*`: the prefix a RaySession gives its temp dir, the project's marker) whose GCS
    and raylets are all gone while some of their processes live on: a killed GCS or driver orphans its agents
    (retitled `ray::DashboardAgent`, `ray::RuntimeEnvAgent`, found by the files they hold open there) for
    minutes, and a driver killed before it recorded its Ray names them nowhere else. A Ray with a live GCS or
    raylet is never listed."""
    procs = list(processes())
    out = {}
    for tmp in sorted(str(p) for p in Path(root).glob("sfray-*") if p.is_dir()):
        mine = [{"pid": int(pid), "cmd": cmd[:160]} for pid, cmd in procs if of_ray(pid, cmd, tmp)]
        if mine and not any("gcs_server" in p["cmd"] or "/raylet" in p["cmd"] for p in mine):
            out[tmp] = mine
    return out


def _node_tag(d: str) -> str:
    return Path(d).name.split(".")[1] if Path(d).name.count(".") >= 2 else ""


def dead_node_cgroups(dead_tags: set[str] = frozenset(), min_age_s: float = 30.0) -> list[str]:
    """Cgroup dirs of isolated nodes (`sandfleet-node.<ray tmpdir>.<node>`, their marker) with no process anywhere
    below them: what a wave whose driver died left of its nodes (the nodes themselves die with their driver). One of
    a dead wave (its Ray temp dir's name in `dead_tags`) goes at once; another one younger than `min_age_s` whose
    Ray temp dir is there is skipped: a node being made has its dir a moment before its first process."""
    from cluster.isolated import leftover_node_cgroups

    out = []
    for d in leftover_node_cgroups():
        try:
            tag = _node_tag(d)
            if tag not in dead_tags and Path("/tmp", tag).exists() and time.time() - os.stat(d).st_mtime < min_age_s:
                continue
            if any(Path(p, "cgroup.procs").read_text().split() for p, _, _ in os.walk(d)):
                continue
        except OSError:
            continue
        out.append(d)
    return out


FLEET_GLOB = "sandfleet-fleet-*"


def live_ray_tmpdirs() -> set[str]:
    """The Ray temp dirs recorded by an owner that is alive (a wave's driver, a fleet's owner): whatever a dead
    one's dir says (a dir anyone can make under /tmp), a live one's Ray is never a dead one's leftover."""
    out = set()
    for d in list(Path("/tmp").glob(FLEET_GLOB)) + list(Path("/tmp").glob(PRIVATE_GLOB)):
        if d.is_dir() and driver_alive(d):
            tmp = _recorded_ray_tmpdir(str(d))
            if tmp:
                out.add(tmp)
    return out


def _ours(d: Path) -> bool:
    try:
        return d.stat().st_uid == os.geteuid()
    except OSError:
        return False


def _without_live_ray(e: dict, live: set[str]) -> dict:
    """A dead wave's leftovers less a Ray it names that is a live owner's, or that a dir of another user names."""
    tmp = e.get("ray_tmpdir")
    if tmp and (tmp in live or (e.get("private_dir") and not _ours(Path(e["private_dir"])))):
        e = dict(e, ray_tmpdir=None, processes=[p for p in e["processes"]
                                                if not of_ray(str(p["pid"]), proc_cmdline(str(p["pid"])), tmp)])
    return e


def dead_fleets() -> dict:
    """{state dir: {"processes", "ray_tmpdir"}} of lent fleets whose owner is gone (a dir with no owner record is
    not touched: it may be a fleet still starting): its store (the dir is on its command line) and its private
    Ray's processes (their temp dir, recorded in the state dir, is on their command line, or held open by the
    agents that retitle themselves)."""
    out = {}
    live = live_ray_tmpdirs()
    for d in Path("/tmp").glob(FLEET_GLOB):
        if not d.is_dir() or not _ours(d) or not (d / results.DRIVER_RECORD).exists() or driver_alive(d):
            continue  # (a dir of another user is never this sweep's to act on)
        try:
            tmp = orjson.loads((d / results.RAY_RECORD).read_bytes())["tmpdir"]
        except (OSError, ValueError, KeyError, TypeError):
            tmp = None
        tmp = tmp if tmp and tmp.startswith("/tmp/sfray-") and tmp not in live else None
        store = [{"pid": int(pid), "cmd": cmd[:160]} for pid, cmd in processes() if f"{d}/" in cmd]
        out[str(d)] = {"processes": store + (ray_processes(tmp) if tmp else []), "ray_tmpdir": tmp}
    return out


def resumable(private_dir: str | None, now: float | None = None) -> dict | None:
    """What `wave resume` needs of a dead wave that is still in its private dir (its store data, its lease ledger),
    with how long ago the wave last wrote them; None when neither is there."""
    if not private_dir:
        return None
    kept = [p for p in (Path(private_dir, "store"), Path(private_dir, results.LEDGER_DB)) if p.exists()]
    if not kept:
        return None
    stamps = []
    for p in kept + [p / "weed.log" for p in kept if p.is_dir()] + [Path(private_dir, results.LEDGER_DB + "-wal")]:
        try:
            stamps.append(p.stat().st_mtime)
        except OSError:
            pass
    age = max(0.0, (time.time() if now is None else now) - max(stamps, default=0.0))
    return {"kept": [p.name for p in kept], "age_s": age, "expired": age > RESUMABLE_KEEP_S}


def keeps_data(e: dict, include_resumable: bool = False) -> bool:
    """Whether a plain sweep keeps this dead wave's store and ledger: a resumable wave, not expired, not asked."""
    r = e.get("resumable")
    return bool(r) and not include_resumable and not r["expired"]


def remove(found: dict, keep_data: bool = False, include_resumable: bool = False) -> list[str]:
    """Remove what `find` listed; returns what was done, one line each. `keep_data` (for `wave resume`) keeps
    the private dir's store data and ledger, removing only its keys, workspaces and driver record; a resumable
    wave's are kept too unless `include_resumable` or the wave is older than RESUMABLE_KEEP_S."""
    done = []
    for w, e in found["waves"].items():
        keep = keep_data or keeps_data(e, include_resumable)
        done += _remove_wave(w, e, keep)
        if keep and not keep_data:
            done.append(f"kept the store data and ledger of resumable wave {w}: `sandfleet wave resume "
                        f"RESULTS/{w}` continues it; `sandfleet sweep --include-resumable` removes them")
    from fleet import hostdirs

    for e in found.get("host_dirs", []):  # (after the sandboxes: their workspaces are mounted in it)
        done += hostdirs.remove(e)
    for d, e in found.get("fleets", {}).items():
        done += kill_listed(e["processes"])
        if e.get("ray_tmpdir") and Path(e["ray_tmpdir"]).is_dir():
            shutil.rmtree(e["ray_tmpdir"], ignore_errors=True)
            done.append(f"removed the dead fleet's Ray temp dir {e['ray_tmpdir']}")
        shutil.rmtree(d, ignore_errors=True)
        done.append(f"removed the dead fleet's state dir {d}")
    if found.get("fleet_record"):  # (its daemon's state dir and processes are among the dead fleets above)
        Path(found["fleet_record"]).unlink(missing_ok=True)
        done.append(f"removed the record of the dead `sandfleet up` fleet {found['fleet_record']}")
    for tmp, procs in found.get("dead_rays", {}).items():
        done += kill_listed(procs)
        shutil.rmtree(tmp, ignore_errors=True)
        done.append(f"removed the dead Ray's temp dir {tmp}")
    for d in found.get("node_cgroups", []):
        for sub, _, _ in sorted(os.walk(d), key=lambda w: len(w[0]), reverse=True):  # the deepest first
            try:
                os.rmdir(sub)
            except OSError:
                pass
        if not os.path.isdir(d):
            done.append(f"removed the dead isolated node's cgroup {d}")
    return done + _remove_harness_cgroups(found)


def _remove_wave(w: str, e: dict, keep_data: bool) -> list[str]:
    """One dead wave's processes, sandboxes, containers, mounts, Ray temp dir and private dir."""
    from fleet.backends import reap_leftover
    from fleet.dockerapi import remove_container
    from fleet.sandbox import unmount_workspace

    done = kill_listed(e["processes"])
    for sid in e["cgroups"]:
        r = reap_leftover(w, sid)
        done.append(f"reaped sandbox {w}/{sid} (pids {r['pids']})")
    done += [f"removed container {c['name']}" for c in e.get("containers", []) if remove_container(c["id"])]
    for m in e["mounts"]:
        unmount_workspace(m)
        done.append(f"unmounted {m}")
    tmp = e.get("ray_tmpdir") or (_recorded_ray_tmpdir(e["private_dir"]) if e["private_dir"] else None)
    if tmp and tmp.startswith("/tmp/sfray-") and Path(tmp).is_dir() and tmp not in live_ray_tmpdirs():
        shutil.rmtree(tmp, ignore_errors=True)
        done.append(f"removed the dead wave's Ray temp dir {tmp}")
    if e["private_dir"] and keep_data:
        # (the dead driver's record stays: it names the driver's harness cgroup, which the scoped harness-cgroup
        # pass below and a later sweep find by it; a resumed wave's driver writes its own)
        for sub in ("creds", "ws"):
            p = Path(e["private_dir"], sub)
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        done.append(f"removed the keys and workspaces of {e['private_dir']} (kept its store and ledger)")
    elif e["private_dir"]:
        shutil.rmtree(e["private_dir"], ignore_errors=True)
        done.append(f"removed {e['private_dir']}")
    return done


def _recorded_driver_pid(private_dir: str) -> int | None:
    try:
        return int(orjson.loads(Path(private_dir, results.DRIVER_RECORD).read_bytes())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _recorded_ray_tmpdir(private_dir: str) -> str | None:
    try:
        return orjson.loads(Path(private_dir, results.RAY_RECORD).read_bytes())["tmpdir"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _remove_harness_cgroups(found: dict) -> list[str]:
    """A dead driver's harness cgroup holds its store and proxy until they are gone, and a dead fleet's host
    actor's its own process: look again until each is empty (bounded, 5 s)."""
    done = []
    deadline = time.monotonic() + 5
    again = bool(found["waves"] or found.get("fleets"))
    wave = found.get("wave")
    while True:
        empty = find(wave)["harness_cgroups"] if again else found["harness_cgroups"]
        for d in empty:
            try:
                os.rmdir(d)
                done.append(f"removed harness cgroup {d}")
            except OSError:
                pass
        mine = {f"driver-{_recorded_driver_pid(e['private_dir'])}" for e in found["waves"].values()
                if e.get("private_dir")}
        busy = [d for d in cgroups.harness_dirs() if d.split("/")[-1].startswith(("driver-", "host-"))
                and (not wave or d.split("/")[-1] in mine)
                and d.rsplit("-", 1)[1].isdigit() and not proc_start_time(int(d.rsplit("-", 1)[1]))] if again else []
        if not busy or time.monotonic() > deadline:
            return done
        time.sleep(0.1)


def summary(found: dict, include_resumable: bool = False) -> list[str]:
    lines = []
    for w, e in sorted(found["waves"].items()):
        r = e.get("resumable")
        why = "" if not r else f", resumable by `sandfleet wave resume` (its {' and '.join(r['kept'])}: " + (
            f"dead {r['age_s'] / 86400:.1f} days, past the {RESUMABLE_KEEP_S // 86400}-day bound, so removed)"
            if r["expired"] else "removed, as --include-resumable asks)" if include_resumable
            else "kept; --include-resumable removes them)")
        lines.append(f"{w}: {len(e['processes'])} process(es), {len(e['cgroups'])} sandbox cgroup(s), "
                     f"{len(e.get('containers', []))} container(s), "
                     f"{len(e['mounts'])} mount(s), private dir {'yes' if e['private_dir'] else 'no'}{why}")
    for d, e in sorted(found.get("fleets", {}).items()):
        lines.append(f"fleet {d} (its owner is gone): {len(e['processes'])} process(es)"
                     + (f", Ray temp dir {e['ray_tmpdir']}" if e.get("ray_tmpdir") else ""))
    if found.get("fleet_record"):
        lines.append(f"the record of a `sandfleet up` fleet whose daemon is gone: {found['fleet_record']}")
    for d in found["harness_cgroups"]:
        lines.append(f"empty harness cgroup {d}")
    for e in found.get("host_dirs", []):
        lines.append(f"the dir of a dead sandbox host {e['path']}: wave(s) {', '.join(e['waves']) or 'none'}, "
                     f"{len(e['credentials'])} attempt credential file(s)")
    for d in found.get("node_cgroups", []):
        lines.append(f"empty cgroup of a dead wave's isolated node {d}")
    for tmp, procs in sorted(found.get("dead_rays", {}).items()):
        lines.append(f"a dead private Ray {tmp} (no GCS, no raylet): {len(procs)} orphaned process(es) "
                     f"({', '.join(sorted({p['cmd'].split()[0][:40] for p in procs}))})")
    return lines


def here(wave: str | None, dry_run: bool, live: list[str] = ()) -> dict:
    """One machine's sweep, as `sandfleet sweep` does it: what was found, and what was done unless `dry_run`.
    `sandfleet sweep --cluster` runs it on every node of a cluster (each node ends only its own leftovers; `live`:
    the waves whose driver another node runs)."""
    import socket

    unseen: list = []
    found = find(wave, unseen, set(live))
    return {"host": socket.gethostname(), "found": summary(found), "unseen": unseen,
            "done": [] if dry_run or not summary(found) else remove(found)}
