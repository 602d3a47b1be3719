"""The process backend: each runner in its own namespaces through bubblewrap (fleet/sandbox/bwrap.py), in its own
cgroup (fleet/cgroups/) and network namespace (fleet/netns.py), on a tmpfs workspace (fleet/sandbox/workspace.py);
the host pumps its log, sees what outlived the runner, and kills, freezes and thaws it through the cgroup."""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from fleet import cgroups, seccomp
from fleet.netns import SandboxNet
from fleet.sandbox.access import cached_command_problem
from fleet.sandbox.backend import SandboxBackend, pidfd_ended
from fleet.sandbox.bwrap import LAUNCH, bwrap_args
from fleet.sandbox.spec import BASH, WORKSPACE_IN, Sandbox, SandboxError, SandboxSpec
from fleet.sandbox.workspace import prepare_workspace, release_workspace


def check_process_backend() -> None:
    """Clear errors for what the process backend needs and this machine lacks."""
    cgroups.check_available()
    for tool in ("bwrap", "setpriv", "nsenter", "tini"):
        if shutil.which(tool) is None:
            hint = {"tini": "apt-get install tini", "bwrap": "apt-get install bubblewrap"}.get(
                tool, "apt-get install util-linux")
            raise SandboxError(f"`{tool}` is not installed; the process sandbox backend needs it "
                               f"({hint}, or run `make setup`)")


def outliving(pids: list[int], wrapper_ns_pid: int) -> list[dict]:
    """The processes of a sandbox other than its harness chain once the runner has exited: not bwrap (outside the
    sandbox's pid namespace, or its pid 1), not the wrapper (its pid in the namespace is `wrapper_ns_pid`), not its
    parent tini; zombies left out. Each as its pid inside the sandbox and its name (at most 16 bytes, the runner's
    to choose)."""
    seen, wrapper_ppid = [], None
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        ns = fields.get("NSpid", "").split()
        if len(ns) < 2 or fields.get("State", "").strip().startswith("Z"):
            continue
        inner = int(ns[-1])
        if inner == wrapper_ns_pid:
            wrapper_ppid = int(fields.get("PPid", "0").strip() or 0)
            continue
        if inner == 1:
            continue
        seen.append((pid, inner, fields.get("Name", "").strip()))
    return [{"pid": inner, "name": name} for pid, inner, name in seen if pid != wrapper_ppid]


