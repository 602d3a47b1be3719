"""Ray bootstrap: a private local Ray (default) or an existing cluster by address.

A local Ray gets its own temp dir, usage stats off, and an explicit per-run
auth token (Ray's token auth is on by default; every process of this Ray gets
the token through the environment, and nothing is written to ~/.ray).
"""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile


class RaySession:
    def __init__(self, address: str = "local", num_cpus: int | None = None, tmpdir: str | None = None):
        self.address = address
        self.num_cpus = num_cpus
        self.want_tmpdir = tmpdir  # a wave's own Ray: a path that carries the wave's marker (for the sweep)
        self.tmpdir: str | None = None
        self.owned = False

    def start(self):
        # Ray reads these when it is imported and when its processes start: set them first.
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if self.address == "local":
            # A private Ray is one machine: make Ray take 127.0.0.1 as the node address instead
            # of resolving "localhost" to the host's interface address.
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
        import ray

        if ray.is_initialized():
            return ray
        if self.address == "local":
            # Short path: Ray's unix sockets live under it.
            if self.want_tmpdir:
                os.makedirs(self.want_tmpdir, mode=0o700, exist_ok=True)
                self.tmpdir = self.want_tmpdir
            else:
                self.tmpdir = tempfile.mkdtemp(prefix="sfray-", dir="/tmp")
            os.environ["RAY_TMPDIR"] = self.tmpdir
            ray.init(address="local", _temp_dir=self.tmpdir, include_dashboard=False,
                     _node_ip_address="127.0.0.1",
                     num_cpus=self.num_cpus or os.cpu_count(), log_to_driver=False,
                     configure_logging=False)
            self.owned = True
        else:
            ray.init(address=self.address, log_to_driver=False, configure_logging=False)
        return ray

    def stop(self) -> None:
        import ray

        if self.owned and ray.is_initialized():
            ray.shutdown()
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


def _drop_harness_dir(info: dict, timeout_s: float = 5.0) -> None:
    """Remove a (killed) host's harness cgroup once its process is gone; its parent too when empty."""
    import time
    from pathlib import Path

    d = Path(info.get("cgroup") or "")
    deadline = time.monotonic() + timeout_s
    while d.name and d.is_dir():
        try:
            d.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
            continue
        try:
            d.parent.rmdir()
        except OSError:
            pass


class FleetSession:
    """Ray plus the long-lived actors a wave uses: one lease ledger and one sandbox host per node.

    A CLI wave makes its own and stops it at the end; a test session makes one and
    lends it to every wave (ledger keys carry the wave id, hosts are wave-agnostic).
    """

    def __init__(self, address: str = "local", state_dir: str | None = None, ray_tmpdir: str | None = None):
        self.ray_session = RaySession(address, tmpdir=ray_tmpdir)
        self.state_dir = state_dir or tempfile.mkdtemp(prefix="sandfleet-fleet-", dir="/tmp")
        self._own_state_dir = state_dir is None
        self.ledger = None
        self.hosts: list = []
        self.node_ids: list[str] = []

    def start(self) -> "FleetSession":
        from fleet.host import start_host_actor
        from fleet.ledger import start_ledger_actor

        ray = self.ray_session.start()
        os.chmod(self.state_dir, 0o700)
        self.ledger = start_ledger_actor(os.path.join(self.state_dir, "ledger.db"))
        self.node_ids = ["node-0"]
        self.hosts = [start_host_actor(n, self.ledger) for n in self.node_ids]
        ray.get([h.ping.remote() for h in self.hosts] + [self.ledger.active.remote()], timeout=120)
        self.host_info = ray.get([h.join_harness.remote() for h in self.hosts], timeout=60)
        return self

    def heal(self, timeout_s: float = 15.0) -> list[str]:
        """Replace a ledger or host actor that died (a lent fleet outlives the wave that lost it). The ledger
        reopens its SQLite file, so leases and fences carry on. Returns what was replaced."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        from fleet.host import start_host_actor
        from fleet.ledger import start_ledger_actor

        replaced = []
        try:
            ray.get(self.ledger.ping.remote(), timeout=timeout_s)
        except (RayActorError, GetTimeoutError):
            ray.kill(self.ledger)
            self.ledger = start_ledger_actor(os.path.join(self.state_dir, "ledger.db"))
            ray.get(self.ledger.ping.remote(), timeout=120)
            replaced.append("ledger")
        for i, (n, h) in enumerate(zip(self.node_ids, list(self.hosts))):
            try:
                ray.get(h.ping.remote(), timeout=timeout_s)
                if "ledger" not in replaced:
                    continue
            except (RayActorError, GetTimeoutError):
                pass
            ray.kill(h)  # a host bound to a replaced ledger is replaced too
            _drop_harness_dir(self.host_info[i])
            self.hosts[i] = start_host_actor(n, self.ledger)
            self.host_info[i] = ray.get(self.hosts[i].join_harness.remote(), timeout=120)
            replaced.append(f"host {n}")
        return replaced

    def stop(self) -> None:
        import ray

        if ray.is_initialized():
            for h in self.hosts:
                try:
                    ray.get(h.shutdown.remote(1.0), timeout=30)
                except Exception:  # noqa: BLE001
                    pass
                ray.kill(h)
            for info in getattr(self, "host_info", []):
                _drop_harness_dir(info)  # a host that died could not leave its harness cgroup itself
            if self.ledger is not None:
                ray.kill(self.ledger)
        self.hosts, self.ledger = [], None
        self.ray_session.stop()
        if self._own_state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
