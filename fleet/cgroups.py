"""Sandbox cgroups, on cgroup v1 or v2 (detected once: `mode()`).

v1 (memory, pids, freezer and cpu hierarchies): one dir per controller under the harness's own cgroup in each, at
`<own>/sandfleet/<wave>/<sandbox>`. v2 (the unified hierarchy alone at /sys/fs/cgroup): one dir at the same path
under the harness's own cgroup, the subtree it was started in (its delegated subtree); memory, pids and cpu are
enabled down to each sandbox through `cgroup.subtree_control`, freeze and kill are `cgroup.freeze` and
`cgroup.kill`. v2 allows no process in an inner node, so when the own cgroup is not the root, the processes in it
move once to a leaf `<own>/sandfleet-home` before its controllers are enabled, and a process leaving the harness's
group goes back there. Either way the path itself is the marker a sweep uses to find leftovers after a crash."""
from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "freezer", "cpu")  # v1 hierarchies
UNIFIED = "unified"  # the key of the one v2 dir where v1 has one dir per controller
V2_CONTROLLERS = ("memory", "pids", "cpu")  # enabled down the v2 tree (freeze and kill are core files)
MARK = "sandfleet"
HARNESS = "sandfleet-harness"  # the harness's own processes: a sibling of the sandboxes' tree, never its parent
HOME = "sandfleet-home"  # v2: the leaf that holds what ran in the own cgroup once that became an inner node
_MODE: list[str] = []


class CgroupError(RuntimeError):
    pass


class CgroupSetupError(CgroupError):
    """The machine (or this process's place on it) cannot host process sandboxes: not root, a controller missing,
    a v2 subtree that is not delegated. Bad input to the harness (exit 254), with what to do named."""


def mode() -> str:
    """"v2" when /sys/fs/cgroup is the unified hierarchy alone; "v1" otherwise (a v1 or hybrid host, whose
    controllers are v1 hierarchies). Read once per process."""
    if not _MODE:
        _MODE.append("v2" if (ROOT / "cgroup.controllers").is_file() else "v1")
    return _MODE[0]


def unified() -> bool:
    return mode() == "v2"


def own_path(controller: str, proc_cgroup: str = "/proc/self/cgroup") -> str:
    """This process's cgroup path in a v1 controller (or `UNIFIED`: the v2 hierarchy), with any sandfleet suffix
    cut off."""
    for line in Path(proc_cgroup).read_text().splitlines():
        hid, ctrls, path = line.split(":", 2)
        if (hid == "0" and not ctrls) if controller == UNIFIED else controller in ctrls.split(","):
            parts = path.split("/")
            cut = next((i for i, p in enumerate(parts) if p in (MARK, HARNESS, HOME)), len(parts))
            path = "/".join(parts[:cut])
            return path if path not in ("/", "") else ""
    if controller == UNIFIED:
        raise CgroupError("this process is in no cgroup v2 hierarchy (no `0::` line in /proc/self/cgroup)")
    raise CgroupError(f"cgroup v1 controller {controller!r} is not mounted "
                      f"(need /sys/fs/cgroup/{controller}; run as root on a cgroup v1 host)")


def _base(controller: str) -> Path:
    """The harness's own cgroup dir in one v1 controller, or (`UNIFIED`) in the v2 hierarchy."""
    if controller == UNIFIED:
        return ROOT / own_path(UNIFIED).lstrip("/")
    return ROOT / controller / own_path(controller).lstrip("/")


def own_dirs() -> dict[str, Path]:
    """The harness's own cgroup dir per hierarchy: one per v1 controller, or the one v2 dir (key `UNIFIED`)."""
    return {UNIFIED: _base(UNIFIED)} if unified() else {c: _base(c) for c in CONTROLLERS}


def procs_base() -> Path:
    """The harness's own cgroup dir where sandboxes' members are listed: the pids controller's (v1), or the one v2
    dir."""
    return _base(UNIFIED if unified() else "pids")


