"""`sandfleet up` / `down` / `status`: a long-lived local fleet that later waves attach to (`--address fleet`).

The fleet is one daemon process (`python -m cluster.localfleet serve FILE`, its own session) holding what every
wave would otherwise start and stop itself: a private one-node Ray, the lease ledger, the sandbox host, the sweep
actor (named actors in the `sandfleet-fleet` namespace) and one embedded store (weed mini) with one bucket. A wave
that attaches starts none of them: it connects to that Ray as a driver, finds the actors by name, writes under its
own `<wave id>/` prefix of the fleet's bucket with its own per-attempt keys, and runs its own fault proxy, model
endpoint and effects service; its results are its own. Waves may attach one after the other or side by side.

Like `ray start`'s cluster, the fleet is found through a file in a known place, `/run/sandfleet/fleet.json`
(`$SANDFLEET_FLEET_FILE` moves it; mode 0600 in a 0700 dir: it holds the Ray token and the store's admin key).
The daemon's state dir is `/tmp/sandfleet-fleet-*` with its pid recorded as its owner, so `sandfleet sweep` ends
what a killed daemon left (its Ray and its store) as it does a dead test session's fleet, and removes a file whose
daemon is gone.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson

DEFAULT_FILE = "/run/sandfleet/fleet.json"
FILE_ENV = "SANDFLEET_FLEET_FILE"
NAMESPACE = "sandfleet-fleet"
UP_TIMEOUT_S = 120.0
DOWN_TIMEOUT_S = 60.0


class FleetError(RuntimeError):
    """The fleet could not be started, found or stopped; the message says why and what to do."""


def fleet_file() -> Path:
    return Path(os.environ.get(FILE_ENV) or DEFAULT_FILE)


def _alive(info: dict) -> bool:
    from fleet.markers import _start_time

    try:
        return _start_time(int(info["pid"])) == info["start"]
    except (KeyError, TypeError, ValueError):
        return False


def _load(path: Path) -> dict | None:
    try:
        info = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return info if isinstance(info, dict) else None


def read(path: Path | None = None) -> dict | None:
    """The fleet's record when one is up (its daemon alive), else None (no file, or a stale one)."""
    info = _load(path or fleet_file())
    return info if info is not None and info.get("ready") and _alive(info) else None


def stale(path: Path | None = None) -> dict | None:
    """The record of a fleet whose daemon is gone (killed; its leftovers are the sweep's), else None."""
    info = _load(path or fleet_file())
    return info if info is not None and not _alive(info) else None


def require() -> dict:
    """The fleet a wave attaches to; a FleetError that says how to start one when none is up."""
    info = read()
    if info is None:
        why = "its daemon is gone (run `sandfleet sweep`)" if stale() else "no fleet is up"
        raise FleetError(f"address 'fleet': {why} ({fleet_file()}); start one with `sandfleet up`, or use "
                         "--address local for a wave's own Ray and store")
    return info


def _write(path: Path, info: dict) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, orjson.dumps(info, option=orjson.OPT_INDENT_2))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def serve(path: Path) -> int:
    """The daemon: start the fleet, write its record, wait for SIGTERM or SIGINT, stop the fleet, remove the
    record. Its stdout and stderr are the fleet's log (beside the record)."""
    from cluster.raycluster import FleetSession
    from fleet.markers import _start_time

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = token = secrets.token_hex(32)
    me = {"pid": os.getpid(), "start": _start_time(os.getpid())}
    session = FleetSession("local", store=True, names="sandfleet-", namespace=NAMESPACE)
    try:
        session.start()
        import ray

        store = session.store
        info = dict(me, ready=True, up_since=time.time(), state_dir=session.state_dir, namespace=NAMESPACE,
                    ray={"address": ray.get_runtime_context().gcs_address, "token": token,
                         "tmpdir": session.ray_session.tmpdir},
                    actors={"ledger": "sandfleet-ledger", "sweeper": "sandfleet-sweeper",
                            "hosts": [f"sandfleet-host-{n}" for n in session.node_ids]},
                    node_ids=session.node_ids, host_info=session.host_info, bucket=session.bucket,
                    store={"workdir": str(store.workdir), "pid": store.proc.pid, "start": _start_time(store.proc.pid),
                           "url": store.endpoint.url, "region": store.endpoint.region, "ports": store.ports,
                           "admin": [store.endpoint.creds.access_key, store.endpoint.creds.secret_key]})
        _write(path, info)
        print(f"fleet up: pid {me['pid']}, Ray {info['ray']['address']}, store {store.endpoint.url}", flush=True)
        while not stop.wait(1.0):
            if store.proc.poll() is not None:  # a fleet without its store serves no wave: say so and end
                print(f"the fleet's store exited ({store.proc.returncode}); stopping the fleet", flush=True)
                break
    finally:
        if (_load(path) or {}).get("pid") == me["pid"]:
            path.unlink(missing_ok=True)
        session.stop()
        print("fleet down", flush=True)
    return 0


