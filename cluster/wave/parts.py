"""What a wave runs on, and the checks before anything starts.

`Parts` holds the started parts: the lent or own fleet (Ray, the lease ledger, a sandbox host per node, the sweep
actor), the S3 store (an embedded `weed mini` of the wave's own or the lent fleet's, or an external endpoint), the
fault proxy in front of it, the model endpoint and effects service, the record of fenced calls, and the store's
per-attempt keys. Each part's start is a method of `Parts`; the wave calls them in order (`WaveRun._setup`) and
every room that uses a part is given this holder.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from cluster import results
from cluster.config import WaveConfig
from cluster.raycluster import FleetSession
from cluster.wave.errors import HarnessError
from fleet.effects import EffectsService
from fleet.model_endpoint import ModelEndpoint
from fleet.sandbox import check_process_backend
from fleet.services import CallLog, TaskRegistry
from storage.credentials import Credentials
from storage.keys import ScopedKeys
from storage.proxy import ProxyProcess
from storage.store import EmbeddedStore, StoreEndpoint, ensure_bucket

if TYPE_CHECKING:  # (types only: the wave gets them from the fleet)
    from ray.actor import ActorHandle

    from fleet.gateway import Gateway
    from fleet.host import WaveHosts


@dataclass
class Parts:
    """The started parts, each None until the wave's set-up starts it (or the lent fleet lends it)."""

    registry: TaskRegistry = field(default_factory=TaskRegistry)
    fleet: FleetSession | None = None
    store: EmbeddedStore | None = None  # None: an external store
    endpoint: StoreEndpoint | None = None
    proxy: ProxyProcess | None = None
    model: ModelEndpoint | None = None
    effects: EffectsService | None = None
    fenced_log: CallLog | None = None  # calls refused because their attempt was fenced
    keys: ScopedKeys | None = None  # embedded store only
    bucket: str = ""  # the wave's bucket: its own, or the lent fleet store's (keys under the wave's prefix)
    store_lent: bool = False  # the store (and its keys) is the lent fleet's: the wave neither starts nor stops it
    keys_before: dict = field(default_factory=dict)  # a lent key book's counts when the wave took it
    ledger: ActorHandle | None = None  # the fleet's lease ledger actor (fleet/ledger.py)
    hosts: WaveHosts | list = field(default_factory=list)  # the fleet's sandbox hosts, as the wave sees them
    gateway: Gateway | None = None  # the head's gate for sandboxes on other nodes (remote fleets only)

    # The parts' own start, in the order the wave's set-up calls them: the store and the proxy take a while to come
    # up, so both are launched first and waited for last, while the services and the fleet start.

    def launch_store(self, cfg: WaveConfig, private: Path) -> None:
        """An external store (`store.url`), the lent fleet's (already up: the wave has its own prefix in the fleet's
        bucket and its own keys), or an embedded one of the wave's own, launched (`wait_ready` waits for it)."""
        if cfg.store.url:
            s = cfg.store
            if not (s.access_key and s.secret_key):
                raise HarnessError("store.url is set but store.access_key / store.secret_key are not")
            self.endpoint = StoreEndpoint(url=s.url, creds=Credentials(s.access_key, s.secret_key))
        elif getattr(self.fleet, "store", None) is not None:
            fleet = self.fleet
            self.store, self.endpoint, self.keys = fleet.store, fleet.store.endpoint, fleet.keys
            self.bucket, self.store_lent = fleet.bucket, True
            self.keys_before = self.keys.counts() if self.keys is not None else {}
        else:
            self.store = EmbeddedStore(private / "store")
            self.endpoint = self.store.launch()

    def start_services(self, cfg: WaveConfig, out: results.ResultsDir) -> None:
        """The fault proxy in front of the store (launched), the model endpoint, the effects service, and the log of
        the calls they refuse because their attempt was fenced."""
        self.proxy = ProxyProcess(self.endpoint.url, str(out.proxy_requests),
                                  merge_slashes=not cfg.store.url,  # SeaweedFS's keys
                                  quota=(cfg.store.quota_objects, cfg.store.quota_mb << 20)).launch()
        self.model = ModelEndpoint(self.registry, think_ms=cfg.workload.think_ms, log_path=out.model_calls,
                                   dialect=cfg.model.dialect, finish=cfg.model.finish).start()
        self.effects = EffectsService(self.registry, log_path=out.effects).start()
        self.fenced_log = CallLog(out.fenced)
        self.model.fenced = self.effects.fenced = self.fenced_log

    def start_fleet(self, cfg: WaveConfig, wave_id: str, private: Path, resuming: bool) -> None:
        """The wave's own fleet (Ray, the ledger, a host per node, the sweep actor); a harness error names a node
        that did not join."""
        # a private Ray's temp dir is recorded in the wave's private dir: a sweep after a dead driver ends that Ray's
        # processes too (its path is short: Ray's unix socket paths must fit in 107 bytes)
        ray_tmp = f"/tmp/sfray-{hashlib.sha256(wave_id.encode()).hexdigest()[:10]}"
        if cfg.address == "local":
            (private / results.RAY_RECORD).write_bytes(orjson.dumps({"tmpdir": ray_tmp}))
        self.fleet = FleetSession(cfg.address, state_dir=str(private / "fleet"),
                                  ray_tmpdir=ray_tmp if cfg.address == "local" else None, nodes=cfg.nodes,
                                  isolation=cfg.node_isolation, min_sandbox_nodes=cfg.min_sandbox_nodes)
        os.makedirs(self.fleet.state_dir, exist_ok=resuming)
        try:
            self.fleet.start()
        except RuntimeError as exc:  # an isolated node that did not join, no sandbox node: exit 2, named
            raise HarnessError(str(exc)) from exc

    def wait_ready(self, t_store: float) -> float | None:
        """Wait for the store (and make the wave's bucket) and the proxy; then the per-attempt keys, scoped to a task's
        prefix at the store (embedded store only). Returns the store's start in seconds since `t_store` (None: lent)."""
        store_s = None
        if not self.store_lent:
            if self.store is not None:
                self.store.wait_ready()
            store_s = round(time.perf_counter() - t_store, 3)  # from launch until it answered
            ensure_bucket(self.endpoint, self.bucket)
        self.proxy.wait_ready()
        if self.store is not None and self.keys is None:
            self.keys = ScopedKeys(self.store, self.endpoint.creds)
        return store_s


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
        from cluster import fleetrecord

        try:
            fleetrecord.require()
        except fleetrecord.FleetError as exc:
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
