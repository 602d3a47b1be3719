"""What a sandbox is: its spec (`SandboxSpec`, what the host is asked to run), its record while it lives
(`Sandbox`, with the lifecycle of fleet/lifecycle.py), the paths and uid it sees, and `SandboxError`."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field

from fleet.lifecycle import Lifecycle, SandboxState

BASH = "/bin/bash"
WORKSPACE_IN = "/workspace"
RUN_IN = "/run/sandfleet"
SANDBOX_UID = 65534
MAX_ARTIFACT_BYTES = 32 * 1024 * 1024
MAX_ARTIFACT_FILES = 20000
MAX_ARTIFACT_DEPTH = 64  # directories below the captured root


class SandboxError(RuntimeError):
    """A sandbox could not be made or run. `harness_part` names the part of the harness at fault (the backend's
    engine not answering), when it is not the runner's or the config's doing."""

    harness_part: str | None = None


VOLUME_SOURCE = "sandfleet-vol"  # mount source of a task's kept volume: `sandfleet-vol.<wave>.<task>`
RUNNER_LOG = "runner.log"  # in a sandbox's state dir (cluster/results.py names the same file in the results)


def sandbox_key(wave_id: str, sandbox_id: str) -> str:
    return f"{wave_id}/{sandbox_id}"


@dataclass
class SandboxSpec:
    wave_id: str
    sandbox_id: str
    task_id: str
    attempt: int
    argv: list[str]
    env: dict[str, str]
    state_dir: str  # host directory for this sandbox: log, checkpoint file
    workspace_mb: int = 64
    memory_mb: int = 512
    pids_max: int = 256
    workspace_dir: str | None = None  # host mount point of the tmpfs workspace (default: <state_dir>/ws)
    files: dict[str, str] = field(default_factory=dict)  # seeded into the workspace before the start
    cpu_shares: int = 256
    cpu_quota: float = 1.0  # cores
    ro_binds: list[str] = field(default_factory=list)  # host paths visible read-only at the same path
    ro_mounts: dict[str, str] = field(default_factory=dict)  # host dir -> read-only path inside
    hide: list[str] = field(default_factory=list)  # paths covered by an empty tmpfs inside
    relays: dict[int, str] = field(default_factory=dict)  # loopback port inside -> "host:port" of a service
    relay_token: str | None = None  # opens the head's gate (fleet/gateway.py) for relays to "host:port/service"
    # A driver on another machine (`remote`): the host makes state_dir and workspace_dir under its own dir, writes
    # `credentials` ({access_key, secret_key, region, mount}) there, mounts the shipped snapshot `code` ({digest,
    # path}) at the runner workdir's path, and returns the runner's log in the result: nothing is a driver's path.
    remote: bool = False
    credentials: dict | None = None
    code: dict | None = None
    backend: str = "process"  # process | docker
    image: str | None = None  # docker: a local image (default: the base image built from Debian's packages)
    # A kept disk (`sandbox.disk: keep`): the task's volume, kept across its attempts by its host (the workspace is
    # the volume: mounted and seeded once, never unmounted by a sandbox's end); `volume_fresh`: this attempt starts
    # on a fresh one (the first attempt, or the last one ended in a wipe)
    volume: str | None = None
    volume_fresh: bool = True
    # A crash mode in the wave (lose-unsynced, torn): the volume is served through the lazy file system
    # (fleet/lazyfs/), and `volume_crash` ("drop" = a power loss, "tear" = a power loss with the write in flight
    # torn at `volume_seed`) is done to it before this attempt starts; what it dropped is the attempt's `disk` result
    volume_lazy: bool = False
    volume_crash: str | None = None
    volume_seed: int = 0
    # `move` (PK3): the volume as the lost node left it (a tar its host read back, carried through Ray by the
    # driver): this attempt's host mounts a fresh volume and lays it there, on another node
    volume_image: bytes | None = None

    @property
    def workspace(self) -> str:
        return self.workspace_dir or os.path.join(self.state_dir, "ws")

    @property
    def mount_source(self) -> str:
        if self.volume:  # the task's, not one sandbox's: a sweep drops it with the wave, never as a sandbox's
            return f"{VOLUME_SOURCE}.{self.wave_id}.{self.volume}"
        return f"sandfleet-ws.{self.wave_id}.{self.sandbox_id}"

    @property
    def log_path(self) -> str:
        return os.path.join(self.state_dir, RUNNER_LOG)

    @property
    def checkpoint_path(self) -> str:
        """Host path of the file a runner appends named kill windows to (in its own workspace)."""
        return os.path.join(self.workspace, ".sandfleet", "checkpoints")

    @property
    def key(self) -> str:
        """The host's name for this sandbox, `<wave>/<sandbox>`: a fleet's host runs several waves' sandboxes, and
        two waves each have a `t000-a1`."""
        return sandbox_key(self.wave_id, self.sandbox_id)


@dataclass
class Sandbox:
    spec: SandboxSpec
    life: Lifecycle
    pid: int | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    start_ms: float | None = None
    killed_by: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def state(self) -> SandboxState:
        return self.life.state

    def cause(self) -> str:
        """Why the attempt ended, in words a user can act on (exit code alone says little)."""
        ev = self.extra.get("events", {})
        code = self.exit_code
        if code == 0:
            return "exit 0"
        if self.killed_by:
            return f"killed: {self.killed_by}"
        if ev.get("oom_kills"):
            return f"OOM kill: the memory limit ({self.spec.memory_mb} MiB) was reached"
        if self.extra.get("workspace_full"):
            return f"workspace full (ENOSPC at {self.spec.workspace_mb} MiB)"
        if ev.get("pids_max_hits"):
            return f"pids limit ({self.spec.pids_max}) reached {ev['pids_max_hits']} time(s)"
        if code is not None and (code < 0 or code > 128):
            sig = -code if code < 0 else code - 128
            try:
                return f"signal {signal.Signals(sig).name}"
            except ValueError:
                return f"exit {code}"
        return f"exit {code}"

    def describe(self) -> dict:
        return {"sandbox_id": self.spec.sandbox_id, "task_id": self.spec.task_id,
                "attempt": self.spec.attempt, "state": self.state.value, "pid": self.pid,
                "exit_code": self.exit_code, "started_at": self.started_at, "ended_at": self.ended_at,
                "start_ms": self.start_ms, "killed_by": self.killed_by, "cause": self.cause(),
                "events": self.extra.get("events", {}), "history": self.life.history,
                **({"outlived": self.extra["outlived"]} if self.extra.get("outlived") is not None else {}),
                **({"harness_part": self.extra["harness_part"]} if self.extra.get("harness_part") else {}),
                **({"disk": self.extra["disk"]} if self.extra.get("disk") else {})}
