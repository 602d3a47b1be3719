"""The record of a `sandfleet up` fleet, below everything that reads it: where the file is (`fleet_file`), the
daemons that serve it (by their command line), its checks on read (a regular file of this user, mode 600, the
fleet's shape), whether its daemon lives (`read`, `stale`, `require`), and the waves attached to it (`join`,
`attached_waves`). The daemon that writes it (`up`, `serve`, `down`, `status`) is cluster/localfleet.py; the wave's
Ray session attaches through `join` and `sandfleet sweep` finds a stale record here, neither through the daemon.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson

from fleet.markers import proc_start_time

DEFAULT_FILE = "/run/sandfleet/fleet.json"
FILE_ENV = "SANDFLEET_FLEET_FILE"
NAMESPACE = "sandfleet-fleet"


class FleetError(RuntimeError):
    """The fleet could not be started, found or stopped; the message says why and what to do."""


KIND = "sandfleet-fleet"
STATE_PREFIX = "/tmp/sandfleet-fleet-"
RECORD_MAX = 1 << 20


def fleet_file() -> Path:
    """The record's path, one spelling for one file (the daemon runs in another directory than its caller, and is
    found by this path on its command line): its directory resolved (`..`, `//`, links), its name as given (a
    record that is itself a link is refused when read)."""
    p = Path(os.path.abspath(os.environ.get(FILE_ENV) or DEFAULT_FILE))
    return Path(os.path.realpath(p.parent)) / p.name


def serve_argv(path: Path) -> list[str]:
    """The daemon's arguments after the interpreter (cluster/localfleet.py `serve`): the fleet's own marker."""
    return ["-m", "cluster.localfleet", "serve", str(path)]


def daemons(path: Path) -> list[int]:
    """Pids of the daemons that serve this record file, by their command line (the fleet's own marker)."""
    want = [a.encode() for a in serve_argv(path)]
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
            except OSError:
                continue
            if argv[1:] == want:
                found.append(int(pid))
    return found


def _alive(info: dict, path: Path) -> bool:
    """The record's daemon runs: its pid has the recorded start time and is a daemon of this file (a pid reused by
    another process, or a record naming some other process, is not)."""
    return proc_start_time(info["pid"]) == info["start"] and info["pid"] in daemons(path)


_FIELDS = {"kind": str, "pid": int, "start": str, "ready": bool, "up_since": (int, float), "state_dir": str,
           "namespace": str, "ray": dict, "actors": dict, "node_ids": list, "host_info": list, "bucket": str,
           "store": dict}


def _invalid(info) -> str | None:
    """Why this is not the record of a `sandfleet up` fleet, or None."""
    if not isinstance(info, dict):
        return f"its JSON is a {type(info).__name__}, not an object"
    if info.get("kind") != KIND:
        return f"kind is {info.get('kind')!r}, not {KIND!r}"
    for name, types in _FIELDS.items():
        if not isinstance(info.get(name), types) or (types is int and isinstance(info.get(name), bool)):
            return f"{name} is {info.get(name)!r}"
    sd = info["state_dir"]
    if not sd.startswith(STATE_PREFIX) or "/" in sd[len("/tmp/"):] or ".." in sd or not info["ready"]:
        return f"state_dir is {info['state_dir']!r}, not under {STATE_PREFIX}*"
    return None


def load_record(path: Path) -> dict | None:
    """The record at `path`; None when there is no file. A FleetError, and nothing changed, when the file is not a
    fleet's record or others could read or change it (it holds the Ray token and the store's admin key)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FleetError(f"the fleet record {path} cannot be looked at: {exc.strerror or exc}") from None
    if stat.S_ISREG(st.st_mode) and st.st_size > RECORD_MAX:
        raise FleetError(f"{path} is not the record of a `sandfleet up` fleet ({st.st_size} bytes; a record is a "
                         f"few kB); nothing was changed")
    if not stat.S_ISREG(st.st_mode):
        raise FleetError(f"the fleet record {path} is not a regular file; nothing was changed: remove it, or set "
                         f"${FILE_ENV} to another path")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise FleetError(f"the fleet record {path} has mode {stat.S_IMODE(st.st_mode):o} and owner uid {st.st_uid}: "
                         "it holds the Ray token and the store's admin key, so only a file of this user with mode "
                         "600 is read; nothing was changed")
    try:
        info = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        info, why = None, f"not JSON: {str(exc)[:80]}"
    else:
        why = _invalid(info)
    if why:
        raise FleetError(f"{path} is not the record of a `sandfleet up` fleet ({why}); nothing was changed: "
                         f"remove it, or set ${FILE_ENV} to another path")
    return info


def read(path: Path | None = None) -> dict | None:
    """The fleet's record when one is up (its daemon alive), else None (no file, or a stale one)."""
    path = path or fleet_file()
    info = load_record(path)
    return info if info is not None and _alive(info, path) else None


def stale(path: Path | None = None) -> dict | None:
    """The record of a fleet whose daemon is gone (killed; its leftovers are the sweep's), else None."""
    path = path or fleet_file()
    info = load_record(path)
    return info if info is not None and not _alive(info, path) else None


def require() -> dict:
    """The fleet a wave attaches to; a FleetError that says how to start one when none is up."""
    info = read()
    if info is None:
        why = "its daemon is gone (run `sandfleet sweep`)" if stale() else "no fleet is up"
        raise FleetError(f"address 'fleet': {why} ({fleet_file()}); start one with `sandfleet up`, or use "
                         "--address local for a wave's own Ray and store")
    return info


def join(info: dict, wave_id: str) -> Path:
    """A wave attached to the fleet says so in the fleet's state dir (its driver's pid and start time), for
    `status` and `down`; its driver removes it when it lets go (a dead driver's is ignored)."""
    d = Path(info["state_dir"], "waves")
    d.mkdir(mode=0o700, exist_ok=True)
    path = d / f"{wave_id}.json"
    write_record(path, {"wave": wave_id, "pid": os.getpid(), "start": proc_start_time(os.getpid())})
    return path


def attached_waves(info: dict) -> list[dict]:
    """The waves whose drivers run attached to the fleet now: [{wave, pid}]."""
    out = []
    for p in sorted(Path(info["state_dir"], "waves").glob("*.json")):
        try:
            w = orjson.loads(p.read_bytes())
            if proc_start_time(int(w["pid"])) == w["start"]:
                out.append({"wave": str(w["wave"]), "pid": int(w["pid"])})
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def write_record(path: Path, info: dict) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, orjson.dumps(info, option=orjson.OPT_INDENT_2))
    finally:
        os.close(fd)
    os.replace(tmp, path)
