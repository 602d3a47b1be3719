"""Sandbox backends. The public methods (`start`, `kill`, `freeze`, `thaw`, `wait`,
`remove`) add timing, state changes and logging, then call a private `_method` per
backend (template method). The process backend runs each runner as

    sh (joins the sandbox cgroups) -> nsenter --net (the network namespace the host made)
        -> bwrap (new mount, pid, ipc, uts, cgroup namespaces; a minimal read-only root)
        -> setpriv (uid/gid 65534, no capabilities, no_new_privs) -> tini -s -g -> runner

Inside, the host is read-only and mostly absent: /usr and /etc read-only, the
runner's code and interpreter read-only at their own paths, a private /tmp,
/proc of its own pid namespace, /sys read-only with an empty /sys/fs/cgroup, no new user namespaces
(a seccomp filter: fleet/seccomp.py), and
the tmpfs workspace at /workspace as the only writable place (and cwd). The
network namespace is empty but for loopback listeners the host opened in it and
relays to the harness services (fleet/netns.py): the only things a runner reaches.

The workspace is a size-limited tmpfs the backend mounts on the host before the
start (source `sandfleet-ws.<wave>.<sandbox>`: a marker a sweep finds), seeds
with the task's files, reads back after the runner exits (the artifact is
captured by the harness, never reported by the runner), and unmounts on remove.
Every process of the sandbox is in one cgroup per controller (memory, pids,
freezer, cpu) on cgroup v1, or in one unified dir on cgroup v2, named
`sandfleet/<wave>/<sandbox>`: the marker a sweep finds (fleet/cgroups/).
"""
from __future__ import annotations

import asyncio
import dataclasses
import ctypes
import os
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from fleet import cgroups, seccomp
from fleet.netns import SandboxNet
from fleet.lifecycle import SANDBOX_TRANSITIONS, Lifecycle, SandboxState

# The parent writes the launcher's pid into every sandbox cgroup, then sends "go" on stdin:
# nothing of the sandbox runs before it is fully inside its cgroups.
LAUNCH = r"""
read -r go || exit 97
exec </dev/null
exec nsenter --net="$SF_NETNS" bwrap "$@"
"""
# Runs the runner inside the sandbox (as tini's child): when the runner exits, it reports its own pid and the
# runner's exit code on the report pipe and waits for the host to close the hold pipe, so the host can see which
# processes outlived the runner before the sandbox's end takes them. The runner itself gets neither pipe.
WRAP = r"""
r=$1 h=$2
exec 8>&"$r" 9<&"$h" {r}>&- {h}<&-
shift 2
trap : TERM INT HUP
"$@" 8>&- 9<&-
rc=$?
printf '%s %s\n' "$$" "$rc" >&8
read -r _ <&9
exit $rc
"""
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
    # (fleet/lazyfs.py), and `volume_crash` ("drop" = a power loss, "tear" = a power loss with the write in flight
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


