"""What a wave runs on, and the checks before anything starts.

`Parts` holds the started parts: the lent or own fleet (Ray, the lease ledger, a sandbox host per node, the sweep
actor), the S3 store (an embedded `weed mini` of the wave's own or the lent fleet's, or an external endpoint), the
fault proxy in front of it, the model endpoint and effects service, the record of fenced calls, and the store's
per-attempt keys. The wave starts them (`WaveRun._setup`) and every room that uses one is given this holder.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cluster.config import WaveConfig
from cluster.wave.errors import HarnessError
from fleet.sandbox import check_process_backend
from fleet.services import TaskRegistry


@dataclass
class Parts:
    registry: TaskRegistry = field(default_factory=TaskRegistry)
    fleet: Any = None  # cluster.raycluster.FleetSession
    store: Any = None  # storage.store.EmbeddedStore (None: an external store)
    endpoint: Any = None  # storage.store.StoreEndpoint
    proxy: Any = None  # storage.proxy.ProxyProcess
    model: Any = None  # fleet.model_endpoint.ModelEndpoint
    effects: Any = None  # fleet.effects.EffectsService
    fenced_log: Any = None  # fleet.services.CallLog: calls refused because their attempt was fenced
    keys: Any = None  # storage.keys.ScopedKeys (embedded store only)
    bucket: str = ""  # the wave's bucket: its own, or the lent fleet store's (keys under the wave's prefix)
    store_lent: bool = False  # the store (and its keys) is the lent fleet's: the wave neither starts nor stops it
    ledger: Any = None
    hosts: list = field(default_factory=list)
    gateway: Any = None  # fleet.gateway.Gateway: the head's gate for sandboxes on other nodes (remote fleets only)


def exit_text(rc: int | None) -> str:
    if rc is None:
        return "running"
    if rc < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


def preflight(cfg: WaveConfig) -> None:
    """Fail fast, before any results are written, on what this machine lacks."""
    from fleet.cgroups import CgroupError, CgroupSetupError
    from fleet.sandbox import SandboxError
    from storage.errors import StoreError
    from storage.store import find_weed

    try:
        if cfg.sandbox.backend == "process":
            check_process_backend()
        else:  # docker: the engine answers, and the image exists locally (the base image is built now, once)
            check_process_backend()  # the workspace tmpfs and the relays are made the same way
            from fleet.docker_backend import DockerBackend
            from fleet.sandbox import SandboxSpec

            DockerBackend().image(SandboxSpec("", "", "", 0, [], {}, "", image=cfg.sandbox.image, backend="docker"))
        if not cfg.store.url:
            find_weed()
        if cfg.lazy_volumes():  # lose-unsynced / torn, or disk boundaries: a FUSE layer of our own on each volume
            from fleet.lazyfs import check_available

            why = check_available()
            if why:
                what = sorted(cfg.disk_modes() - {"wipe", "keep"}) or "keep with disk boundaries (counted by it)"
                raise HarnessError(f"sandbox.disk / fault_timing disk {what}: {why}", bad_input=True)
    except CgroupSetupError as exc:  # the machine's set-up, for the user to change: exit 254
        raise HarnessError(str(exc), bad_input=True) from None
    except (CgroupError, SandboxError, StoreError, RuntimeError) as exc:
        raise HarnessError(str(exc)) from None
    if cfg.address == "fleet":
        from cluster import localfleet

        try:
            localfleet.require()
        except localfleet.FleetError as exc:
            raise HarnessError(str(exc)) from None
    elif cfg.address not in ("local", "auto"):
        check_ray_address(cfg.address)


def check_ray_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail in bounded time, before anything is written, when no Ray cluster answers at `address`."""
    import socket

    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise HarnessError(f"cannot reach a Ray cluster at {address!r}: expected HOST:PORT of the head's GCS "
                           "(e.g. 127.0.0.1:6379), or 'local'")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise HarnessError(f"cannot reach a Ray cluster at {address}: {exc.strerror or exc} (is `ray start --head` "
                           "running there? use --address local for a private Ray)") from None