def _is_root(d: Path) -> bool:
    """The v2 root cgroup (the only one allowed processes beside children with controllers) has no cgroup.type."""
    return not (d / "cgroup.type").exists()


def _systemd_undelegated(d: Path) -> bool:
    """A cgroup systemd manages and did not hand over (no `Delegate=yes`: systemd marks a delegated unit's cgroup
    with the trusted.delegate xattr, v251+): systemd may move or reset anything made in it."""
    try:
        if Path("/proc/1/comm").read_text().strip() != "systemd" or _is_root(d):
            return False
    except OSError:
        return False
    for name in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(d, name).strip(b"\0") == b"1":
                return False
        except OSError:
            continue
    return True


HOW_TO_DELEGATE = ("run it in a delegated subtree: under systemd, `systemd-run --scope -p Delegate=yes "
                   "<command>` (or a service with Delegate=yes); without systemd, a cgroup of its own whose parent "
                   "enables +memory +pids +cpu in cgroup.subtree_control")


def _check_v2() -> None:
    """What a v2 host must give: a writable cgroup2 mount, the own cgroup delegated (not systemd's), memory, pids
    and cpu available in it, and cgroup.kill / cgroup.freeze (Linux 5.14+)."""
    d = _base(UNIFIED)
    if os.statvfs(ROOT).f_flag & os.ST_RDONLY:
        raise CgroupSetupError(f"cgroup v2 at {ROOT} is mounted read-only: the process backend makes a cgroup per "
                               f"sandbox; {HOW_TO_DELEGATE} (a container: a writable cgroup mount and a private "
                               "cgroup namespace)")
    if _systemd_undelegated(d):
        raise CgroupSetupError(f"this process's cgroup {d} belongs to systemd and is not delegated (no Delegate=yes): "
                               f"sandbox cgroups cannot be made in it; {HOW_TO_DELEGATE}")
    have = set((d / "cgroup.controllers").read_text().split())
    missing = [c for c in V2_CONTROLLERS if c not in have]
    if missing:
        raise CgroupSetupError(f"cgroup v2 controller(s) {', '.join(missing)} not available in this process's cgroup "
                               f"{d} (its cgroup.controllers: {' '.join(sorted(have)) or 'none'}; needed: "
                               f"{' '.join(V2_CONTROLLERS)}): the subtree is not delegated; {HOW_TO_DELEGATE}")
    if not _is_root(d):
        for f in ("cgroup.kill", "cgroup.freeze"):
            if not (d / f).exists():
                raise CgroupSetupError(f"{d / f} does not exist: the process backend kills and freezes sandboxes "
                                       "through cgroup.kill and cgroup.freeze (Linux 5.14 or later)")


def check_available() -> None:
    """Raise a clear error when the process backend cannot work here."""
    if os.geteuid() != 0:
        raise CgroupSetupError("the process sandbox backend needs root (mount namespaces, tmpfs, cgroups); "
                               "run as root")
    if unified():
        _check_v2()
        return
    for c in CONTROLLERS:
        if not (ROOT / c).is_dir():
            raise CgroupSetupError(f"cgroup v1 controller {c!r} is not mounted at {ROOT / c}; "
                                   "the process backend needs cgroup v1 memory, pids and freezer, or cgroup v2")
        own_path(c)


def _enable(d: Path, controllers) -> None:
    """v2: turn `controllers` on for d's children (cgroup.subtree_control), those not on yet."""
    f = d / "cgroup.subtree_control"
    need = [c for c in controllers if c not in f.read_text().split()]
    if need:
        f.write_text(" ".join(f"+{c}" for c in need))


