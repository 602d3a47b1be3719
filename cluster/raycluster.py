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
    def __init__(self, address: str = "local", num_cpus: int | None = None):
        self.address = address
        self.num_cpus = num_cpus
        self.tmpdir: str | None = None
        self.owned = False

    def start(self):
        # Ray reads these when it is imported and when its processes start: set them first.
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if self.address == "local":
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
        import ray

        if ray.is_initialized():
            return ray
        if self.address == "local":
            # Short path: Ray's unix sockets live under it.
            self.tmpdir = tempfile.mkdtemp(prefix="sfray-", dir="/tmp")
            os.environ["RAY_TMPDIR"] = self.tmpdir
            ray.init(address="local", _temp_dir=self.tmpdir, include_dashboard=False,
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