class SandboxBackend:
    """Template: public methods keep the lifecycle and timing; `_x` methods do the work."""

    name = "base"

    def __init__(self):
        self.sandboxes: dict[str, Sandbox] = {}  # by SandboxSpec.key

    async def start(self, spec: SandboxSpec) -> Sandbox:
        sb = Sandbox(spec=spec, life=Lifecycle(SANDBOX_TRANSITIONS, SandboxState.CREATED))
        self.sandboxes[spec.key] = sb
        t0 = time.perf_counter()
        try:
            await self._start(sb)
        except Exception as exc:
            sb.life.to(SandboxState.FAILED, f"start failed: {exc}")
            try:
                await self.remove(sb)
            finally:
                self.sandboxes.pop(spec.key, None)
            raise
        sb.start_ms = (time.perf_counter() - t0) * 1000
        sb.started_at = time.time()
        sb.life.to(SandboxState.RUNNING, "started")
        return sb

    async def wait(self, sb: Sandbox) -> int:
        code = await self._wait(sb)
        sb.exit_code = code
        sb.ended_at = sb.ended_at or time.time()
        if sb.state == SandboxState.STOPPING:
            sb.life.to(SandboxState.KILLED, f"exit {code} ({sb.killed_by})")
        elif sb.state in (SandboxState.RUNNING, SandboxState.FROZEN):
            if sb.state == SandboxState.FROZEN:
                sb.life.to(SandboxState.STOPPING, "died while frozen")
                sb.life.to(SandboxState.KILLED, f"exit {code}")
            else:
                sb.life.to(SandboxState.EXITED, f"exit {code}")
        return code

    def relayed_by(self, key: str):
        """The compiled relay (netns.Forwarder) the sandbox's loopback listeners were handed to, if any."""
        net = getattr(self, "_nets", {}).get(key)
        return net.forwarded[0] if net is not None and net.forwarded else None

    async def kill(self, sb: Sandbox, grace_s: float = 0.0, reason: str = "kill") -> bool:
        """SIGTERM, `grace_s`, then SIGKILL of everything; True when it was alive."""
        if sb.state not in (SandboxState.RUNNING, SandboxState.FROZEN):
            return False
        sb.killed_by = reason
        sb.life.to(SandboxState.STOPPING, reason)
        # what the stop was: {"sigterm_at": when SIGTERM reached a live init (None: none sent), "sigkill": whether
        # anything was left to SIGKILL after the grace}
        sb.extra["stop"] = await self._kill(sb, grace_s) or {}
        return True

    async def terminate(self, sb: Sandbox) -> bool:
        """SIGTERM the sandbox's init, as a preemption notice does; True if it was sent."""
        return await self._terminate(sb) if sb.exit_code is None else False

    async def freeze(self, sb: Sandbox) -> bool:
        if sb.state != SandboxState.RUNNING:
            return False
        await self._freeze(sb)
        sb.life.to(SandboxState.FROZEN, "freeze")
        return True

    async def thaw(self, sb: Sandbox) -> bool:
        if sb.state != SandboxState.FROZEN:
            return False
        await self._thaw(sb)
        sb.life.to(SandboxState.RUNNING, "thaw")
        return True

    async def remove(self, sb: Sandbox) -> None:
        await self._cleanup(sb)
        if sb.state != SandboxState.REMOVED:
            sb.life.to(SandboxState.REMOVED, "removed")
        self.sandboxes.pop(sb.spec.key, None)

    def command_problem(self, spec: SandboxSpec) -> str | None:
        """Why the runner command cannot start in this backend, or None (checked before a sandbox is made)."""
        return None

    async def collect(self, sb: Sandbox, subdir: str) -> dict:
        """Read `subdir` of the workspace back after the runner ended: {"files": {path: bytes}, "skipped": [...]}."""
        return await asyncio.to_thread(read_tree, os.path.join(sb.spec.workspace, subdir))

    async def start_many(self, specs: list[SandboxSpec]) -> list[Sandbox]:
        return [await self.start(s) for s in specs]

    # -- per backend ------------------------------------------------------
    async def _start(self, sb: Sandbox) -> None:
        raise NotImplementedError

    async def _wait(self, sb: Sandbox) -> int:
        raise NotImplementedError

    async def _kill(self, sb: Sandbox, grace_s: float) -> None:
        raise NotImplementedError

    async def _terminate(self, sb: Sandbox) -> bool:
        raise NotImplementedError

    async def _freeze(self, sb: Sandbox) -> None:
        raise NotImplementedError

    async def _thaw(self, sb: Sandbox) -> None:
        raise NotImplementedError

    async def _cleanup(self, sb: Sandbox) -> None:
        raise NotImplementedError


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