def _evacuate(d: Path) -> None:
    """v2: move every process of d into its leaf d/sandfleet-home, so d may enable controllers for its children
    (no processes in an inner node). Repeated while a fork lands meanwhile."""
    home = d / HOME
    home.mkdir(exist_ok=True)
    for _ in range(100):
        pids = (d / "cgroup.procs").read_text().split()
        if not pids:
            return
        for pid in pids:
            try:
                (home / "cgroup.procs").write_text(pid)
            except OSError as exc:
                if exc.errno != errno.ESRCH:  # (it ended meanwhile)
                    raise
    raise CgroupError(f"processes keep appearing in {d}; cannot make it an inner node")


def delegated_root() -> Path:
    """v2: the harness's own cgroup with memory, pids and cpu on for its children (its processes moved to
    `sandfleet-home` first when it is not the root)."""
    d = _base(UNIFIED)
    try:
        _enable(d, V2_CONTROLLERS)
    except OSError as exc:
        if exc.errno != errno.EBUSY or _is_root(d):
            raise CgroupSetupError(f"cannot enable {' '.join(V2_CONTROLLERS)} in {d}/cgroup.subtree_control: "
                                   f"{exc}; {HOW_TO_DELEGATE}") from exc
        _evacuate(d)
        _enable(d, V2_CONTROLLERS)
    return d


def home(d: Path) -> Path:
    """v2: where a process of the own cgroup `d` lives: d itself while it may hold processes (the root, or no
    controller on for its children), else its leaf `sandfleet-home`."""
    if _is_root(d) or not (d / "cgroup.subtree_control").read_text().split():
        return d
    (d / HOME).mkdir(exist_ok=True)
    return d / HOME


def wave_dir(controller: str, wave_id: str) -> Path:
    return _base(controller) / MARK / wave_id


def wave_dirs(wave_id: str) -> list[Path]:
    """The wave's dir in every hierarchy (one per v1 controller, or the one v2 dir)."""
    return [d / MARK / wave_id for d in own_dirs().values()]


def group_dirs(name: str) -> dict[str, Path]:
    """Dirs for a group of the harness's own beside the sandboxes' tree (`<own>/<name>`: an isolated node), one per
    v1 controller or the one v2 dir (whose parent then has the controllers on). Nothing is made."""
    if unified():
        return {UNIFIED: delegated_root() / name}
    return {c: _base(c) / name for c in CONTROLLERS}


def join_file(d: Path) -> Path:
    """The cgroup.procs a process writes itself into to join the group `d` of `group_dirs`: d's own on v1; on v2
    its leaf `sandfleet-home` (made here), as d becomes an inner node once its processes make cgroups of their own."""
    if not unified():
        return d / "cgroup.procs"
    (d / HOME).mkdir(parents=True, exist_ok=True)
    return d / HOME / "cgroup.procs"


def shares_to_weight(shares: int) -> int:
    """v1 cpu.shares to v2 cpu.weight, with each default on the other (1024 -> 100), clamped to 1..10000."""
    return max(1, min(10000, round(shares * 100 / 1024)))


