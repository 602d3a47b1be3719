"""The sandbox host: one async actor per node that owns many sandboxes.

It starts an attempt's sandbox, renews the attempt's lease from the moment the
attempt reaches the host until it ends (one batched ledger call per tick for every
lease the host holds, so renewals do not wait for a sandbox to start nor grow with
load; a refused renewal means the attempt was fenced: the sandbox is killed),
kills sandboxes on request (faults), and sweeps sandboxes that carry a wave's
marker but hold no active lease. `SandboxHost` is a plain class; `start_host_actor`
makes it remote at the edge.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import stat
import time
from pathlib import Path
from typing import Any

from fleet import cgroups
from fleet.backends import Backends, reap_leftover
from fleet.hostdirs import record_owner
from fleet.markers import ATTEMPT_CREDENTIALS
from fleet.records import AttemptResult, Lease
from fleet.sandbox import RUNNER_LOG, SANDBOX_UID, SandboxBackend, SandboxError, SandboxSpec, sandbox_key


def awaitable(ref):
    """A Ray ObjectRef as a plain asyncio future (cancelled at once by wait_for); anything else as is. An error
    that reaches it after its waiter gave up (a wave stopped; an actor that died later) is never printed as "Future
    exception was never retrieved": whoever awaits it still gets the error."""
    if not hasattr(ref, "future"):
        return ref
    fut = asyncio.wrap_future(ref.future())
    fut.add_done_callback(_retrieved)
    return fut


