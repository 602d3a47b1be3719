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

from cluster import results
from cluster.fleetrecord import (FILE_ENV, KIND, NAMESPACE, STATE_PREFIX, FleetError, attached_waves, daemons,
                                 fleet_file, load_record, read, serve_argv, stale, write_record)
from fleet.markers import proc_start_time

UP_TIMEOUT_S = 120.0
DOWN_TIMEOUT_S = 60.0


def serve(path: Path) -> int:
    """The daemon: start the fleet, write its record, wait for SIGTERM or SIGINT, stop the fleet, remove the
    record. Its stdout and stderr are the fleet's log (beside the record)."""
    from cluster.raycluster import FleetSession

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = token = secrets.token_hex(32)
    me = {"pid": os.getpid(), "start": proc_start_time(os.getpid())}
    session = FleetSession("local", store=True, names="sandfleet-", namespace=NAMESPACE)
    try:
        session.start()
        import ray

        store = session.store
        info = dict(me, kind=KIND, ready=True, up_since=time.time(), state_dir=session.state_dir, namespace=NAMESPACE,
                    ray={"address": ray.get_runtime_context().gcs_address, "token": token,
                         "tmpdir": session.ray_session.tmpdir},
                    actors={"ledger": "sandfleet-ledger", "sweeper": "sandfleet-sweeper",
                            "hosts": [f"sandfleet-host-{n}" for n in session.node_ids]},
                    node_ids=session.node_ids, host_info=session.host_info, bucket=session.bucket,
                    store={"workdir": str(store.workdir), "pid": store.proc.pid,
                           "start": proc_start_time(store.proc.pid), "url": store.endpoint.url,
                           "region": store.endpoint.region, "ports": store.ports,
                           "admin": [store.endpoint.creds.access_key, store.endpoint.creds.secret_key]})
        write_record(path, info)
        print(f"fleet up: pid {me['pid']}, Ray {info['ray']['address']}, store {store.endpoint.url}", flush=True)
        actors = [("lease ledger", session.ledger), ("sweep actor", session.sweeper)] + [
            (f"sandbox host {n}", h) for n, h in zip(session.node_ids, session.hosts)]
        while not stop.wait(1.0):
            if store.proc.poll() is not None:  # a fleet without its store serves no wave: say so and end
                print(f"the fleet's store exited ({store.proc.returncode}); stopping the fleet", flush=True)
                break
            dead = _dead_actor(actors)
            if dead:  # nor without one of its actors: a wave would meet a lookup error; `sandfleet up` starts anew
                print(f"the fleet's {dead}; stopping the fleet", flush=True)
                break
    finally:
        try:
            mine = (load_record(path) or {}).get("pid") == me["pid"]
        except FleetError:  # a record of this file damaged while this daemon served it: it was this daemon's
            mine = path.is_file()
        if mine:
            path.unlink(missing_ok=True)
        session.stop()
        print("fleet down", flush=True)
    return 0


