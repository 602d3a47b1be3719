"""The sandbox host: one async actor per node that owns many sandboxes.

It starts an attempt's sandbox, renews the attempt's lease from the moment the attempt reaches the host until it
ends (`leases`), kills sandboxes on request (faults), and sweeps sandboxes that carry a wave's marker but hold no
active lease (`sweep`). `SandboxHost` is a thin shell, a plain class composed of the rooms of fleet/host/;
`start_host_actor` makes it remote at the edge (its process title stays `ray::SandboxHost`).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from fleet import cgroups
from fleet.backends import Backends
from fleet.host.leases import LeaseRenewer
from fleet.host.nodedir import NodeDir, read_log
from fleet.host.relay import PROBE_PATHS, RelayWatch, probe_head
from fleet.host.sweep import NodeSweep
from fleet.host.volumes import VolumeKeeper
from fleet.host.watches import Watches
from fleet.host.workspace_io import BALLAST, fill, write_in_workspace
from fleet.records import AttemptResult, Lease
from fleet.sandbox import SandboxBackend, SandboxError, SandboxSpec


class SandboxHost:
    """Per-sandbox calls (`started`, `kill`, `notify`, ...) name the sandbox by its key, `<wave>/<sandbox>`
    (SandboxSpec.key): the driver's `WaveHost` makes it from the sandbox id."""

    def __init__(self, node_id: str, backend: SandboxBackend | None = None, ledger: Any = None):
        self.node_id = node_id
        self.backend = backend or Backends()
        self.ledger = ledger
        self.ended: set[str] = set()  # keys (SandboxSpec.key) of sandboxes whose run_attempt returned (started or not)
        self.cancelled_waves: set[str] = set()
        self.closing = False
        self.in_flight = 0
        self.leases = LeaseRenewer(self)  # the leases held, renewed in one batch per tick
        self.relay = RelayWatch(self)  # the compiled sandbox relay still answers
        self.node_dir = NodeDir(self)  # this host's own dir on its node (remote attempts)
        self.volumes = VolumeKeeper(self)  # the tasks' kept volumes
        self.watches = Watches(self)  # kills at a disk boundary or a named window
        self.node_sweep = NodeSweep(self)  # sandboxes no lease covers, and the sweep actor's scans

    @property
    def held(self) -> dict[str, dict]:
        """Sandbox key -> the lease it runs under (renewed by `leases`)."""
        return self.leases.held

    @property
    def renew_stats(self) -> dict:
        return self.leases.stats

    @property
    def _renewer(self) -> asyncio.Task | None:
        return self.leases.task

    @property
    def _relay_watch(self) -> asyncio.Task | None:
        return self.relay.task

    async def ping(self) -> str:
        return self.node_id

    async def join_harness(self) -> dict:
        """Move this host process into the harness's own cgroup (a sibling of the sandboxes')."""
        self._harness_cg = cgroups.join_harness(f"host-{self.node_id}-{os.getpid()}")
        return {"pid": os.getpid(), "cgroup": str(self._harness_cg)}

    async def run_attempt(self, spec: SandboxSpec, lease: Lease | None, ttl_s: float, capture: str | None = None,
                          arms: list | None = None) -> AttemptResult:
        """Run one attempt to its end; returns the sandbox's description (exit code, timings, history).

        When the runner exits 0 and `capture` names a workspace directory, its files are read back
        (before the workspace is removed) and returned as `artifact`. `arms` are watches that start with the
        sandbox (PK5's `{"kind": "checkpoints", "nth", "window", "reason"}`); what each saw is returned under
        `watches`, keyed by its reason.
        """
        sspec = spec if isinstance(spec, SandboxSpec) else SandboxSpec(**spec)  # (or its fields as a dict)
        if sspec.volume:  # a kept disk: the task's volume, on this node, at a path of this host's own
            sspec = dataclasses.replace(sspec, workspace_dir=str(self.volumes.dir(sspec.wave_id, sspec.volume)))
        try:
            if sspec.remote:
                try:
                    sspec = await asyncio.to_thread(self.node_dir.localize, sspec)
                except (OSError, RuntimeError) as exc:
                    return AttemptResult.of({"sandbox_id": sspec.sandbox_id, "exit_code": None, "node": self.node_id,
                                             "start_error": f"node {self.node_id} could not prepare the attempt: "
                                                            f"{str(exc)[:300]}"})
            if sspec.wave_id in self.cancelled_waves:
                return AttemptResult.of({"sandbox_id": sspec.sandbox_id, "exit_code": None, "error": "wave cancelled",
                                         "node": self.node_id})
            missing = self.backend.command_problem(sspec)
            if missing:
                return AttemptResult.of({"sandbox_id": sspec.sandbox_id, "exit_code": None, "start_error": missing,
                                         "node": self.node_id})
            self.in_flight += 1
            try:
                out = await self._run(sspec, lease, ttl_s, capture, arms or [])
            finally:
                self.in_flight -= 1
            if sspec.remote:
                out["log"] = await asyncio.to_thread(read_log, sspec.log_path)
            return AttemptResult.of(out)
        finally:
            self.ended.add(sspec.key)
            if sspec.remote:
                await asyncio.to_thread(self.node_dir.forget, sspec)

    async def _run(self, sspec: SandboxSpec, lease: Lease | None, ttl_s: float, capture: str | None,
                   arms: list) -> dict:
        # the lease is renewed from now on, not from when the sandbox is up (starting can take seconds under load)
        held = self.leases.hold(sspec.key, lease, ttl_s) if self.ledger is not None and lease else None
        self.relay.ensure()
        artifact = disk_ops = None
        watches: dict = {}
        disk_arms = [a for a in arms if a.get("kind") == "disk"]
        if disk_arms:  # armed on the lazy layer before the runner can reach them (fleet/sandbox/workspace.py)
            from fleet import sandbox as sandbox_mod

            sandbox_mod.PENDING_ARMS[sspec.workspace] = [(a["op"], int(a["nth"])) for a in disk_arms]
        try:
            try:
                sb = await self.backend.start(sspec)
            except Exception as exc:  # noqa: BLE001 - the backend cannot make this sandbox (no docker engine, an
                # image without a shell, ...): a start error in one line, never a traceback blamed on the runner
                why = str(exc) if isinstance(exc, SandboxError) else f"{type(exc).__name__}: {str(exc)[:300]}"
                out = {"sandbox_id": sspec.sandbox_id, "exit_code": None, "start_error": why, "node": self.node_id}
                if getattr(exc, "harness_part", None):  # the engine, not the runner: a harness fault
                    out["harness_part"] = exc.harness_part
                return out
            watches = {a["reason"]: asyncio.create_task(self.watch_checkpoints(sspec.key, a["nth"],
                                                                               a["window"], a["reason"]))
                       for a in arms if a.get("kind") == "checkpoints"}
            watches.update({a["reason"]: asyncio.create_task(self.watch_disk(sspec.key, a["op"], int(a["nth"]),
                                                                             a["reason"])) for a in disk_arms})
            try:
                if held is not None:
                    held["sb"] = sb
                if held is not None and held["refused"]:
                    await self.backend.kill(sb, 0.0, reason="fenced: lease renewal refused")
                elif sspec.wave_id in self.cancelled_waves or self.closing:  # cancelled while it was starting
                    await self.backend.kill(sb, 0.0, reason="wave cancelled")
                await self.backend.wait(sb)
                watched = await asyncio.gather(*watches.values(), return_exceptions=True)  # each ends with it
                watches = {r: w if isinstance(w, dict) else {"fired": False, "seen": 0,
                                                            "error": f"{type(w).__name__}: {str(w)[:300]}"}
                           for r, w in zip(watches, watched)}
                self.held.pop(sspec.key, None)
                if sspec.volume_lazy:  # what the lazy layer counted on the volume so far (boundary enumeration)
                    disk_ops = await asyncio.to_thread(VolumeKeeper.disk_ops, sspec.workspace)
                if capture and sb.exit_code == 0:
                    artifact = await self.backend.collect(sb, capture)
            finally:
                for t in watches.values():
                    if isinstance(t, asyncio.Task):
                        t.cancel()
                await self.backend.remove(sb)
        finally:
            if held is not None and self.held.get(sspec.key) is held:
                self.held.pop(sspec.key, None)
        out = sb.describe()
        if artifact is not None:
            out["artifact"] = artifact
        if watches:
            out["watches"] = watches
        if disk_ops is not None:
            out["disk_ops"] = disk_ops
        out["node"] = self.node_id
        return out

    async def started(self, key: str, timeout_s: float = 30.0) -> bool:
        """Wait (bounded) until the sandbox's runner is running (a container can take seconds to start; the
        attempt's own call may not have reached this host yet: Ray does not order an async actor's calls);
        False if it ended or never came up."""
        from fleet.lifecycle import SandboxState

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            sb = self.backend.sandboxes.get(key)
            if sb is None and key not in self.ended:  # not here yet
                await asyncio.sleep(0.01)
                continue
            if sb is None or sb.exit_code is not None or sb.state not in (SandboxState.CREATED,):
                return sb is not None and sb.exit_code is None and sb.state in (SandboxState.RUNNING,
                                                                                  SandboxState.FROZEN)
            await asyncio.sleep(0.01)
        return False

    async def kill(self, key: str, grace_s: float = 0.0, reason: str = "kill") -> dict:
        await self.started(key)  # a fault aimed at a sandbox still starting lands once it runs
        sb = self.backend.sandboxes.get(key)
        if sb is None:
            return {"applied": False, "why": f"sandbox {key} is not running on {self.node_id}"}
        before = sb.state.value
        t = time.time()
        killed = await self.backend.kill(sb, grace_s, reason=reason)
        # Applied only if the sandbox then ended by this kill, not by finishing on its own meanwhile.
        deadline = time.monotonic() + grace_s + 10
        while sb.exit_code is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        why = ""
        stop = sb.extra.get("stop") or {}
        # a notice (SIGTERM with a grace) that reached the runner is delivered whatever it then does: an exit 0 in
        # the grace is the runner's answer to it, not a kill that missed
        noticed = grace_s > 0 and stop.get("sigterm_at") is not None
        if not killed:
            why = f"sandbox was {before}"
        elif sb.exit_code == 0 and not noticed:
            killed, why = False, "the runner exited 0 before the kill landed"
        elif sb.exit_code is None:
            killed, why = None, "kill sent; the sandbox had not ended 10 s later"
        # applied: True, False, or None when it is not known
        return {"applied": killed, "state_before": before, "pid": sb.pid, "at": t, "node": self.node_id,
                "exit_code": sb.exit_code, "why": why, "sigterm_at": stop.get("sigterm_at"),
                "sigkill": stop.get("sigkill"), "ended_at": sb.ended_at}

    async def notify(self, key: str, notice: dict) -> dict:
        """PK2: write a spot-interruption notice to `$SANDFLEET_NOTICE` (`.sandfleet/notice` in the workspace),
        the way a cloud's metadata service announces one. The workspace is the runner's: no link is followed."""
        await self.started(key)
        sb = self.backend.sandboxes.get(key)
        if sb is None:
            return {"written": False, "why": f"sandbox {key} is not running on {self.node_id}"}
        try:
            await asyncio.to_thread(write_in_workspace, sb.spec.workspace, ".sandfleet", "notice",
                                    (json.dumps(notice) + "\n").encode())
        except OSError as exc:
            return {"written": False, "why": f"could not write the notice: {exc}"}
        return {"written": True, "at": time.time()}

    async def freeze_attempt(self, key: str) -> dict:
        """PK6: freeze every process of the sandbox (cgroup freezer) and stop renewing its lease, as if its
        machine had stalled: the lease runs out and the driver gives the task to a new attempt."""
        await self.started(key)
        sb = self.backend.sandboxes.get(key)
        if sb is None:
            return {"applied": False, "why": f"sandbox {key} is not running on {self.node_id}"}
        held = self.held.pop(key, None)  # no more renewals for it
        ok = await self.backend.freeze(sb)
        if not ok:
            if held is not None:
                self.held[key] = held
            return {"applied": False, "why": f"sandbox {key} could not be frozen (state {sb.state.value})"}
        return {"applied": True, "at": time.time(), "renewal_stopped": held is not None, "node": self.node_id}

    async def thaw_attempt(self, key: str) -> dict:
        sb = self.backend.sandboxes.get(key)
        if sb is None:
            return {"thawed": False, "why": f"sandbox {key} is not running on {self.node_id}"}
        return {"thawed": await self.backend.thaw(sb), "at": time.time()}

    async def is_running(self, key: str) -> bool:
        sb = self.backend.sandboxes.get(key)
        return sb is not None and sb.exit_code is None

    async def terminate(self, key: str) -> dict:
        """SIGTERM to the sandbox's init (tini forwards it to the runner's process group); no kill follows."""
        sb = self.backend.sandboxes.get(key)
        if sb is None:
            return {"sent": False, "why": f"sandbox {key} is not running on {self.node_id}"}
        return {"sent": await self.backend.terminate(sb)}

    async def fill_workspace(self, key: str) -> dict:
        """DF1: fill the sandbox's workspace tmpfs with a ballast file (the runner meets a real ENOSPC)."""
        await self.started(key)
        sb = self.backend.sandboxes.get(key)
        if sb is None:
            return {"applied": False, "why": f"sandbox {key} is not running on {self.node_id}"}
        try:
            written = await asyncio.to_thread(fill, sb.spec.workspace)
        except OSError as exc:
            return {"applied": False, "why": f"could not place the ballast: {exc}"}
        st = os.statvfs(sb.spec.workspace)
        return {"applied": True, "at": time.time(), "ballast_bytes": written,
                "free_bytes": st.f_bavail * st.f_frsize}

    async def drain_workspace(self, key: str) -> dict:
        """DF1 clear: remove the ballast (space returns); a sandbox that ended took its workspace with it."""
        sb = self.backend.sandboxes.get(key)
        if sb is None:
            return {"removed": False, "why": "the sandbox ended (its workspace went with it)"}
        try:
            fd = os.open(sb.spec.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.unlink(BALLAST, dir_fd=fd)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return {"removed": False, "why": "the ballast was gone (the runner removed it)"}
        except OSError as exc:
            return {"removed": False, "why": str(exc)}
        return {"removed": True, "at": time.time()}

    async def running(self) -> list[str]:
        return sorted(self.backend.sandboxes)

    async def load(self) -> dict:
        """Runnable tasks where this host runs (`procs_running` of /proc/stat, less this call's own thread) and
        its cores: the wave samples each node's, and the grader reads a silent attempt's by its node."""
        line = next(x for x in Path("/proc/stat").read_text().splitlines() if x.startswith("procs_running"))
        return {"t": round(time.time(), 3), "running": int(line.split()[1]) - 1, "cores": os.cpu_count() or 1,
                "node": self.node_id}

    async def cancel_wave(self, wave_id: str, timeout_s: float = 20.0, engine_lost: str | None = None) -> int:
        """Stop every attempt of a wave: none starts any more, running ones are killed, and this returns
        once they are all removed (bounded). `engine_lost`: the driver found the docker engine gone, so its
        containers are ended by pid at once."""
        self.cancelled_waves.add(wave_id)
        if engine_lost and "docker" in self.backend.by_name:
            self.backend.by_name["docker"].engine_lost = engine_lost
            self.backend.by_name["docker"].engine_lost_by_driver = True
        mine = [sb for sb in self.backend.sandboxes.values() if sb.spec.wave_id == wave_id]
        await asyncio.gather(*(self.backend.kill(sb, 0.0, reason="wave cancelled") for sb in mine))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(sb.spec.wave_id == wave_id
                                                  for sb in self.backend.sandboxes.values()):
            await asyncio.sleep(0.02)
        return len(mine)

    async def shutdown(self, grace_s: float = 1.0, timeout_s: float = 20.0) -> int:
        """Kill every sandbox and wait until each is removed (cgroups, mounts), so nothing outlives the host."""
        self.closing = True
        n = sum(await asyncio.gather(*(self.backend.kill(sb, grace_s, reason="host shutdown")
                                       for sb in list(self.backend.sandboxes.values()))))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (self.backend.sandboxes or self.in_flight):
            await asyncio.sleep(0.02)
        for sb in list(self.backend.sandboxes.values()):  # whatever did not go by itself
            await self.backend.remove(sb)
        if getattr(self.backend, "hollow", False):
            await self.backend.close()
        from fleet import netns

        await asyncio.to_thread(netns.stop_forwarder, True)  # its relay child shares the cgroup it leaves
        cgroups.leave_harness(getattr(self, "_harness_cg", None))
        self._harness_cg = None
        await asyncio.to_thread(self.volumes.drop)  # (never rmtree into a mounted volume)
        await asyncio.to_thread(shutil.rmtree, self.home(), True)
        return n

    # -- the composed rooms, as the actor's remote methods ---------------------------------------------------------

    async def renewals(self) -> dict:
        return dict(self.renew_stats, held=len(self.held))

    def home(self, wave_id: str | None = None) -> Path:
        """This host's own dir on its node (`/tmp/sandfleet-host-<node>/`; fleet/host/nodedir.py)."""
        return self.node_dir.home(wave_id)

    async def logs_since(self, offsets: dict[str, int]) -> dict[str, bytes]:
        """What each remote attempt's runner log (by sandbox key) holds past the offset the driver has: the driver
        pulls it while the attempt runs (cluster/wave/logstream.py), so a harness fault loses at most one pull's
        worth. Bounded as the log is (LOG_CAP in all); an attempt whose state is gone from here gives nothing."""
        return await asyncio.to_thread(self.node_dir.logs_since, offsets)

    async def publish_credentials(self, wave_id: str, sandbox_id: str, access_key: str, secret_key: str) -> bool:
        return await self.node_dir.publish_credentials(wave_id, sandbox_id, access_key, secret_key)

    async def stage_code(self, digest: str, data: bytes) -> dict:
        return await self.node_dir.stage_code(digest, data)

    async def drop_wave(self, wave_id: str) -> None:
        await self.node_dir.drop_wave(wave_id)

    async def missing_paths(self, paths: list[str]) -> list[str]:
        """Which of the paths a runner needs at the same path on every node (its interpreter, its venv) are not
        on this node."""
        return [p for p in paths if not os.path.exists(p)]

    async def watch_disk(self, key: str, op: str, nth: int, reason: str) -> dict:
        return await self.watches.disk(key, op, nth, reason)

    async def watch_checkpoints(self, key: str, nth: int, window: str, reason: str,
                                poll_s: float = 0.002) -> dict:
        return await self.watches.checkpoints(key, nth, window, reason, poll_s)

    async def sweep(self, wave_id: str, live_sandbox_ids: list[str]) -> dict:
        return await self.node_sweep.sweep(wave_id, live_sandbox_ids)

    async def scan_markers(self, wave_ids: list[str], engine_lost: str | None = None) -> dict:
        return await self.node_sweep.scan_markers(wave_ids, engine_lost)

    async def reap_marked(self, wave_id: str, sandbox_id: str) -> dict:
        return await self.node_sweep.reap_marked(wave_id, sandbox_id)

    PROBE_PATHS = PROBE_PATHS

    async def probe_head(self, targets: dict[str, str], token: str, timeout_s: float) -> dict[str, str | None]:
        """From this node, each of the head's services through its gate (fleet/host/relay.py `probe_head`)."""
        return await probe_head(targets, token, timeout_s, self.PROBE_PATHS)

    async def detach_volume(self, wave_id: str, sandbox_id: str, task_id: str) -> dict:
        return await self.volumes.detach(wave_id, sandbox_id, task_id)

    async def drop_volume(self, wave_id: str, task_id: str) -> dict:
        """The task ended: its kept volume goes (a tmpfs: its memory comes back)."""
        got = await asyncio.to_thread(self.volumes.drop, wave_id, task_id)
        return {"node": self.node_id, "dropped": got}


# calls a host takes at once (Ray's async actor default is 1,000): every attempt on the node holds one for its life
# (run_attempt), and its faults' watches, kills, the renewals and the volume drops need theirs beside them. A wave
# may place every one of its sandboxes on one node: `concurrency` tasks (at most 10,000) and as many references.
CALLS_AT_ONCE = 2 * 10000 + 1000


def start_host_actor(node_id: str, ledger, resources: dict | None = None, strategy=None, name: str | None = None,
                     hollow: bool = False):
    """`hollow`: the scale bench's stand-in node (fleet/hollow.py), never a product mode."""
    import ray

    if not node_id:
        raise ValueError("node_id must be a non-empty string")
    from fleet.ledger import actor_options

    cls = ray.remote(HollowHost if hollow else SandboxHost)
    return cls.options(**actor_options(CALLS_AT_ONCE, name, resources, strategy)).remote(node_id, None, ledger)


class HollowHost(SandboxHost):
    """A real sandbox host whose sandboxes are hollow (fleet/hollow.py): the scale bench's node stand-in."""

    def __init__(self, node_id: str, backend: SandboxBackend | None = None, ledger: Any = None):
        from fleet.hollow import HollowBackend

        super().__init__(node_id, backend or HollowBackend(), ledger)