class ProcessBackend(SandboxBackend):
    """Unprivileged processes in their own namespaces (bubblewrap), a private tmpfs workspace,
    cgroup (v1 or v2) limits the runner cannot touch, and only loopback relays to the harness."""

    name = "process"
    LOG_CAP = 16 * 1024 * 1024

    def command_problem(self, spec: SandboxSpec) -> str | None:
        return cached_command_problem(spec)

    def __init__(self):
        super().__init__()
        self._procs: dict[str, subprocess.Popen] = {}
        self._cgroups: dict[str, cgroups.SandboxCgroup] = {}
        self._logs: dict[str, tuple[int, object, list]] = {}
        self._nets: dict[str, SandboxNet] = {}
        self._pipes: dict[str, tuple[int, int]] = {}  # sandbox id -> (report read end, hold write end)
    bwrap_args = staticmethod(bwrap_args)  # (fleet/sandbox/bwrap.py; ProcessBackend.bwrap_args as before)

    def _prepare_workspace(self, spec: SandboxSpec) -> dict | None:
        return prepare_workspace(spec)

    async def _start(self, sb: Sandbox) -> None:
        # Blocking work (mount, file writes, cgroup writes, fork/exec) runs in threads: the host's event loop
        # keeps renewing leases and serving kills while many sandboxes start at once.
        spec = sb.spec
        disk = await asyncio.to_thread(self._prepare_workspace, spec)
        if disk:  # what a crash mode dropped from the kept volume before this attempt (fleet/lazyfs/)
            sb.extra["disk"] = disk
        cg = cgroups.SandboxCgroup(spec.wave_id, spec.sandbox_id)
        await asyncio.to_thread(cg.create, spec.memory_mb * 1024 * 1024, spec.pids_max, spec.cpu_shares,
                                spec.cpu_quota)
        self._cgroups[spec.key] = cg
        net = await SandboxNet(spec.relays, spec.relay_token).open()
        self._nets[spec.key] = net
        env = dict(spec.env)
        env.update(
            SANDFLEET_WORKSPACE=WORKSPACE_IN,
            SANDFLEET_SANDBOX=f"{spec.wave_id}/{spec.sandbox_id}",
            SANDFLEET_CHECKPOINT=f"{WORKSPACE_IN}/.sandfleet/checkpoints",
            SANDFLEET_NOTICE=f"{WORKSPACE_IN}/.sandfleet/notice",
            PATH=env.get("PATH", "/usr/bin:/bin"),
        )
        launch_env = dict(env, SF_NETNS=f"/proc/self/fd/{net.nsfd}")
        rfd, wfd = os.pipe()
        rep_r, rep_w = os.pipe()  # the wrapper reports the runner's exit on it
        hold_r, hold_w = os.pipe()  # the wrapper waits on it until the host has looked
        sec_r = seccomp.filter_fd()  # bwrap reads the filter from it
        try:
            proc = await asyncio.to_thread(
                subprocess.Popen, ["/bin/sh", "-c", LAUNCH, "sandfleet-launch",
                                   *self.bwrap_args(spec, (rep_w, hold_r) if os.access(BASH, os.X_OK) else None,
                                                    sec_r)],
                env=launch_env, stdout=wfd, stderr=wfd, stdin=subprocess.PIPE, cwd="/",
                pass_fds=(net.nsfd, rep_w, hold_r, sec_r))
        except BaseException:
            for fd in (rep_r, hold_w):
                os.close(fd)
            raise
        finally:
            for fd in (wfd, rep_w, hold_r, sec_r):
                os.close(fd)
        self._pipes[spec.key] = (rep_r, hold_w)
        self._procs[spec.key] = proc
        sb.pid = proc.pid
        self._pump_log(spec, rfd)
        def place() -> None:
            for f in cg.procs_files():
                with open(f, "w") as fh:
                    fh.write(str(proc.pid))
            proc.stdin.write(b"go\n")
            proc.stdin.close()

        try:
            await asyncio.to_thread(place)
        except OSError as exc:
            proc.kill()
            await asyncio.to_thread(proc.wait, 5)
            raise SandboxError(f"could not place sandbox {spec.sandbox_id} in its cgroups: {exc}") from exc

    def _pump_log(self, spec: SandboxSpec, rfd: int) -> None:
        """The runner's stdout/stderr reach the host through a pipe; the host writes the log (capped)."""
        os.set_blocking(rfd, False)
        out = open(spec.log_path, "ab")
        state = [0]
        self._logs[spec.key] = (rfd, out, state)
        loop = asyncio.get_running_loop()

        def readable():
            try:
                data = os.read(rfd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._close_log(spec.key)
                return
            if state[0] < self.LOG_CAP:
                out.write(data[: self.LOG_CAP - state[0]])
                out.flush()
                if state[0] + len(data) >= self.LOG_CAP:
                    out.write(b"\n[sandfleet: log capped at %d bytes]\n" % self.LOG_CAP)
            state[0] += len(data)

        loop.add_reader(rfd, readable)

    def _close_log(self, sid: str) -> None:
        entry = self._logs.pop(sid, None)
        if entry is None:
            return
        rfd, out, _ = entry
        try:
            asyncio.get_running_loop().remove_reader(rfd)
        except RuntimeError:
            pass
        os.close(rfd)
        out.close()

    async def _wait(self, sb: Sandbox) -> int:
        proc = self._procs[sb.spec.key]
        pipes = self._pipes.pop(sb.spec.key, None)
        if pipes is not None:
            try:
                sb.extra["outlived"] = await self._runner_ended(sb, *pipes)
            finally:
                for fd in pipes:  # closing the hold end lets the wrapper exit with the runner's code
                    os.close(fd)
        if proc.poll() is None:
            fd = os.pidfd_open(proc.pid)
            try:
                await pidfd_ended(fd)
            finally:
                os.close(fd)
        code = proc.wait()
        sb.ended_at = time.time()
        # bwrap's pid 1 ends the namespace with it; wait until the cgroup is empty too
        cg = self._cgroups.get(sb.spec.key)
        if cg is not None:
            sb.extra["events"] = cg.events()
        try:
            st = os.statvfs(sb.spec.workspace)
            sb.extra["workspace_full"] = st.f_bavail * st.f_frsize < 64 * 1024
        except OSError:
            pass
        if cg is not None and cg.pids():
            await asyncio.to_thread(cg.kill_all)
        return code

    async def _runner_ended(self, sb: Sandbox, rep_r: int, hold_w: int) -> list[dict] | None:
        """Wait for the wrapper's report of the runner's exit, then list the sandbox's processes that outlived the
        runner (by the host's /proc: nothing a runner says); None when no report came (the sandbox was killed, or
        the wrapper was)."""
        loop = asyncio.get_running_loop()
        got: asyncio.Future = loop.create_future()
        buf = bytearray()

        def readable() -> None:
            try:
                chunk = os.read(rep_r, 256)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            buf.extend(chunk)
            if (not chunk or b"\n" in buf or len(buf) > 200) and not got.done():
                got.set_result(bytes(buf))

        os.set_blocking(rep_r, False)
        loop.add_reader(rep_r, readable)
        try:
            line = await got
        finally:
            loop.remove_reader(rep_r)
        try:
            wrapper = int(line.split()[0])
        except (ValueError, IndexError):
            return None
        cg = self._cgroups.get(sb.spec.key)
        return outliving(cg.pids() if cg is not None else [], wrapper)

    def _init_pid(self, sb: Sandbox) -> int | None:
        """Host pid of the sandbox's tini (it forwards SIGTERM to the runner's process group)."""
        todo = [sb.pid]
        while todo:
            pid = todo.pop(0)
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "tini":
                    return pid
                todo += [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
            except (OSError, ValueError):
                continue
        return None

    async def _terminate(self, sb: Sandbox) -> bool:
        init = self._init_pid(sb)
        if not init:
            return False
        try:
            os.kill(init, signal.SIGTERM)
            return True
        except ProcessLookupError:
            return False

    async def _kill(self, sb: Sandbox, grace_s: float) -> dict:
        cg = self._cgroups[sb.spec.key]
        term = None
        if grace_s > 0:
            init = self._init_pid(sb)
            if init:
                try:
                    os.kill(init, signal.SIGTERM)
                    term = time.time()
                except ProcessLookupError:
                    pass
                deadline = time.monotonic() + grace_s
                while time.monotonic() < deadline and cg.pids():
                    await asyncio.sleep(0.02)
        left = bool(cg.pids())
        await asyncio.to_thread(cg.kill_all)
        return {"sigterm_at": term, "sigkill": left}

    async def _freeze(self, sb: Sandbox) -> None:
        await asyncio.to_thread(self._cgroups[sb.spec.key].freeze)

    async def _thaw(self, sb: Sandbox) -> None:
        self._cgroups[sb.spec.key].thaw()

    async def _cleanup(self, sb: Sandbox) -> None:
        sid = sb.spec.key  # (the host's name for it: several waves share a fleet's host)
        for fd in self._pipes.pop(sid, ()):  # never waited on (a start that failed half way)
            os.close(fd)
        cg = self._cgroups.pop(sid, None) or cgroups.SandboxCgroup(sb.spec.wave_id, sb.spec.sandbox_id)
        cg.thaw()
        await asyncio.to_thread(cg.kill_all)
        proc = self._procs.pop(sid, None)
        if proc is not None:
            try:
                await asyncio.to_thread(proc.wait, 5)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait, 5)
        self._drain_and_close_log(sid)
        net = self._nets.pop(sid, None)
        if net is not None:
            await net.close()
        await asyncio.to_thread(cg.remove)
        if not sb.spec.volume:  # a kept volume is the task's: its host drops it when the task ends
            await asyncio.to_thread(release_workspace, sb.spec.workspace)

    def _drain_and_close_log(self, sid: str) -> None:
        entry = self._logs.get(sid)
        if entry is not None:
            rfd, out, state = entry
            try:
                while state[0] < self.LOG_CAP:
                    data = os.read(rfd, 65536)
                    if not data:
                        break
                    out.write(data[: self.LOG_CAP - state[0]])
                    state[0] += len(data)
            except OSError:
                pass
        self._close_log(sid)