class SandboxCgroup:
    """A sandbox's cgroup(s). Made as the v2 kind (`UnifiedSandboxCgroup`) on a v2 host."""

    def __new__(cls, *args, **kwargs):
        if cls is SandboxCgroup and args and unified():
            cls = UnifiedSandboxCgroup
        return super().__new__(cls)

    def __init__(self, wave_id: str, sandbox_id: str):
        self.wave_id = wave_id
        self.sandbox_id = sandbox_id
        self.dirs = {c: wave_dir(c, wave_id) / sandbox_id for c in CONTROLLERS}

    def create(self, memory_bytes: int, pids_max: int, cpu_shares: int = 1024, cpu_cores: float | None = None) -> None:
        """Make the dirs and set the limits from outside (the runner sees /sys read-only)."""
        for d in self.dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        (self.dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_bytes))
        mem = self.dirs["memory"] / "memory.memsw.limit_in_bytes"
        if mem.exists():  # no escape into swap
            try:
                mem.write_text(str(memory_bytes))
            except OSError:
                pass
        (self.dirs["pids"] / "pids.max").write_text(str(pids_max))
        (self.dirs["cpu"] / "cpu.shares").write_text(str(cpu_shares))
        if cpu_cores:
            period = 100_000
            (self.dirs["cpu"] / "cpu.cfs_period_us").write_text(str(period))
            (self.dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(max(1000, int(cpu_cores * period))))

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def pids(self) -> list[int]:
        try:
            text = (self.dirs["pids"] / "cgroup.procs").read_text()
        except OSError as exc:  # removed meanwhile: ENOENT, or ENODEV when it went between open and read
            if exc.errno in (errno.ENOENT, errno.ENODEV):
                return []
            raise
        return [int(p) for p in text.split()]

    def events(self) -> dict:
        """Counters that say why an attempt ended: OOM kills, forks refused at pids.max."""
        out = {"oom_kills": 0, "pids_max_hits": 0}
        try:
            for line in (self.dirs["memory"] / "memory.oom_control").read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    out["oom_kills"] = int(v)
        except (OSError, ValueError):
            pass
        try:
            for line in (self.dirs["pids"] / "pids.events").read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "max":
                    out["pids_max_hits"] = int(v)
        except (OSError, ValueError):
            pass
        return out

    def exists(self) -> bool:
        return any(d.exists() for d in self.dirs.values())

    def freeze(self, timeout_s: float = 5.0) -> bool:
        state = self.dirs["freezer"] / "freezer.state"
        try:
            state.write_text("FROZEN")
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if state.read_text().strip() == "FROZEN":
                    return True
                time.sleep(0.005)
        except OSError as exc:  # removed meanwhile (ENOENT, or ENODEV mid-read): the sandbox already ended
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise
        return False

    def thaw(self) -> None:
        try:
            (self.dirs["freezer"] / "freezer.state").write_text("THAWED")
        except OSError as exc:  # removed meanwhile
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    def kill_all(self, timeout_s: float = 10.0) -> bool:
        """Freeze, SIGKILL every member, thaw, and wait until the cgroup is empty."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids or not self.exists():
                return True
            frozen = self.freeze(1.0)
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if frozen:
                self.thaw()
            time.sleep(0.01)
        return not self.pids()

    def remove(self, timeout_s: float = 5.0) -> None:
        """rmdir each controller's directory; a just-emptied cgroup can stay busy for a moment."""
        deadline = time.monotonic() + timeout_s
        for d in self.dirs.values():
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise CgroupError(f"cannot remove {d}: {exc}; members: {self.pids()}") from exc
                    time.sleep(0.02)
            for parent in (d.parent, d.parent.parent):  # wave dir, then sandfleet dir, if empty
                try:
                    parent.rmdir()
                except OSError:
                    break


