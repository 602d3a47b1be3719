"""The harness's place in the cgroup hierarchy, v1 or v2 (detected once: `mode()`): its own cgroup, the checks a
host must pass, v2 delegation (controllers enabled down the tree, processes moved to `sandfleet-home`), the
harness's own groups beside the sandboxes' tree, and the listing a sweep reads."""
from __future__ import annotations

import errno
import os
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


def enable(d: Path, controllers) -> None:
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
        enable(d, V2_CONTROLLERS)
    except OSError as exc:
        if exc.errno != errno.EBUSY or _is_root(d):
            raise CgroupSetupError(f"cannot enable {' '.join(V2_CONTROLLERS)} in {d}/cgroup.subtree_control: "
                                   f"{exc}; {HOW_TO_DELEGATE}") from exc
        _evacuate(d)
        enable(d, V2_CONTROLLERS)
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


def join_harness(name: str, shares: int = 2048) -> Path:
    """Move this process into `<own>/sandfleet-harness/<name>` (cpu controller), with more CPU shares than
    the sandboxes' tree (`<own>/sandfleet`): siblings, so no runner can starve the harness. On v2 the same dir in
    the one hierarchy, with cpu.weight for the shares."""
    if unified():
        base = delegated_root()
        (base / HARNESS).mkdir(exist_ok=True)
        enable(base / HARNESS, ("cpu",))
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