def _retrieved(fut) -> None:
    if not fut.cancelled():
        fut.exception()


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
        self.held: dict[str, dict] = {}  # sandbox key -> the lease it runs under (renewed by _renew_all)
        self._renewer: asyncio.Task | None = None
        self._relay_watch: asyncio.Task | None = None
        self.renew_stats = {"ticks": 0, "renewed": 0, "refused": 0, "errors": 0, "late_max_s": 0.0}

    async def ping(self) -> str:
        return self.node_id

    async def join_harness(self) -> dict:
        """Move this host process into the harness's own cgroup (a sibling of the sandboxes')."""
        self._harness_cg = cgroups.join_harness(f"host-{self.node_id}-{os.getpid()}")
        return {"pid": os.getpid(), "cgroup": str(self._harness_cg)}

    async def _renew_all(self) -> None:
        """Every tick (a quarter of the shortest TTL held), renew all held leases in one ledger call."""
        while self.held:
            tick = min(h["ttl"] for h in self.held.values()) / 4
            due = time.monotonic() + tick
            await asyncio.sleep(tick)
            self.renew_stats["late_max_s"] = max(self.renew_stats["late_max_s"], round(time.monotonic() - due, 3))
            batch = list(self.held.items())
            if not batch:
                continue
            self.renew_stats["ticks"] += 1
            try:
                res = await asyncio.wait_for(awaitable(self.ledger.renew_many.remote(
                    [(h["task_id"], h["fence"], h["version"], h["ttl"], h["holder"]) for _, h in batch])),
                    max(1.0, tick * 2))
            except Exception:  # noqa: BLE001 - slow or lost ledger: leases run on until expiry; retry next tick.
                # The ledger may still apply this batch after we stopped waiting: the next one names the holder,
                # so the ledger renews a lease whose version moved on by our own renewal instead of fencing it.
                self.renew_stats["errors"] += 1
                continue
            for (sid, h), (ok, version) in zip(batch, res):
                if self.held.get(sid) is not h:
                    continue  # the attempt ended meanwhile
                if ok:
                    h["version"] = version
                    self.renew_stats["renewed"] += 1
                    continue
                self.renew_stats["refused"] += 1
                h["refused"] = True
                self.held.pop(sid, None)
                if h["sb"] is not None:
                    asyncio.create_task(self.backend.kill(h["sb"], 0.0, reason="fenced: lease renewal refused"))
        self._renewer = None

    def _hold(self, key: str, lease: Lease, ttl_s: float) -> dict:
        h = {"task_id": lease.task_id, "fence": lease.fence, "version": lease.version, "ttl": ttl_s,
             "holder": lease.holder, "sb": None, "refused": False}
        self.held[key] = h
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew_all())
        return h

    async def renewals(self) -> dict:
        return dict(self.renew_stats, held=len(self.held))

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
            sspec = dataclasses.replace(sspec, workspace_dir=str(self._volume_dir(sspec.wave_id, sspec.volume)))
        try:
            if sspec.remote:
                try:
                    sspec = await asyncio.to_thread(self._localize, sspec)
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
                out["log"] = await asyncio.to_thread(_read_log, sspec.log_path)
            return AttemptResult.of(out)
        finally:
            self.ended.add(sspec.key)
            if sspec.remote:
                await asyncio.to_thread(self._forget, sspec)

    # -- a driver on another machine: nothing it sends is a path here ----------------------------------------------

    def home(self, wave_id: str | None = None) -> Path:
        """This host's own dir on its node (`/tmp/sandfleet-host-<node>/`): staged code, and per wave its
        sandboxes' state, workspaces' mount points and credentials."""
        base = Path(f"/tmp/sandfleet-host-{self.node_id}")
        return base / wave_id if wave_id else base

    def _localize(self, spec: SandboxSpec) -> SandboxSpec:
        from storage.credentials import CredentialSource, Credentials

        base = self.home(spec.wave_id)
        record_owner(self.home())  # (the sweep on this node tells a dead host's dir by it)
        base.mkdir(mode=0o711, exist_ok=True)
        sdir = base / "sandboxes" / spec.sandbox_id
        sdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        ro_mounts, ro_binds = dict(spec.ro_mounts), list(spec.ro_binds)
        if spec.credentials is not None:
            c = spec.credentials
            cdir = base / "creds" / spec.sandbox_id
            cdir.mkdir(parents=True, exist_ok=True, mode=0o755)
            src = CredentialSource(cdir / ATTEMPT_CREDENTIALS)
            src.publish(Credentials(c["access_key"], c["secret_key"]), owner_uid=SANDBOX_UID)
            src.write_aws_config(cdir / "aws-config", c.get("region", "us-east-1"),
                                 source_path=f"{c['mount']}/{ATTEMPT_CREDENTIALS}")
            ro_mounts[str(cdir)] = c["mount"]
        if spec.code is not None:
            staged = self.home() / "code" / spec.code["digest"]
            if not staged.is_dir():
                raise RuntimeError(f"the runner's code {spec.code['digest'][:12]} was not staged on this node")
            ro_mounts[str(staged)] = spec.code["path"]
            inside = spec.code["path"].rstrip("/") + "/"
            # what the snapshot left out (a venv, fleet/codeship.py) is this node's own, at the same path, mounted
            # over the shipped code (its place there is an empty dir: the mount point a read-only copy cannot make)
            for b in [*ro_binds, *spec.code.get("envs", ())]:
                place = staged / b[len(inside):]
                if (b.startswith(inside) and os.path.isdir(b)
                        and (not place.exists() or (place.is_dir() and not any(place.iterdir())))):
                    ro_mounts[b] = b
            ro_binds = [b for b in ro_binds if b != spec.code["path"] and not b.startswith(inside)]
        # this host's own dir (every attempt's credentials on this node) is never shown, whatever a bind covers
        hide = list(spec.hide) + [str(self.home())] * any(
            str(self.home()).startswith(b.rstrip("/") + "/") for b in ro_binds)
        ws = spec.workspace_dir if spec.volume else str(base / "ws" / spec.sandbox_id)  # (a kept volume: its own)
        return dataclasses.replace(spec, state_dir=str(sdir), workspace_dir=ws,
                                   ro_mounts=ro_mounts, ro_binds=ro_binds, hide=hide, credentials=None)

    def _forget(self, spec: SandboxSpec) -> None:
        """A remote attempt ended: its credentials and its state go from this node (its log went to the driver)."""
        base = self.home(spec.wave_id)
        for d in (base / "creds" / spec.sandbox_id, base / "sandboxes" / spec.sandbox_id):
            shutil.rmtree(d, ignore_errors=True)
        try:
            (base / "ws" / spec.sandbox_id).rmdir()
        except OSError:
            pass

    async def logs_since(self, offsets: dict[str, int]) -> dict[str, bytes]:
        """What each remote attempt's runner log (by sandbox key) holds past the offset the driver has: the driver
        pulls it while the attempt runs (cluster/wave/logstream.py), so a harness fault loses at most one pull's
        worth. Bounded as the log is (LOG_CAP in all); an attempt whose state is gone from here gives nothing."""
        return await asyncio.to_thread(self._logs_since, offsets)

    def _logs_since(self, offsets: dict[str, int]) -> dict[str, bytes]:
        out = {}
        for key, have in offsets.items():
            wave_id, _, sid = str(key).partition("/")
            if not (_NAME.fullmatch(wave_id) and _NAME.fullmatch(sid)) or not 0 <= int(have) < LOG_CAP:
                continue
            sb = self.backend.sandboxes.get(key)
            path = sb.spec.log_path if sb is not None else str(self.home(wave_id) / "sandboxes" / sid / RUNNER_LOG)
            if not path.startswith(str(self.home()) + "/"):  # (a local attempt's log is the driver's own file)
                continue
            try:
                with open(path, "rb") as f:
                    f.seek(int(have))
                    data = f.read(LOG_CAP - int(have))
            except OSError:
                continue
            if data:
                out[key] = data
        return out

    async def publish_credentials(self, wave_id: str, sandbox_id: str, access_key: str, secret_key: str) -> bool:
        """CR1 on a remote attempt: its rotated key, published where its credential_process reads it. False when
        the attempt ended meanwhile (its credentials dir is gone)."""
        from storage.credentials import CredentialSource, Credentials

        cdir = self.home(wave_id) / "creds" / sandbox_id
        if not cdir.is_dir():
            return False
        src = CredentialSource(cdir / ATTEMPT_CREDENTIALS)
        await asyncio.to_thread(src.publish, Credentials(access_key, secret_key), SANDBOX_UID)
        return True

    async def stage_code(self, digest: str, data: bytes) -> dict:
        """Unpack the runner's snapshot here and check its digest (fleet/codeship.py)."""
        from fleet.codeship import ShipError, unpack

        record_owner(self.home())
        (self.home() / "code").mkdir(mode=0o711, exist_ok=True)
        try:
            path = await asyncio.to_thread(unpack, data, str(self.home() / "code" / digest), digest)
        except (ShipError, OSError, ValueError) as exc:
            return {"node": self.node_id, "ok": False, "why": str(exc)[:300]}
        return {"node": self.node_id, "ok": True, "path": path, "digest": digest}

    async def missing_paths(self, paths: list[str]) -> list[str]:
        """Which of the paths a runner needs at the same path on every node (its interpreter, its venv) are not
        on this node."""
        return [p for p in paths if not os.path.exists(p)]

    async def drop_wave(self, wave_id: str) -> None:
        """The wave's dir on this node goes (what its ended attempts left)."""
        await asyncio.to_thread(shutil.rmtree, self.home(wave_id), True)

    async def _watch_relay(self) -> None:
        """While sandboxes run here: the compiled relay their loopback listeners were handed to (fleet/netns.py)
        still answers, or every sandbox it relayed has lost its network and is ended as the harness's fault
        (`harness_part`: the wave ends on it, and no runner is blamed). A dead or hung relay is replaced for the
        sandboxes that start after."""
        from fleet import netns

        try:
            while self.backend.sandboxes or self.in_flight:
                await asyncio.sleep(RELAY_CHECK_S)
                lost = await asyncio.to_thread(netns.forwarder_lost, RELAY_ANSWER_S)
                if lost is None:
                    continue
                fwd, why = lost
                part = f"sandbox relay {self.node_id}"
                for key, sb in list(self.backend.sandboxes.items()):
                    if self.backend.relayed_by(key) is fwd:
                        sb.extra["harness_part"] = part
                        asyncio.create_task(self.backend.kill(sb, 0.0, reason=f"{part} lost: {why}"))
        finally:
            self._relay_watch = None

    async def _run(self, sspec: SandboxSpec, lease: Lease | None, ttl_s: float, capture: str | None,
                   arms: list) -> dict:
        # the lease is renewed from now on, not from when the sandbox is up (starting can take seconds under load)
        held = self._hold(sspec.key, lease, ttl_s) if self.ledger is not None and lease else None
        if self._relay_watch is None:
            self._relay_watch = asyncio.create_task(self._watch_relay())
        artifact = disk_ops = None
        watches: dict = {}
        disk_arms = [a for a in arms if a.get("kind") == "disk"]
        if disk_arms:  # armed on the lazy layer before the runner can reach them (fleet/sandbox.py)
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
                    disk_ops = await asyncio.to_thread(self._disk_ops, sspec.workspace)
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

    @staticmethod
    def _disk_ops(workspace: str) -> dict | None:
        from fleet.sandbox import lazy_of

        lazy = lazy_of(workspace)
        try:
            return dict(lazy.stats()["boundaries"]) if lazy is not None else None
        except Exception:  # noqa: BLE001 - a lost layer is found by its own check (alive); no count then
            return None

    async def watch_disk(self, key: str, op: str, nth: int, reason: str) -> dict:
        """Kill the sandbox while its runner's `nth` disk `op` (write, fsync, rename; counted over the volume's life)
        is held by the lazy file system, then let the held call go: a kill in the middle of a journal append, on
        every run (DCP-2.0's SENTINEL_WRITE). {"fired": True, ...kill, "disk_path"}, or {"fired": False, "seen": 0}
        when the sandbox ended first (the count is the volume's: the next attempt goes on from it)."""
        from fleet.sandbox import lazy_of

        await self.started(key)
        sb = self.backend.sandboxes.get(key)
        lazy = lazy_of(sb.spec.workspace) if sb is not None else None
        if lazy is None:
            return {"fired": False, "seen": 0, "error": "no lazy volume to watch (not a crash-mode disk)"}
        while sb.exit_code is None and sb.state.value in ("starting", "running", "frozen", "created"):
            reached = await asyncio.to_thread(lazy.wait, op, nth, 0.25)
            if reached:
                # SIGKILL every process of the sandbox while the call is held, and only then let the call go: the
                # runner never gets past it (the backend's kill, which follows, may first try to freeze them)
                if sb.spec.backend == "process":
                    for pid in cgroups.SandboxCgroup(sb.spec.wave_id, sb.spec.sandbox_id).pids():
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                kill = asyncio.create_task(self.kill(key, 0.0, reason))
                await asyncio.sleep(0.02)
                await asyncio.to_thread(lazy.release, op, nth)
                out = await kill
                return {"fired": True, **out, "disk_path": str(reached.get("path"))[:300], "disk_op": op}
        return {"fired": False, "seen": 0}

    async def watch_checkpoints(self, key: str, nth: int, window: str, reason: str,
                                poll_s: float = 0.002) -> dict:
        """Kill the sandbox right after its runner announced its `nth` named window (a JSON line in the file
        `$SANDFLEET_CHECKPOINT` whose `name` starts with `window`). Returns {"fired": True, ...kill} or, when
        the sandbox ended first, {"fired": False, "seen": how many matching windows it announced}."""
        await self.started(key)  # armed before the attempt reached this host: wait for it
        sb = self.backend.sandboxes.get(key)
        if sb is None:
            return {"fired": False, "seen": 0}
        reader = CheckpointReader(sb.spec.workspace)
        seen = 0
        while sb.exit_code is None and sb.state.value in ("starting", "running", "frozen", "created"):
            for rec in reader.new_lines():
                name = rec.get("name") if isinstance(rec, dict) else None
                if isinstance(name, str) and name.startswith(window):
                    seen += 1
                    if seen >= nth:
                        out = await self.kill(key, 0.0, reason)
                        t_ann = rec.get("t")
                        ok = isinstance(t_ann, (int, float)) and not isinstance(t_ann, bool) and math.isfinite(t_ann) \
                            and abs(out["at"] - t_ann) < 3600
                        lag = round((out["at"] - t_ann) * 1000, 1) if ok else None
                        return {"fired": True, **out, "window_name": name[:200], "lag_ms": lag}
            await asyncio.sleep(poll_s)
        # what it announced between the last read and its end counts for the next attempt's N
        seen += sum(1 for rec in reader.new_lines()
                    if isinstance(rec, dict) and isinstance(rec.get("name"), str) and rec["name"].startswith(window))
        return {"fired": False, "seen": seen}

    async def notify(self, key: str, notice: dict) -> dict:
        """PK2: write a spot-interruption notice to `$SANDFLEET_NOTICE` (`.sandfleet/notice` in the workspace),
        the way a cloud's metadata service announces one. The workspace is the runner's: no link is followed."""
        await self.started(key)
        sb = self.backend.sandboxes.get(key)
        if sb is None:
            return {"written": False, "why": f"sandbox {key} is not running on {self.node_id}"}
        try:
            await asyncio.to_thread(_write_in_workspace, sb.spec.workspace, ".sandfleet", "notice",
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
            written = await asyncio.to_thread(_fill, sb.spec.workspace)
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

    async def sweep(self, wave_id: str, live_sandbox_ids: list[str]) -> dict:
        """Kill and remove every sandbox of `wave_id` on this node that no active lease covers."""
        live = set(live_sandbox_ids)
        hollow = getattr(self.backend, "hollow", False)  # (the scale bench's: fleet/hollow.py)
        found = [(wave_id, s) for s in self.backend.listing(wave_id)] if hollow else cgroups.list_sandboxes(wave_id)
        reaped = []
        for wid, sid in found:
            if sid in live:
                continue
            key = sandbox_key(wid, sid)
            sb = self.backend.sandboxes.get(key)
            if sb is not None:
                await self.backend.kill(sb, 0.0, reason="sweep: no active lease")
                deadline = time.monotonic() + 10  # the attempt's own run waits for it and removes it
                while key in self.backend.sandboxes and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                if key in self.backend.sandboxes and sb.exit_code is not None:
                    await self.backend.remove(sb)
                reaped.append({"wave_id": wid, "sandbox_id": sid, "pids": [sb.pid], "emptied": True,
                               "removed": True, "had_handle": True})
            elif hollow:
                reaped.append({"wave_id": wid, "sandbox_id": sid, "pids": [], "emptied": True, "removed": True,
                               "had_handle": False})
            else:
                rep = await asyncio.to_thread(reap_leftover, wid, sid)
                rep["had_handle"] = False
                reaped.append(rep)
        self.ended = {k for k in self.ended if not k.startswith(wave_id + "/")}  # (a fleet's host outlives waves)
        live_tasks = {sid.rpartition("-a")[0] for sid in live}  # (a sandbox id is <task>-a<attempt>)
        volumes = await asyncio.to_thread(self._drop_volumes_but, wave_id, live_tasks)
        return {"node": self.node_id, "found": [s for _, s in found], "live": sorted(live & {s for _, s in found}),
                "reaped": reaped, "volumes_dropped": volumes}

    def _drop_volumes_but(self, wave_id: str, keep: set[str]) -> list[str]:
        vol = self.home(wave_id) / "vol"
        return [t for d in sorted(vol.glob("*")) if vol.is_dir() and d.name not in keep
                and not d.name.endswith(".disk") for t in self._drop_volumes(wave_id, d.name)]

    async def load(self) -> dict:
        """Runnable tasks where this host runs (`procs_running` of /proc/stat, less this call's own thread) and
        its cores: the wave samples each node's, and the grader reads a silent attempt's by its node."""
        line = next(x for x in Path("/proc/stat").read_text().splitlines() if x.startswith("procs_running"))
        return {"t": round(time.time(), 3), "running": int(line.split()[1]) - 1, "cores": os.cpu_count() or 1,
                "node": self.node_id}

    PROBE_PATHS = {"s3": "/.sandfleet/health", "model": "/v1/models", "effects": "/"}  # (the proxy's: unlogged)

    async def probe_head(self, targets: dict[str, str], token: str, timeout_s: float) -> dict[str, str | None]:
        """From this node, each of the head's services through its gate, end to end as a sandbox's relay goes
        (`host:port/service`, the relay token line, then an HTTP request): service -> None (it answered) or why
        not. Run where the sandboxes are, so a broken node-to-head path is seen as that node's."""
        from fleet.gateway import preface

        async def one(service: str, target: str) -> str | None:
            addr, _, name = target.partition("/")
            host, _, port = addr.rpartition(":")
            w = None
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout_s)
                w.write(preface(token, name) + f"GET {self.PROBE_PATHS.get(service, '/')} HTTP/1.0\r\n"
                                               f"Host: {host}\r\n\r\n".encode())
                await w.drain()
                got = await asyncio.wait_for(r.read(1), timeout_s)
                return None if got else f"the gate at {addr} closed the {name} connection without an answer"
            except asyncio.TimeoutError:
                return f"no answer from the {name} service through the gate at {addr} within {timeout_s:g} s"
            except OSError as exc:
                return f"no connection to the gate at {addr} ({exc.strerror or exc})"
            finally:
                if w is not None:
                    w.close()

        got = await asyncio.gather(*(one(s, t) for s, t in targets.items()))
        return dict(zip(targets, got))

    async def scan_markers(self, wave_ids: list[str], engine_lost: str | None = None) -> dict:
        """The sweep actor's look at this node (its own /proc, mounts and cgroups): what carries the waves'
        markers here (fleet/sweeper.py `scan_here`)."""
        from fleet.sweeper import scan_here

        if getattr(self.backend, "hollow", False):  # the scale bench's hollow sandboxes answer from their table
            return dict(self.backend.scan(wave_ids), node=self.node_id)
        return dict(await asyncio.to_thread(scan_here, wave_ids, engine_lost), node=self.node_id)

    async def reap_marked(self, wave_id: str, sandbox_id: str) -> dict:
        """The sweep actor found this node's sandbox leaked: reap it here, by its markers (pids are this node's)."""
        from fleet.sweeper import reap_here

        if getattr(self.backend, "hollow", False):
            sb = self.backend.sandboxes.get(sandbox_key(wave_id, sandbox_id))
            killed = sb is not None and await self.backend.kill(sb, 0.0, reason="sweep: leaked")
            return {"wave_id": wave_id, "sandbox_id": sandbox_id, "pids": [], "emptied": True, "removed": True,
                    "killed": bool(killed)}
        return await asyncio.to_thread(reap_here, wave_id, sandbox_id)

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

    def _volume_dir(self, wave_id: str, task_id: str) -> Path:
        """Where a task's kept volume is mounted on this node (made with its parents, root's only)."""
        if "/" in task_id or task_id in ("", ".", "..") or "/" in wave_id:
            raise ValueError(f"not a task id: {task_id!r}")
        d = self.home(wave_id) / "vol"
        for x in (self.home(), self.home(wave_id), d):
            x.mkdir(mode=0o711, exist_ok=True)
        return d / task_id

    def _drop_volumes(self, wave_id: str | None = None, task_id: str | None = None) -> list[str]:
        """Unmount and remove kept volumes (one task's, a wave's, or every one on this node); returns their tasks."""
        from fleet.sandbox import release_volume

        dropped = []
        waves = [self.home(wave_id)] if wave_id else [d for d in self.home().glob("*") if d.is_dir()]
        for w in waves:
            vol = w / "vol"
            for d in sorted(vol.glob(task_id or "*")) if vol.is_dir() else []:
                if d.name.endswith(".disk"):  # a lazy volume's tmpfs: released with its mount point
                    continue
                release_volume(str(d))
                dropped.append(d.name)
        return dropped

    async def detach_volume(self, wave_id: str, sandbox_id: str, task_id: str) -> dict:
        """`move` (PK3): this node is about to be lost, and the task's volume is a network disk that outlives it. The
        sandbox is frozen (its runner writes nothing more; the node's loss then ends it), and the volume is read
        back as a tar that crosses to the driver through Ray, for the task's next attempt on another node:
        {"image", "files", "bytes", "stopped"}. SIGSTOP, not the cgroup freezer: the node's loss SIGKILLs them next,
        and a SIGKILL ends a stopped process where a frozen one would linger until thawed."""
        from fleet.sandbox import pack_volume

        sb = self.backend.sandboxes.get(sandbox_key(wave_id, sandbox_id))
        stopped: set[int] = set()
        if sb is not None and sb.spec.backend == "process":
            cg = cgroups.SandboxCgroup(wave_id, sandbox_id)
            for _ in range(3):  # (a child forked meanwhile is stopped on the next round)
                for pid in set(cg.pids()) - stopped:
                    try:
                        os.kill(pid, signal.SIGSTOP)
                        stopped.add(pid)
                    except ProcessLookupError:
                        pass
        path = self._volume_dir(wave_id, task_id)
        if not os.path.ismount(path):
            return {"image": None, "why": f"no volume of task {task_id} is mounted on {self.node_id}",
                    "stopped": len(stopped)}
        image, got = await asyncio.to_thread(pack_volume, str(path))
        return {"image": image, **got, "stopped": len(stopped), "node": self.node_id}

    async def drop_volume(self, wave_id: str, task_id: str) -> dict:
        """The task ended: its kept volume goes (a tmpfs: its memory comes back)."""
        got = await asyncio.to_thread(self._drop_volumes, wave_id, task_id)
        return {"node": self.node_id, "dropped": got}

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
        await asyncio.to_thread(self._drop_volumes)  # (never rmtree into a mounted volume)
        await asyncio.to_thread(shutil.rmtree, self.home(), True)
        return n


