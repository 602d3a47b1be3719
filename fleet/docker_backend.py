"""The docker sandbox backend: the same interface and guarantees as the process backend, in containers.

A container is made with `containers.create()` + `start()` (never `containers.run`, which pulls) from a local
image (the base image built from Debian's packages, fleet/dockerimage.py, or one a user names): read-only root,
no capabilities, no-new-privileges, uid/gid 65534, `init=True` (tini as pid 1), memory/pids/CPU limits, a private
/tmp, `network_mode="none"`, labels carrying the wave and sandbox ids (the marker a sweep finds). Like a process
sandbox it sees the runner's code and interpreter read-only at their own paths, its credentials read-only, and
the workspace: the same size-limited tmpfs the host mounts and seeds, bound at /workspace (so faults that
write into it, DF1's ballast, PK2's notice, PK5's checkpoint file, work unchanged).

The network: the container's own namespace has only loopback. The container starts behind a gate (a shell
that waits for `/workspace/.sandfleet/go`); the host then opens the loopback listeners inside the
container's namespace (setns by its pid) and relays them to the harness exactly as for a process sandbox,
and only then opens the gate. Nothing of the runner runs before its network is what the contract says.

The docker engine runs with `--bridge=none --iptables=false` (infra/dockerd-up); this backend never
creates a network and never pulls.
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

from fleet.dockerapi import (LABEL, docker_client, engine_answered, engine_env, engine_url,  # noqa: F401
                             list_containers, remove_container)
from fleet.netns import SandboxNet
from fleet.sandbox import (RUN_IN, SANDBOX_UID, WORKSPACE_IN, Sandbox, SandboxBackend, SandboxError, SandboxSpec,
                           cached_command_problem, pidfd_ended, prepare_workspace, release_workspace)

GATE = 'while [ ! -e /workspace/.sandfleet/go ]; do sleep 0.01; done; exec "$@"'


class EngineUnavailable(SandboxError):
    """The docker engine does not answer: the harness's fault, never the runner's."""

    harness_part = "docker engine"


def client():
    """A docker client, or a clear error naming what is unavailable."""
    try:
        c = docker_client(60)
        c.ping()
        return c
    except Exception as exc:  # noqa: BLE001 - docker.errors.DockerException and socket errors
        raise EngineUnavailable(f"the docker engine at {engine_url()} is unavailable ({type(exc).__name__}: "
                                f"{str(exc)[:200]}); start it with `make setup` (infra/dockerd-up: dockerd "
                                "--bridge=none --iptables=false)") from None


def marked(pid: int | None, wave_id: str, sandbox_id: str) -> bool:
    """Is `pid` still this sandbox's process (its environment carries the sandbox's marker), not a reused pid?"""
    if not pid:
        return False
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"SANDFLEET_SANDBOX={wave_id}/{sandbox_id}".encode() in env.split(b"\0")


def container_name(wave_id: str, sandbox_id: str) -> str:
    return f"sf-{wave_id}-{sandbox_id}"


class DockerBackend(SandboxBackend):
    name = "docker"
    LOG_CAP = 16 * 1024 * 1024
    # The engine's own copy of a container's output: the harness reads it through `docker logs --follow` (its
    # pump keeps LOG_CAP), so the driver cannot be `none`; json-file capped at 3 x 16 MiB, where an unbounded one
    # once kept 2.59 GB per attempt of a runner that printed 3 GiB (issue 42)
    LOG_CONFIG = {"type": "json-file", "config": {"max-size": "16m", "max-file": "3"}}

    def __init__(self):
        super().__init__()
        self._client = None
        self._ctl = None
        # why the engine is taken for gone (a control call timed out or was refused, a ping failed, or the driver
        # said so): from then on signals and removals go by pid at once, not through a minute of timeouts; the
        # next container the engine starts clears it
        self.engine_lost: str | None = None
        self.engine_lost_by_driver = False  # the driver's watch called it lost (3 probes): not pinged again
        self._containers: dict[str, object] = {}
        self._nets: dict[str, SandboxNet] = {}
        self._logs: dict[str, threading.Thread] = {}
        self._image_lock = threading.Lock()
        self._base: str | None = None

    CONTROL_S = 10.0  # signal, inspect, pause, remove: a hung engine must not hold a kill for a minute

    @property
    def docker(self):
        if self._client is None:
            self._client = client()
        return self._client

    @property
    def ctl(self):
        """The low-level API with a short timeout, for control calls on a container."""
        if self._ctl is None:
            self._ctl = docker_client(self.CONTROL_S).api
        return self._ctl

    def command_problem(self, spec: SandboxSpec) -> str | None:
        return cached_command_problem(spec)

    def image(self, spec: SandboxSpec) -> str:
        if spec.image:
            try:
                self.docker.images.get(spec.image)
            except SandboxError:
                raise
            except Exception as exc:  # noqa: BLE001
                if not engine_answered(exc):
                    raise EngineUnavailable(f"the docker engine stopped answering ({type(exc).__name__})") from None
                raise SandboxError(f"sandbox.image {spec.image!r} is not a local image (images are never pulled: "
                                   "build or load it on every node first)") from None
            return spec.image
        with self._image_lock:
            if self._base is None:
                from fleet.dockerimage import ensure_base_image

                self._base = ensure_base_image(self.docker)
            return self._base

    def _create(self, spec: SandboxSpec):
        from docker.types import Mount

        env = dict(spec.env)
        env.update(SANDFLEET_WORKSPACE=WORKSPACE_IN, SANDFLEET_SANDBOX=f"{spec.wave_id}/{spec.sandbox_id}",
                   SANDFLEET_CHECKPOINT=f"{WORKSPACE_IN}/.sandfleet/checkpoints",
                   SANDFLEET_NOTICE=f"{WORKSPACE_IN}/.sandfleet/notice", PATH=env.get("PATH", "/usr/bin:/bin"))
        mounts = [Mount(WORKSPACE_IN, spec.workspace, type="bind")]
        for path in sorted(set(spec.ro_binds)):
            if os.path.exists(path):
                mounts.append(Mount(path, path, type="bind", read_only=True))
        for host, inside in sorted(spec.ro_mounts.items()):
            mounts.append(Mount(inside, host, type="bind", read_only=True))
        tmpfs = {"/tmp": "size=64m,mode=1777", RUN_IN: "size=1m,mode=0755"}
        for path in spec.hide:
            tmpfs[path] = "size=1m,mode=0755"
        return self.docker.containers.create(
            self.image(spec), command=["/bin/sh", "-c", GATE, "sandfleet-gate", *spec.argv],
            name=container_name(spec.wave_id, spec.sandbox_id), hostname="sandbox",
            user=f"{SANDBOX_UID}:{SANDBOX_UID}", working_dir=WORKSPACE_IN, environment=env,
            network_mode="none", read_only=True, init=True, cap_drop=["ALL"],
            security_opt=["no-new-privileges"], mem_limit=spec.memory_mb * 1024 * 1024,
            memswap_limit=spec.memory_mb * 1024 * 1024, pids_limit=spec.pids_max, cpu_shares=max(2, spec.cpu_shares),
            nano_cpus=int(spec.cpu_quota * 1e9) if spec.cpu_quota else None, mounts=mounts, tmpfs=tmpfs,
            labels={LABEL: spec.wave_id, "sandfleet.sandbox": spec.sandbox_id, "sandfleet.task": spec.task_id},
            stop_signal="SIGTERM", auto_remove=False, log_config=self.LOG_CONFIG)

    async def _start(self, sb: Sandbox) -> None:
        spec = sb.spec
        disk = await asyncio.to_thread(prepare_workspace, spec)
        if disk:  # what a crash mode dropped from the kept volume before this attempt (fleet/lazyfs/)
            sb.extra["disk"] = disk
        try:
            c = await asyncio.to_thread(self._create, spec)
            self._containers[spec.key] = c
            await asyncio.to_thread(c.start)
            self.engine_lost, self.engine_lost_by_driver = None, False
        except SandboxError:
            raise
        except Exception as exc:  # noqa: BLE001 - docker.errors.*: the engine refused, or did not answer
            err = SandboxError if engine_answered(exc) else EngineUnavailable
            raise err(f"docker could not create/start the container: {type(exc).__name__}: "
                      f"{str(exc)[:300]}") from None
        await asyncio.to_thread(c.reload)
        pid = c.attrs["State"].get("Pid") or 0
        try:
            if not pid:
                raise OSError("no pid")
            sb.pid = pid
            self._nets[spec.key] = await SandboxNet(spec.relays, spec.relay_token).open(join_pid=pid)
        except OSError:  # it ended before its gate: no shell in the image, a bad entry point
            await asyncio.to_thread(c.reload)
            st = c.attrs["State"]
            tail = (await asyncio.to_thread(c.logs, tail=5)).decode(errors="replace").strip()[-300:]
            raise SandboxError(f"the container exited at once (exit {st.get('ExitCode')}"
                               f"{': ' + st['Error'] if st.get('Error') else ''}) before its runner could start; the "
                               f"image {c.image.tags[:1] or c.image.id[:19]} needs /bin/sh and sleep for the start "
                               f"gate{': ' + tail if tail else ''}") from None
        self._pump_log(spec, c)
        gate = os.path.join(spec.workspace, ".sandfleet", "go")
        with open(gate, "w"):
            pass

    def _pump_log(self, spec: SandboxSpec, c) -> None:
        def pump():
            n = 0
            try:
                with open(spec.log_path, "ab") as out:
                    for chunk in c.logs(stream=True, follow=True, stdout=True, stderr=True):
                        if n < self.LOG_CAP:
                            out.write(chunk[: self.LOG_CAP - n])
                            out.flush()
                        n += len(chunk)
            except Exception:  # noqa: BLE001 - the container was removed under the stream
                pass

        t = threading.Thread(target=pump, name=f"log-{spec.sandbox_id}", daemon=True)
        t.start()
        self._logs[spec.key] = t

    async def _wait(self, sb: Sandbox) -> int:
        c = self._containers[sb.spec.key]
        for tries in range(4):
            waiting = asyncio.ensure_future(asyncio.to_thread(c.wait))
            gone = asyncio.ensure_future(self._init_gone(sb))
            try:
                await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not waiting.done() and not self.engine_lost:  # the init is gone: a live engine says so soon
                    await asyncio.wait({waiting}, timeout=self.CONTROL_S)
            finally:
                gone.cancel()
            if not waiting.done():  # gone for CONTROL_S and the engine still says nothing: hung or dead
                if not self.engine_lost and await asyncio.to_thread(self._engine_answers):
                    await asyncio.wait({waiting}, timeout=3 * self.CONTROL_S)
                if not waiting.done():
                    return await self._end_without_engine(sb, "no answer to its wait after the runner ended")
            try:
                res = waiting.result()
                break
            except Exception as exc:  # noqa: BLE001 - the engine answered an error, or did not answer
                if engine_answered(exc):
                    raise
                if not await asyncio.to_thread(self._engine_answers):
                    return await self._end_without_engine(sb, type(exc).__name__)
                if tries == 3:  # the engine answers pings but not this wait
                    raise
        sb.ended_at = time.time()
        code = int(res.get("StatusCode", -1))
        try:
            oom = bool((await asyncio.to_thread(self.ctl.inspect_container, c.id))["State"].get("OOMKilled"))
        except Exception:  # noqa: BLE001
            oom = False
        sb.extra["events"] = {"oom_kills": int(oom), "pids_max_hits": 0}
        try:
            st = os.statvfs(sb.spec.workspace)
            sb.extra["workspace_full"] = st.f_bavail * st.f_frsize < 64 * 1024
        except OSError:
            pass
        t = self._logs.get(sb.spec.key)
        if t is not None:
            await asyncio.to_thread(t.join, 5)
        return code

    async def _init_gone(self, sb: Sandbox) -> None:
        """Returns once the container's init (its pid namespace's pid 1, which carries the sandbox's marker) ended."""
        try:
            fd = os.pidfd_open(sb.pid)
        except (OSError, TypeError):  # already gone (or never had a pid)
            return
        try:
            if marked(sb.pid, sb.spec.wave_id, sb.spec.sandbox_id):  # else the pid was reused: ours is gone
                await pidfd_ended(fd)
        finally:
            os.close(fd)

    def _signal(self, sb: Sandbox, sig: str) -> bool:
        c = self._containers.get(sb.spec.key)
        if c is None:
            return False
        if self.engine_lost:
            return self._signal_by_pid(sb, getattr(signal, sig))
        # a SIGKILL goes to the container's init by pid first: it lands at once, where the engine's inspect and
        # kill round trips take tens to hundreds of ms on a loaded host (a kill at a boundary of the runner must
        # land before its next step); the engine's kill below makes sure of it and of a paused container
        sent = sig == "SIGKILL" and self._signal_by_pid(sb, signal.SIGKILL)
        try:
            if self.ctl.inspect_container(c.id)["State"].get("Paused"):
                self.ctl.unpause(c.id)  # a paused container cannot be signalled
            self.ctl.kill(c.id, signal=sig)
            return True
        except Exception as exc:  # noqa: BLE001 - it ended meanwhile, or the engine is gone
            if engine_answered(exc):
                return sent
            self.engine_lost = f"{type(exc).__name__} on a signal"
            return self._signal_by_pid(sb, getattr(signal, sig))

    def _engine_answers(self) -> bool:
        try:
            docker_client(3).ping()
            self.engine_lost = None
            return True
        except Exception as exc:  # noqa: BLE001
            self.engine_lost = f"{type(exc).__name__} on a ping"
            return False

    def _signal_by_pid(self, sb: Sandbox, sig: int) -> bool:
        """The engine does not answer: signal the container's init (its pid namespace's pid 1: SIGKILL ends every
        process in it) directly, after checking the pid still carries this sandbox's marker."""
        if not marked(sb.pid, sb.spec.wave_id, sb.spec.sandbox_id):
            return False
        try:
            os.kill(sb.pid, sig)  # a paused (frozen) container too: SIGKILL ends a frozen task
            return True
        except ProcessLookupError:
            return False

    async def _end_without_engine(self, sb: Sandbox, why: str) -> int:
        """The engine stopped answering while the runner ran: nothing can be asked of the container any more, so
        the runner is ended here, by its pid, and the attempt says why. Its container's record stays in the
        engine's state; `sandfleet sweep` removes it once the engine answers again."""
        sb.killed_by = sb.killed_by or f"docker engine lost ({why}): container killed by pid"
        sb.extra["harness_part"] = EngineUnavailable.harness_part
        self.engine_lost = self.engine_lost or why
        await asyncio.to_thread(self._signal_by_pid, sb, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while marked(sb.pid, sb.spec.wave_id, sb.spec.sandbox_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        sb.ended_at = time.time()
        sb.extra["events"] = {"oom_kills": 0, "pids_max_hits": 0}
        return 128 + signal.SIGKILL

    async def _terminate(self, sb: Sandbox) -> bool:
        return await asyncio.to_thread(self._signal, sb, "SIGTERM")

    async def _kill(self, sb: Sandbox, grace_s: float) -> dict:
        term = None
        if grace_s > 0 and await self._terminate(sb):
            term = time.time()
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and sb.exit_code is None and await asyncio.to_thread(self._running, sb):
                await asyncio.sleep(0.02)
        left = sb.exit_code is None and await asyncio.to_thread(self._running, sb)
        await asyncio.to_thread(self._signal, sb, "SIGKILL")
        return {"sigterm_at": term, "sigkill": left}

    def _running(self, sb: Sandbox) -> bool:
        c = self._containers.get(sb.spec.key)
        try:
            return bool(self.ctl.inspect_container(c.id)["State"].get("Running"))
        except Exception:  # noqa: BLE001
            return False

    async def _freeze(self, sb: Sandbox) -> None:
        await asyncio.to_thread(self.ctl.pause, self._containers[sb.spec.key].id)

    async def _thaw(self, sb: Sandbox) -> None:
        await asyncio.to_thread(self.ctl.unpause, self._containers[sb.spec.key].id)

    async def _cleanup(self, sb: Sandbox) -> None:
        sid = sb.spec.key  # (the host's name for it: several waves share a fleet's host)
        c = self._containers.pop(sid, None)
        cid = c.id if c is not None else None
        if cid is None and not self.engine_lost:  # the create failed: a container of that name may still exist
            cid = await asyncio.to_thread(self._id_by_name, sb.spec)
        if cid is not None and self.engine_lost and (self.engine_lost_by_driver or
                                                     not await asyncio.to_thread(self._engine_answers)):
            # its record stays in the engine for `sandfleet sweep`
            await asyncio.to_thread(self._signal_by_pid, sb, signal.SIGKILL)
        elif cid is not None:
            try:
                await asyncio.to_thread(self.ctl.remove_container, cid, force=True)
            except Exception as exc:  # noqa: BLE001 - already gone, or the engine is: its processes go by pid
                if not engine_answered(exc):
                    self.engine_lost = f"{type(exc).__name__} on a removal"
                    await asyncio.to_thread(self._signal_by_pid, sb, signal.SIGKILL)
        t = self._logs.pop(sid, None)
        if t is not None and not self.engine_lost:  # a lost engine's log stream may never end: leave its thread
            await asyncio.to_thread(t.join, 5)
        net = self._nets.pop(sid, None)
        if net is not None:
            await net.close()
        if not sb.spec.volume:  # a kept volume is the task's: its host drops it when the task ends
            await asyncio.to_thread(release_workspace, sb.spec.workspace)

    def _id_by_name(self, spec: SandboxSpec) -> str | None:
        try:
            return self.ctl.inspect_container(container_name(spec.wave_id, spec.sandbox_id))["Id"]
        except Exception:  # noqa: BLE001
            return None
