"""A sandbox host's own dir on its node, and what `sandfleet sweep` finds of a dead host's.

A host given attempts by a driver on another machine keeps them under `/tmp/sandfleet-host-<node>/`
(fleet/host/nodedir.py `home`): per wave `sandboxes/<sid>` (state, runner.log), `creds/<sid>` (the attempt's
`credentials.json`), `ws/<sid>` (its workspace's mount point) and `vol/<task>`; and `code/<digest>`, the staged runner
code. The host removes a wave's part when the wave ends and all of it when it shuts down; a host that dies (its
process killed, its node's Ray gone) leaves it, credentials included. The host records its process (`host.json`: pid
and start time) when it makes the dir, so the sweep on that node can tell a dead host's dir from a live one's: a live
host's dir is never touched.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import orjson

from fleet.markers import WAVE_RE, proc_start_time

HOST_GLOB = "sandfleet-host-*"
HOST_RECORD = "host.json"
NO_RECORD_AGE_S = 30.0  # a dir with no record (a host that died as it made it) is dead once this old


def record_owner(home: Path) -> None:
    """This process owns `home` (made if missing, root's, others may only traverse it)."""
    home.mkdir(mode=0o711, exist_ok=True)
    me = {"pid": os.getpid(), "start": proc_start_time(os.getpid())}
    rec = home / HOST_RECORD
    try:
        if orjson.loads(rec.read_bytes()) == me:
            return
    except (OSError, ValueError):
        pass
    tmp = home / f".{HOST_RECORD}.{os.getpid()}.{threading.get_ident()}"  # (attempts prepare in threads at once)
    tmp.write_bytes(orjson.dumps(me))
    os.replace(tmp, rec)


def owner_alive(home: Path) -> bool | None:
    """Whether the host that recorded itself in `home` still runs (None: no record)."""
    try:
        rec = orjson.loads((home / HOST_RECORD).read_bytes())
        now = proc_start_time(int(rec["pid"]))
        return now is not None and now == rec["start"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def dead_host_dirs(wave: str | None = None, root: str = "/tmp", now: float | None = None) -> list[dict]:
    """Dirs of dead hosts on this machine (this user's): {"dir", "path" (what goes: the whole dir, or with `wave`
    only that wave's part of it), "waves", "credentials" (attempts' key files in it)}."""
    out = []
    now = time.time() if now is None else now
    for d in sorted(Path(root).glob(HOST_GLOB)):
        try:
            if not d.is_dir() or d.is_symlink() or d.stat().st_uid != os.geteuid():
                continue
            alive = owner_alive(d)
            if alive or (alive is None and now - d.stat().st_mtime < NO_RECORD_AGE_S):
                continue
            waves = sorted(p.name for p in d.iterdir() if p.is_dir() and WAVE_RE.fullmatch(p.name))
        except OSError:
            continue
        if wave is not None and wave not in waves:
            continue
        path = d / wave if wave is not None else d
        creds = sorted(str(p) for p in path.glob("*/creds/*/credentials.json" if wave is None else
                                                 "creds/*/credentials.json"))
        out.append({"dir": str(d), "path": str(path), "waves": [wave] if wave else waves, "credentials": creds})
    return out


def mounts_under(path: str) -> list[str]:
    """Mount points at or below `path` in this mount namespace, the deepest first."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        mp = line.split()[4].replace("\\040", " ")
        if mp == path or mp.startswith(path.rstrip("/") + "/"):
            found.append(mp)
    return sorted(set(found), key=lambda m: m.count("/"), reverse=True)


def remove(entry: dict) -> list[str]:
    """Unmount what is mounted below the dead host's dir (never a recursive removal into a mount), then remove it."""
    from fleet.sandbox import unmount_workspace

    done = []
    for m in mounts_under(entry["path"]):
        unmount_workspace(m)
        done.append(f"unmounted {m}")
    left = mounts_under(entry["path"])
    if left:
        return done + [f"left {entry['path']}: still mounted there: {', '.join(left[:3])}"]
    shutil.rmtree(entry["path"], ignore_errors=True)
    n = len(entry["credentials"])
    done.append(f"removed the dead sandbox host's dir {entry['path']}" + (f" ({n} attempt credential file(s))"
                                                                            if n else ""))
    return done