BALLAST = ".sandfleet-ballast"
RELAY_CHECK_S = 1.0  # how often a host asks its compiled sandbox relay whether it still serves
RELAY_ANSWER_S = 5.0  # and how long it waits for the answer before it calls the relay hung
LOG_CAP = 16 * 1024 * 1024 + 256  # the backends cap a runner's log at 16 MiB, then write one line saying so
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")  # a wave or sandbox id: one path component, never ..


def _read_log(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(LOG_CAP)
    except OSError:
        return None


def _write_in_workspace(workspace: str, subdir: str, name: str, data: bytes) -> None:
    """Write `data` to workspace/subdir/name as root without following any link the runner planted."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    ws = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            os.mkdir(subdir, 0o755, dir_fd=ws)
        except FileExistsError:
            pass
        d = os.open(subdir, flags, dir_fd=ws)
        try:
            tmp = f".{name}.{os.getpid()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=d)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=d, dst_dir_fd=d)
        finally:
            os.close(d)
    finally:
        os.close(ws)


def _fill(workspace: str) -> int:
    """Write a root-owned ballast into the workspace until the tmpfs is full; returns its size."""
    ws = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    written = 0
    try:
        fd = os.open(BALLAST, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=ws)
        try:
            for size in (1 << 20, 1 << 12, 1):
                block = b"\0" * size
                while True:
                    try:
                        n = os.write(fd, block)
                    except OSError as exc:
                        if exc.errno == 28:  # ENOSPC
                            break
                        raise
                    written += n
                    if n < size:
                        break
        finally:
            os.close(fd)
    finally:
        os.close(ws)
    return written


class CheckpointReader:
    """Reads the JSON lines a runner appends to its workspace's `.sandfleet/checkpoints`, as a hostile file:
    no link is followed (each path component is opened with O_NOFOLLOW from the workspace's fd), a
    non-regular file is ignored, at most 64 KiB is read per call and 1 MiB in all."""

    CAP = 1 << 20

    def __init__(self, workspace: str):
        self.workspace = workspace
        self.offset = 0
        self.partial = b""

    def _open(self) -> int | None:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            ws = os.open(self.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            d = os.open(".sandfleet", flags | os.O_DIRECTORY, dir_fd=ws)
            try:
                fd = os.open("checkpoints", flags, dir_fd=d)
            finally:
                os.close(d)
        except OSError:
            return None
        finally:
            os.close(ws)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def new_lines(self) -> list:
        if self.offset >= self.CAP:
            return []
        fd = self._open()
        if fd is None:
            return []
        try:
            data = os.pread(fd, min(65536, self.CAP - self.offset), self.offset)
        finally:
            os.close(fd)
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


PER_SANDBOX = frozenset({"started", "kill", "watch_checkpoints", "notify", "freeze_attempt", "thaw_attempt",
                         "is_running", "terminate", "fill_workspace", "drain_workspace"})


class WaveHost:
    """One wave's handle on a host actor that other waves may share (a `sandfleet up` fleet's): a per-sandbox call
    takes the wave's sandbox id and reaches the host with the sandbox's key, so a wave names only its own
    sandboxes. Every other call goes to the actor as it is."""

    __slots__ = ("actor", "wave_id")

    def __init__(self, actor, wave_id: str):
        self.actor, self.wave_id = actor, wave_id

    def __getattr__(self, name: str):
        method = getattr(self.actor, name)
        return _Keyed(method, self.wave_id) if name in PER_SANDBOX else method


class _Keyed:
    __slots__ = ("method", "wave_id")

    def __init__(self, method, wave_id: str):
        self.method, self.wave_id = method, wave_id

    def remote(self, sandbox_id: str, *args, **kwargs):
        return self.method.remote(sandbox_key(self.wave_id, sandbox_id), *args, **kwargs)


class WaveHosts:
    """The wave's view of the fleet's host list (by node index, as `fleet.node_ids`); a host the fleet replaced
    (a healed node) is seen at once."""

    def __init__(self, hosts: list, wave_id: str):
        self.hosts, self.wave_id = hosts, wave_id

    def __getitem__(self, i: int) -> WaveHost:
        return WaveHost(self.hosts[i], self.wave_id)

    def __len__(self) -> int:
        return len(self.hosts)

    def __iter__(self):
        return (WaveHost(h, self.wave_id) for h in self.hosts)


def start_host_actor(node_id: str, ledger, resources: dict | None = None, strategy=None, name: str | None = None,
                     hollow: bool = False):
    """`hollow`: the scale bench's stand-in node (fleet/hollow.py), never a product mode."""
    import ray

    if not node_id:
        raise ValueError("node_id must be a non-empty string")
    from fleet.ledger import actor_options

    cls = ray.remote(HollowHost if hollow else SandboxHost)
    return cls.options(**actor_options(10000 if hollow else 1000, name, resources, strategy)).remote(node_id, None,
                                                                                                   ledger)


class HollowHost(SandboxHost):
    """A real sandbox host whose sandboxes are hollow (fleet/hollow.py): the scale bench's node stand-in."""

    def __init__(self, node_id: str, backend: SandboxBackend | None = None, ledger: Any = None):
        from fleet.hollow import HollowBackend

        super().__init__(node_id, backend or HollowBackend(), ledger)