def _utf8(name: str) -> bool:
    """Is this file name (decoded with surrogateescape, as os gives it) valid UTF-8 as it was on the disk?"""
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def read_tree(root: str) -> dict:
    """Regular files under `root`, never following a link (a runner may plant links to host files). Iterative (a
    runner may leave a tree thousands of directories deep), and capped in depth, files and bytes: what a cap left
    out is named in `capped` ("artifact capture skipped: depth > 64") besides the paths in `skipped`."""
    files: dict[str, bytes] = {}
    skipped: list[str] = []
    capped: list[str] = []
    total = 0
    if not os.path.isdir(root) or os.path.islink(root):
        return {"files": None, "skipped": [], "why": f"{os.path.basename(root)}/ is missing from the workspace"}
    stack = [(root, 0)]
    while stack:
        dirpath, depth = stack.pop()
        try:
            entries = sorted(os.scandir(dirpath), key=lambda e: e.name)
        except OSError:
            skipped.append(os.path.relpath(dirpath, root))
            continue
        for entry in entries:
            full = entry.path
            rel = os.path.relpath(full, root)
            if not _utf8(rel):  # a name no JSON record, report or artifact can hold as it is: named, escaped, left
                skipped.append(rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))
                reason = "artifact capture skipped: a file name that is not UTF-8 (shown escaped)"
                if reason not in capped:
                    capped.append(reason)
                continue
            if entry.is_dir(follow_symlinks=False):
                if depth + 1 > MAX_ARTIFACT_DEPTH:
                    skipped.append(rel)
                    reason = f"artifact capture skipped: depth > {MAX_ARTIFACT_DEPTH}"
                    if reason not in capped:
                        capped.append(reason)
                    continue
                stack.append((full, depth + 1))
                continue
            try:
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                skipped.append(rel)
                continue
            try:
                st = os.fstat(fd)
                over = ("bytes", MAX_ARTIFACT_BYTES) if total + st.st_size > MAX_ARTIFACT_BYTES else \
                    ("files", MAX_ARTIFACT_FILES) if len(files) >= MAX_ARTIFACT_FILES else None
                if not stat.S_ISREG(st.st_mode) or over:
                    skipped.append(rel)
                    reason = over and f"artifact capture skipped: {over[0]} > {over[1]}"
                    if reason and stat.S_ISREG(st.st_mode) and reason not in capped:
                        capped.append(reason)
                    continue
                with os.fdopen(os.dup(fd), "rb") as f:
                    body = f.read(st.st_size + 1)
                total += len(body)
                files[rel] = body
            finally:
                os.close(fd)
    out = {"files": files, "skipped": sorted(skipped)}
    if capped:
        out["capped"] = capped
    return out


async def pidfd_ended(fd: int) -> None:
    """Until the process behind pidfd `fd` has ended (the fd turns readable); the caller owns and closes `fd`."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(fd)


_libc = ctypes.CDLL(None, use_errno=True)
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2


def unmount_workspace(path: str) -> None:
    if os.path.ismount(path):
        if _libc.umount2(path.encode(), 0) != 0:
            _libc.umount2(path.encode(), MNT_DETACH)


def release_workspace(path: str) -> None:
    """Unmount a sandbox's workspace tmpfs and remove its (then empty) mount point."""
    unmount_workspace(path)
    if os.path.isdir(path):
        try:
            os.rmdir(path)
        except OSError:
            pass


def _executable(exe: str, path: str, binds) -> tuple[str, str | None]:
    """The file the sandbox would run for `exe` (a bare name is looked up on the sandbox's PATH among what it is
    shown: the first it can see and run), or why there is none."""
    if "/" in exe:
        if not os.path.isfile(exe):
            return exe, f"runner command not found: {exe}"
        if not os.access(exe, os.X_OK):
            return exe, f"runner command not executable: {exe}"
        return exe, None
    found = shutil.which(exe, path=path)
    if found is None:
        return exe, f"runner command not found: {exe} (not on the sandbox PATH {path})"
    seen = [c for c in (os.path.join(d, exe) for d in path.split(os.pathsep) if d)
            if os.path.isfile(c) and _visible(c, binds)]
    runnable = next((c for c in seen if not unreadable_by_sandbox_user([("x", c)], binds)), None)
    return runnable or (seen[0] if seen else found), None


def _host_side(p: str, mounts: dict[str, str]) -> str:
    """Where the sandbox's path `p` is on this machine: under a read-only mount (host dir -> path inside, such as
    a remote node's staged copy of the runner's workdir) it is the host dir's; else `p` itself."""
    for host, inside in sorted(mounts.items(), key=lambda m: len(m[1]), reverse=True):
        if p == inside or p.startswith(inside.rstrip("/") + "/"):
            return host + p[len(inside.rstrip("/")):]
    return p