class UnifiedSandboxCgroup(SandboxCgroup):
    """v2: one dir `<own>/sandfleet/<wave>/<sandbox>`, a leaf, with memory, pids and cpu on from the own cgroup
    down; freeze through cgroup.freeze, kill through cgroup.kill."""

    def __init__(self, wave_id: str, sandbox_id: str):
        self.wave_id = wave_id
        self.sandbox_id = sandbox_id
        self.dir = wave_dir(UNIFIED, wave_id) / sandbox_id
        self.dirs = {UNIFIED: self.dir}

    def create(self, memory_bytes: int, pids_max: int, cpu_shares: int = 1024, cpu_cores: float | None = None) -> None:
        """Make the dir (controllers on along the way) and set the limits from outside; no swap."""
        for attempt in range(3):  # a last sandbox's remove can take the wave dir away between the two mkdirs
            try:
                for d in (delegated_root() / MARK, self.dir.parent):
                    d.mkdir(exist_ok=True)
                    _enable(d, V2_CONTROLLERS)
                self.dir.mkdir(exist_ok=True)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        (self.dir / "memory.max").write_text(str(memory_bytes))
        swap = self.dir / "memory.swap.max"
        if swap.exists():  # no escape into swap
            swap.write_text("0")
        (self.dir / "pids.max").write_text(str(pids_max))
        (self.dir / "cpu.weight").write_text(str(shares_to_weight(cpu_shares)))
        if cpu_cores:
            period = 100_000
            (self.dir / "cpu.max").write_text(f"{max(1000, int(cpu_cores * period))} {period}")

    def pids(self) -> list[int]:
        try:
            text = (self.dir / "cgroup.procs").read_text()
        except OSError as exc:  # removed meanwhile
            if exc.errno in (errno.ENOENT, errno.ENODEV):
                return []
            raise
        return [int(p) for p in text.split()]

    def events(self) -> dict:
        out = {"oom_kills": 0, "pids_max_hits": 0}
        for f, key, into in (("memory.events", "oom_kill", "oom_kills"), ("pids.events", "max", "pids_max_hits")):
            try:
                for line in (self.dir / f).read_text().splitlines():
                    k, _, v = line.partition(" ")
                    if k == key:
                        out[into] = int(v)
            except (OSError, ValueError):
                pass
        return out

    def freeze(self, timeout_s: float = 5.0) -> bool:
        try:
            (self.dir / "cgroup.freeze").write_text("1")
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if "frozen 1" in (self.dir / "cgroup.events").read_text().splitlines():
                    return True
                time.sleep(0.005)
        except OSError as exc:  # removed meanwhile: the sandbox already ended
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise
        return False

    def thaw(self) -> None:
        try:
            (self.dir / "cgroup.freeze").write_text("0")
        except OSError as exc:  # removed meanwhile
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    def kill_all(self, timeout_s: float = 10.0) -> bool:
        """SIGKILL every member at once (cgroup.kill: frozen ones too, and no fork escapes it), and wait until the
        cgroup is empty."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.pids() or not self.exists():
                return True
            try:
                (self.dir / "cgroup.kill").write_text("1")
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENODEV):
                    raise
            time.sleep(0.01)
        return not self.pids()


def join_harness(name: str, shares: int = 2048) -> Path:
    """Move this process into `<own>/sandfleet-harness/<name>` (cpu controller), with more CPU shares than
    the sandboxes' tree (`<own>/sandfleet`): siblings, so no runner can starve the harness. On v2 the same dir in
    the one hierarchy, with cpu.weight for the shares."""
    if unified():
        base = delegated_root()
        (base / HARNESS).mkdir(exist_ok=True)
        _enable(base / HARNESS, ("cpu",))
        d = base / HARNESS / name
        d.mkdir(exist_ok=True)
        (d / "cpu.weight").write_text(str(shares_to_weight(shares)))
        (d / "cgroup.procs").write_text(str(os.getpid()))
        return d
    base = ROOT / "cpu" / own_path("cpu").lstrip("/")
    d = base / HARNESS / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.shares").write_text(str(shares))
    (d / "cgroup.procs").write_text(str(os.getpid()))
    return d


def leave_harness(d: Path | None) -> None:
    """Move this process back to where it came from (v2: the own cgroup's home) and remove its harness cgroup."""
    if d is None:
        return
    base = d.parent.parent
    try:
        (home(base) if unified() else base).joinpath("cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        pass
    for p in (d, d.parent):
        try:
            p.rmdir()
        except OSError:
            break


def harness_dirs() -> list[str]:
    base = _base(UNIFIED if unified() else "cpu") / HARNESS
    return sorted(str(p) for p in base.iterdir()) if base.is_dir() else []


def list_sandboxes(wave_id: str | None = None) -> list[tuple[str, str]]:
    """(wave_id, sandbox_id) for every sandbox cgroup left under this harness's cgroup."""
    base = procs_base() / MARK
    found = []
    if not base.is_dir():
        return found
    for wdir in sorted(base.iterdir()):
        if not wdir.is_dir() or (wave_id and wdir.name != wave_id):
            continue
        for sdir in sorted(wdir.iterdir()):
            if sdir.is_dir():
                found.append((wdir.name, sdir.name))
    return found