def up(timeout_s: float = UP_TIMEOUT_S) -> tuple[dict, bool]:
    """Start the fleet's daemon and wait (bounded) until its record says it is ready. Returns (record, started):
    `started` False when a fleet was already up (nothing is started twice)."""
    path = fleet_file()
    info = read(path)
    if info is not None:
        return info, False
    if stale(path) is not None:
        raise FleetError(f"{path} names a fleet whose daemon is gone: run `sandfleet sweep` (it ends what that "
                         "fleet left and removes the file), then `sandfleet up`")
    if path.exists():  # a fleet still starting (no `ready` yet) is not started twice
        raise FleetError(f"{path} exists but says no fleet is ready: another `sandfleet up` may be starting one; "
                         "wait, or `sandfleet down`")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_path = path.with_suffix(".log")
    root = Path(__file__).resolve().parent.parent
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cluster.localfleet", "serve", str(path)], cwd=root,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=dict(os.environ, PYTHONPATH=str(root)))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = read(path)
        if info is not None and info["pid"] == proc.pid:
            return info, True
        if proc.poll() is not None:
            raise FleetError(f"the fleet's daemon exited ({proc.returncode}) before it was up; its log "
                             f"({log_path}):\n{_tail(log_path)}")
        time.sleep(0.1)
    proc.terminate()
    raise FleetError(f"the fleet was not up after {timeout_s:.0f} s (stopped); its log ({log_path}):\n"
                     f"{_tail(log_path)}")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def down(timeout_s: float = DOWN_TIMEOUT_S) -> dict | None:
    """Stop the fleet: SIGTERM to its daemon (by the pid and start time in its record), which stops its sandboxes,
    actors, Ray and store and removes the record; waits (bounded). A daemon that does not end in time is
    SIGKILLed and what it left is swept. Returns the record of the fleet stopped, None when none was up."""
    from fleet.markers import _start_time

    path = fleet_file()
    info = _load(path)
    if info is None:
        return None
    if _alive(info):
        pid = int(info["pid"])
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _start_time(pid) == info["start"] and time.monotonic() < deadline:
            time.sleep(0.1)
        if _start_time(pid) == info["start"]:
            os.kill(pid, signal.SIGKILL)
            info["killed"] = True
    if info.get("killed") or not info.get("ready") or path.exists():  # what a killed daemon left, by its markers
        from cluster import sweep

        deadline = time.monotonic() + 10  # (the kill lands in a moment)
        while _start_time(int(info.get("pid", 0))) == info.get("start") and time.monotonic() < deadline:
            time.sleep(0.05)
        found = sweep.find()
        found = {"waves": {}, "harness_cgroups": found["harness_cgroups"],
                 "fleets": {d: e for d, e in found["fleets"].items() if d == info.get("state_dir")}}
        info["swept"] = sweep.remove(found)
    path.unlink(missing_ok=True)
    return info


def status(timeout_s: float = 2.0) -> dict | None:
    """What the record says of the fleet that is up, with whether its store and its Ray's GCS answer now (no
    driver is connected: a status costs no Ray work); None when none is up."""
    import socket

    info = read()
    if info is None:
        return None
    out = {"pid": info["pid"], "up_s": round(time.time() - info["up_since"], 1), "ray": info["ray"]["address"],
           "store": info["store"]["url"], "bucket": info["bucket"], "nodes": info["node_ids"],
           "state_dir": info["state_dir"], "file": str(fleet_file())}
    for part, url in (("ray_answers", info["ray"]["address"]), ("store_answers", info["store"]["url"])):
        host, _, port = url.split("://", 1)[-1].rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
            out[part] = True
        except OSError:
            out[part] = False
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        sys.exit("usage: python -m cluster.localfleet serve FILE")
    sys.exit(serve(Path(sys.argv[2])))