def _dead_actor(actors: list, timeout_s: float = 2.0) -> str | None:
    """The first of the fleet's actors that died (a ping answered with the actor's death), as `<part> died (why)`;
    one that is only slow or hung is not called dead here (waves name it by their own health watch)."""
    import ray

    refs = [a.ping.remote() for _, a in actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for (part, _), ref in zip(actors, refs):
        if ref in ready:
            try:
                ray.get(ref, timeout=0)
            except ray.exceptions.RayActorError as exc:
                return f"{part} died ({type(exc).__name__})"
            except Exception:  # noqa: BLE001 - any other answer: it is there
                pass
    return None


class _UpLock:
    """One `sandfleet up` at a time per record file (an flock beside it, waited for within the caller's bound): a
    second `up` started at the same moment finds the first's fleet instead of starting another."""

    def __init__(self, path: Path, timeout_s: float):
        self.path, self.timeout_s, self.fd = path.with_name(path.name + ".up.lock"), timeout_s, None

    def __enter__(self):
        import fcntl

        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise FleetError(f"another `sandfleet up` of {self.path.parent} held its lock for "
                                     f"{self.timeout_s:.0f} s") from None
                time.sleep(0.1)

    def __exit__(self, *exc):
        os.close(self.fd)  # (the lock goes with it)


def up(timeout_s: float = UP_TIMEOUT_S) -> tuple[dict, bool]:
    """Start the fleet's daemon and wait (bounded) until its record says it is ready. Returns (record, started):
    `started` False when a fleet was already up (nothing is started twice)."""
    path = fleet_file()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = _UpLock(path, timeout_s)
        with lock:
            return _up(path, timeout_s)
    except OSError as exc:
        raise FleetError(f"the fleet record's directory {path.parent} cannot be used: {exc.strerror or exc} "
                         f"(set ${FILE_ENV} to a path this user may write)") from None


def _up(path: Path, timeout_s: float) -> tuple[dict, bool]:
    info = read(path)
    if info is not None:
        return info, False
    if stale(path) is not None:
        raise FleetError(f"{path} names a fleet whose daemon is gone: run `sandfleet sweep` (it ends what that "
                         "fleet left and removes the file), then `sandfleet up`")
    if daemons(path):
        raise FleetError(f"a fleet daemon serves {path} (pids {daemons(path)}) but no record of it is there: "
                         "`sandfleet down` stops it")
    log_path = path.with_suffix(".log")
    root = Path(__file__).resolve().parent.parent
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, *serve_argv(path)], cwd=root,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, close_fds=True,
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
    """Stop the fleet: SIGTERM to its daemon (by the pid and start time in its record, or, when the record is gone
    or damaged, by its command line), which stops its sandboxes, actors, Ray and store and removes the record;
    waits (bounded). A daemon that does not end in time is SIGKILLed and what it left is swept. Returns the record
    of the fleet stopped, None when none was up. A file there that is not a fleet's record, with no daemon serving
    it, is a FleetError and is left as it is."""

    path = fleet_file()
    try:
        info = load_record(path)
    except FleetError as exc:
        if not daemons(path):
            raise
        info = {"damaged": str(exc)}
    if info is None or "damaged" in info:
        pids = daemons(path)
        if not pids:
            return None
        info = dict(info or {}, pid=pids[0], start=proc_start_time(pids[0]), ready=True)
        sd = _state_dir_of(pids[0])
        if sd:
            info["state_dir"] = sd
    if proc_start_time(info["pid"]) == info["start"] and info["pid"] in daemons(path):
        if "state_dir" in info:
            info["waves"] = attached_waves(info)  # (they end with a harness error: the CLI says so)
        pid = info["pid"]
        os.kill(pid, signal.SIGTERM)
        info["stopped"] = True
        deadline = time.monotonic() + timeout_s
        while proc_start_time(pid) == info["start"] and time.monotonic() < deadline:
            time.sleep(0.1)
        if proc_start_time(pid) == info["start"]:
            os.kill(pid, signal.SIGKILL)
            info["killed"] = True
    if info.get("killed") or path.exists():  # what a killed daemon left, by its markers
        from cluster import sweep

        deadline = time.monotonic() + 10  # (the kill lands in a moment)
        while info.get("killed") and proc_start_time(info["pid"]) == info["start"] and time.monotonic() < deadline:
            time.sleep(0.05)
        found = sweep.find()
        found = {"waves": {}, "harness_cgroups": found["harness_cgroups"],
                 "fleets": {d: e for d, e in found["fleets"].items() if d == info.get("state_dir")}}
        info["swept"] = sweep.remove(found)
    if "damaged" not in info:
        path.unlink(missing_ok=True)
    return info


def _state_dir_of(pid: int) -> str | None:
    """The state dir whose owner record names this daemon (a fleet whose record was damaged or removed)."""
    for d in Path(STATE_PREFIX).parent.glob(Path(STATE_PREFIX).name + "*"):
        try:
            if orjson.loads((d / results.DRIVER_RECORD).read_bytes()).get("pid") == pid:
                return str(d)
        except (OSError, ValueError, AttributeError):
            continue
    return None


def status(timeout_s: float = 2.0) -> dict | None:
    """What the record says of the fleet that is up, with whether its store and its Ray's GCS answer now (no
    driver is connected: a status costs no Ray work); None when none is up."""
    import socket

    info = read()
    if info is None:
        running = daemons(fleet_file())
        if running and stale() is None:
            raise FleetError(f"a fleet daemon serves {fleet_file()} (pid {running[0]}) but its record is not there "
                             "(it is starting or stopping, or the record was removed by hand): "
                             "`sandfleet down` stops it")
        return None
    out = {"pid": info["pid"], "up_s": round(time.time() - info["up_since"], 1), "ray": info["ray"]["address"],
           "store": info["store"]["url"], "bucket": info["bucket"], "nodes": info["node_ids"],
           "state_dir": info["state_dir"], "file": str(fleet_file()),
           "waves": ", ".join(f"{w['wave']} (pid {w['pid']})" for w in attached_waves(info)) or "none"}
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