def command_problem(argv: list[str], path: str, binds: list[str] = (), mounts: dict[str, str] | None = None) \
        -> str | None:
    """Why the runner command cannot start here, or None (checked before a sandbox is made). `binds`: what the
    sandbox sees of the host (the runner's code, its venv), which the sandbox user must be able to read; `mounts`
    (host dir -> path inside) are shown at another path, so a runner named by its path inside is checked there."""
    if not argv or not argv[0]:
        return "runner command is empty"
    if mounts:
        argv = [_host_side(a, mounts) if os.path.isabs(a) else a for a in argv]
        path = os.pathsep.join(_host_side(d, mounts) if os.path.isabs(d) else d for d in path.split(os.pathsep))
        binds = list(binds) + list(mounts)
    exe, problem = _executable(argv[0], path, binds)
    if problem:
        return problem
    for a in argv[1:]:  # a script named by a relative path would be looked up in the fresh workspace
        if not os.path.isabs(a) and a.endswith((".py", ".sh", ".js", ".mjs", ".ts", ".rb")) and not a.startswith("-"):
            return (f"runner script not found: {a} (a relative path is taken from the workspace; give an absolute "
                    "path, or --runner-workdir with the script in it)")
    want = [("x", exe)] + [("r", a) for a in argv[1:] if os.path.isabs(a) and os.path.exists(a)] + \
        [("d", b) for b in binds if os.path.isdir(b)]
    bad = unreadable_by_sandbox_user(want, binds)
    if bad:
        how, p = bad[0]
        return (f"runner code not {'executable' if how == 'x' else 'readable'} by the sandbox user (uid "
                f"{SANDBOX_UID}): {p}: every directory from what the sandbox is shown of it (the runner's workdir, its "
                "venv) down needs o+x and the file o+r (a `mktemp -d` dir is mode 0700: chmod o+rx it, or put the "
                "runner under /opt)")
    return None


SYSTEM_ROOTS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")


def _allows(st: os.stat_result, bits: int) -> bool:
    """Whether the sandbox user (uid and gid 65534, no other groups) has `bits` (4 read, 1 execute) on it."""
    if st.st_uid == SANDBOX_UID:
        m = (st.st_mode >> 6) & 7
    elif st.st_gid == SANDBOX_UID:
        m = (st.st_mode >> 3) & 7
    else:
        m = st.st_mode & 7
    return m & bits == bits


def _roots(binds) -> list[str]:
    return sorted({os.path.realpath(b) for b in binds} | set(SYSTEM_ROOTS), key=len, reverse=True)


def _visible(path: str, binds) -> bool:
    """Whether the sandbox is shown `path` at all (under a bind or a system dir)."""
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in _roots(binds))


def unreadable_by_sandbox_user(paths: list[tuple[str, str]], binds: list[str] = ()) -> list[tuple[str, str]]:
    """Which of the (how, path) pairs (`x` execute, `r` read, `d` list a directory) the sandbox user cannot use
    inside the sandbox. A path shows there through its bind (`binds`, or a system dir): the directories above the
    bind are made 0755 by the sandbox, so only the bind itself and what is below it count (a venv whose own dir is
    a mode-0700 `mktemp -d` fails; one under /root does not, since /root is not bound). By mode bits (no ACLs)."""
    roots = _roots(binds)
    bad = []
    for how, path in paths:
        real = os.path.realpath(path)
        root = next((r for r in roots if real == r or real.startswith(r.rstrip("/") + "/")), "/")
        parts = [root] + [p for p in os.path.relpath(real, root).split("/") if p not in ("", ".")]
        cur, ok = "", True
        for i, part in enumerate(parts):
            cur = part if i == 0 else os.path.join(cur, part)
            try:
                st = os.stat(cur)
            except OSError:
                ok = False
                break
            last = i == len(parts) - 1
            if not last:
                ok = _allows(st, 1)
            elif how == "d":
                ok = _allows(st, 5)
            elif how == "x":
                ok = _allows(st, 1) and (not _is_script(cur) or _allows(st, 4))
            else:
                ok = _allows(st, 4)
            if not ok:
                break
        if not ok:
            bad.append((how, path))
    return bad


def _is_script(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


_CHECKED: dict[tuple, str | None] = {}


def cached_command_problem(spec: SandboxSpec) -> str | None:
    """`command_problem` once per wave and runner (a host runs many attempts of one runner)."""
    key = (spec.wave_id, tuple(spec.argv), spec.env.get("PATH", ""), tuple(spec.ro_binds),
           tuple(sorted(spec.ro_mounts.items())))
    if key not in _CHECKED:
        if len(_CHECKED) > 256:
            _CHECKED.clear()
        _CHECKED[key] = command_problem(spec.argv, spec.env.get("PATH", ""), spec.ro_binds, spec.ro_mounts)
    return _CHECKED[key]


def check_process_backend() -> None:
    """Clear errors for what the process backend needs and this machine lacks."""
    cgroups.check_available()
    for tool in ("bwrap", "setpriv", "nsenter", "tini"):
        if shutil.which(tool) is None:
            hint = {"tini": "apt-get install tini", "bwrap": "apt-get install bubblewrap"}.get(
                tool, "apt-get install util-linux")
            raise SandboxError(f"`{tool}` is not installed; the process sandbox backend needs it "
                               f"({hint}, or run `make setup`)")


VOLUME_SOURCE = "sandfleet-vol"  # mount source of a task's kept volume: `sandfleet-vol.<wave>.<task>`


def _harness_files_anew(workspace: str) -> None:
    """On a kept volume, the harness's own files of the attempt (`.sandfleet/`: the named windows the runner
    announces, a spot notice) start empty: a new sandbox must not read the last attempt's windows as its own."""
    d = os.path.join(workspace, ".sandfleet")
    if os.path.islink(d) or (os.path.exists(d) and not os.path.isdir(d)):
        os.unlink(d)  # the runner's: the harness's dir is made anew
    elif os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    open(os.path.join(d, "checkpoints"), "w").close()
    for x in (d, os.path.join(d, "checkpoints")):
        os.lchown(x, SANDBOX_UID, SANDBOX_UID)


_LAZY: dict[str, object] = {}  # lazy mount point -> its LazyFS, in the process that mounted it (the host's)
# lazy mount point -> the disk boundaries (op, nth) to arm before the attempt's runner starts (a host's watch of a
# PK1 at the runner's Nth write, fsync or rename: armed before the runner can reach it)
PENDING_ARMS: dict[str, list[tuple[str, int]]] = {}


def lazy_of(workspace: str):
    """The LazyFS serving a crash-mode volume at `workspace` (this process mounted it), or None."""
    return _LAZY.get(workspace)


def _arm_pending(workspace: str) -> None:
    lazy = _LAZY.get(workspace)
    for op, nth in PENDING_ARMS.pop(workspace, []):
        if lazy is not None:
            lazy.arm(op, nth)
LAZY_DATA = "data"  # the lazy volume's backing dir inside its tmpfs (its undo dir beside it, on the same tmpfs)


def _lazy_disk(workspace: str) -> str:
    return workspace.rstrip("/") + ".disk"


def release_volume(workspace: str) -> dict | None:
    """A task's kept volume goes: its lazy mount (clean unmount, its process ended) and its tmpfs."""
    lazy = _LAZY.pop(workspace, None)
    got = None
    if lazy is not None:
        got = lazy.unmount()
    else:
        from fleet import lazyfs

        if lazyfs.is_mounted(workspace):  # a host that restarted: no handle, found by its marker
            lazyfs.force_unmount(workspace)
    if os.path.isdir(_lazy_disk(workspace)):
        release_workspace(_lazy_disk(workspace))
    release_workspace(workspace)
    return got


def _prepare_lazy(spec: SandboxSpec) -> dict | None:
    """A crash-mode volume: a size-limited tmpfs at `<workspace>.disk`, seeded, served at the workspace through the
    lazy file system; later attempts first get their crash (drop or tear) done to it. Returns the crash's receipt."""
    from fleet.lazyfs import LazyFS

    lazy = _LAZY.get(spec.workspace)
    if lazy is not None and not spec.volume_fresh:
        receipt = None
        if spec.volume_crash == "tear":
            receipt = dict(lazy.tear(spec.volume_seed), crash="tear")
        elif spec.volume_crash == "drop":
            receipt = dict(lazy.drop(), crash="drop")
        _harness_files_anew(spec.workspace)
        _arm_pending(spec.workspace)
        return receipt
    release_volume(spec.workspace)
    disk = _lazy_disk(spec.workspace)
    seeded = dataclasses.replace(spec, workspace_dir=disk, volume_lazy=False, volume=None)
    _mount_and_seed(seeded, source=spec.mount_source)
    data = os.path.join(disk, LAZY_DATA)
    os.mkdir(data, 0o755)
    for name in os.listdir(disk):  # the seeded files move into the backing dir
        if name != LAZY_DATA:
            os.rename(os.path.join(disk, name), os.path.join(data, name))
    os.lchown(data, SANDBOX_UID, SANDBOX_UID)
    os.makedirs(spec.workspace, exist_ok=True)
    _LAZY[spec.workspace] = LazyFS(data, spec.workspace, label=f"{spec.wave_id}.{spec.volume}").mount()
    _arm_pending(spec.workspace)
    return None


def prepare_workspace(spec: SandboxSpec) -> dict | None:
    """Mount the size-limited tmpfs workspace (owned by the sandbox user) and seed it with the task's files. A kept
    volume already mounted is used as its last attempt left it (a fresh one asked for is mounted anew); a crash-mode
    volume first has its crash done to it (returns what it dropped)."""
    if spec.volume and spec.volume_image is not None:  # moved here from a lost node
        if os.path.ismount(spec.workspace):
            release_workspace(spec.workspace)
        _mount_and_seed(dataclasses.replace(spec, files={}), spec.mount_source)
        got = unpack_volume(spec.volume_image, spec.workspace)
        _harness_files_anew(spec.workspace)
        return dict(got, moved=True)
    if spec.volume and spec.volume_lazy:
        return _prepare_lazy(spec)
    if spec.volume and os.path.ismount(spec.workspace):
        if not spec.volume_fresh:
            _harness_files_anew(spec.workspace)
            return None
        release_workspace(spec.workspace)
    _mount_and_seed(spec, spec.mount_source)
    return None


MOVED_SKIP = (".sandfleet",)  # the harness's own files of an attempt: never carried to the next node


def pack_volume(path: str) -> tuple[bytes, dict]:
    """A kept volume read back as a tar (no link followed, the harness's `.sandfleet/` left out): what a network disk
    carries to another node (`move`). Bounded by the volume's own size limit. Returns (tar, {files, bytes})."""
    import io
    import tarfile

    buf, files, size = io.BytesIO(), 0, 0
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(os.listdir(path)):
            if name in MOVED_SKIP:
                continue
            tar.add(os.path.join(path, name), arcname=name, recursive=True)
        for m in tar.getmembers():
            files += m.isfile()
            size += m.size if m.isfile() else 0
    return buf.getvalue(), {"files": files, "bytes": size}


def unpack_volume(image: bytes, path: str) -> dict:
    """Lay a moved volume's tar into a fresh volume at `path` (tarfile's `data` filter: no absolute path, no `..`,
    no link out of it, no device, no setuid: what a runner wrote is untrusted), owned by the sandbox user."""
    import io
    import tarfile

    members, refused = [], []
    with tarfile.open(fileobj=io.BytesIO(image), mode="r") as tar:
        for m in tar.getmembers():
            if m.name.split("/")[0] in MOVED_SKIP:
                continue
            try:
                members.append(tarfile.data_filter(m, path))
            except tarfile.FilterError as exc:  # e.g. a symlink to an absolute path: not carried, and said so
                refused.append(f"{m.name[:200]}: {type(exc).__name__}")
        tar.extractall(path, members=members, filter="fully_trusted")  # (each member filtered above)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), SANDBOX_UID, SANDBOX_UID)
    out = {"files": sum(m.isfile() for m in members), "bytes": sum(m.size for m in members if m.isfile())}
    return dict(out, refused=refused[:20]) if refused else out


def _mount_and_seed(spec: SandboxSpec, source: str) -> None:
    os.makedirs(spec.workspace, exist_ok=True)
    opts = f"size={spec.workspace_mb * 1024 * 1024},mode=0755,uid={SANDBOX_UID},gid={SANDBOX_UID}"
    if _libc.mount(source.encode(), spec.workspace.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                   opts.encode()) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"could not mount the workspace tmpfs on {spec.workspace}: {os.strerror(err)}")
    for rel in list(spec.files) + [".sandfleet/checkpoints"]:
        full = os.path.join(spec.workspace, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(spec.files.get(rel, ""))
    for dirpath, dirnames, filenames in os.walk(spec.workspace):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), SANDBOX_UID, SANDBOX_UID)


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

    @staticmethod
    def bwrap_args(spec: SandboxSpec, pipes: tuple[int, int] | None = None, seccomp_fd: int | None = None) -> list[str]:
        """`pipes`: (report write end, hold read end) for WRAP, which then runs the runner; `seccomp_fd`: the filter
        that refuses new user namespaces (fleet/seccomp.py)."""
        a = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup",
             "--die-with-parent", "--new-session", "--hostname", "sandbox",
             "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for host in SYSTEM_ROOTS[2:]:  # (/usr and /etc are bound above)
            if os.path.islink(host):
                a += ["--symlink", os.readlink(host), host]
            elif os.path.isdir(host):
                a += ["--ro-bind", host, host]
        # /tmp: private, and writable by the runner (sticky, as on any machine: the contract's TMPDIR)
        # /sys/fs/cgroup: an empty tmpfs, so the sandbox sees no cgroup, its own or another wave's (issue 42)
        a += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp", "--ro-bind", "/sys", "/sys",
              "--perms", "0755", "--tmpfs", "/sys/fs/cgroup"]
        made = {"/", "/usr", "/etc", "/tmp", "/proc", "/dev", "/sys"}

        def parents(path: str) -> list[str]:
            out, cur = [], os.path.dirname(path.rstrip("/"))
            while cur not in made and cur != "/":
                out.append(cur)
                cur = os.path.dirname(cur)
            made.update(out)
            return [x for p in reversed(out) for x in ("--perms", "0755", "--dir", p)]

        for path in sorted(set(spec.ro_binds)):
            if os.path.exists(path):
                a += parents(path) + ["--ro-bind", path, path]
                made.add(path)
        for host, inside in sorted(spec.ro_mounts.items(), key=lambda kv: kv[1]):  # a dir before what is in it
            a += parents(inside) + ["--ro-bind", host, inside]
            made.add(inside)
        for path in spec.hide:
            a += ["--tmpfs", path]
        if seccomp_fd is not None:
            a += ["--seccomp", str(seccomp_fd)]
        a += ["--bind", spec.workspace, WORKSPACE_IN, "--chdir", WORKSPACE_IN,
              "--cap-add", "CAP_SETUID,CAP_SETGID", "--",
              "/usr/bin/setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
              "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs",
              "/usr/bin/tini", "-s", "-g", "--"]
        if pipes is not None:
            a += [BASH, "-c", WRAP, "sandfleet-wrap", str(pipes[0]), str(pipes[1])]  # (dash takes fds 0-9 only)
        return a + list(spec.argv)

    def _prepare_workspace(self, spec: SandboxSpec) -> dict | None:
        return prepare_workspace(spec)

    async def _start(self, sb: Sandbox) -> None:
        # Blocking work (mount, file writes, cgroup writes, fork/exec) runs in threads: the host's event loop
        # keeps renewing leases and serving kills while many sandboxes start at once.
        spec = sb.spec
        disk = await asyncio.to_thread(self._prepare_workspace, spec)
        if disk:  # what a crash mode dropped from the kept volume before this attempt (fleet/lazyfs.py)
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
