"""cgroup v1 directories for sandboxes: memory + pids + freezer, under the harness's own
cgroup in each controller, at `<own>/sandfleet/<wave>/<sandbox>`. The path itself is
the marker a sweep uses to find leftovers after a crash."""
from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "freezer", "cpu")
MARK = "sandfleet"
HARNESS = "sandfleet-harness"  # the harness's own processes: a sibling of the sandboxes' tree, never its parent


class CgroupError(RuntimeError):
    pass


def own_path(controller: str, proc_cgroup: str = "/proc/self/cgroup") -> str:
    """This process's cgroup path in a v1 controller, with any sandfleet suffix cut off."""
    for line in Path(proc_cgroup).read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            parts = path.split("/")
            cut = next((i for i, p in enumerate(parts) if p in (MARK, HARNESS)), len(parts))
            path = "/".join(parts[:cut])
            return path if path not in ("/", "") else ""
    raise CgroupError(f"cgroup v1 controller {controller!r} is not mounted "
                      f"(need /sys/fs/cgroup/{controller}; run as root on a cgroup v1 host)")


def check_available() -> None:
    """Raise a clear error when the process backend cannot work here."""
    if os.geteuid() != 0:
        raise CgroupError("the process sandbox backend needs root (mount namespaces, tmpfs, cgroups); "
                          "run as root")
    for c in CONTROLLERS:
        if not (ROOT / c).is_dir():
            raise CgroupError(f"cgroup v1 controller {c!r} is not mounted at {ROOT / c}; "
                              "the process backend needs cgroup v1 memory, pids and freezer")
        own_path(c)


def wave_dir(controller: str, wave_id: str) -> Path:
    return ROOT / controller / own_path(controller).lstrip("/") / MARK / wave_id


class SandboxCgroup:
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


def join_harness(name: str, shares: int = 2048) -> Path:
    """Move this process into `<own>/sandfleet-harness/<name>` (cpu controller), with more CPU shares than
    the sandboxes' tree (`<own>/sandfleet`): siblings, so no runner can starve the harness."""
    base = ROOT / "cpu" / own_path("cpu").lstrip("/")
    d = base / HARNESS / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.shares").write_text(str(shares))
    (d / "cgroup.procs").write_text(str(os.getpid()))
    return d


def leave_harness(d: Path | None) -> None:
    """Move this process back to where it came from and remove its harness cgroup."""
    if d is None:
        return
    base = d.parent.parent
    try:
        (base / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        pass
    for p in (d, d.parent):
        try:
            p.rmdir()
        except OSError:
            break


def harness_dirs() -> list[str]:
    base = ROOT / "cpu" / own_path("cpu").lstrip("/") / HARNESS
    return sorted(str(p) for p in base.iterdir()) if base.is_dir() else []


def list_sandboxes(wave_id: str | None = None) -> list[tuple[str, str]]:
    """(wave_id, sandbox_id) for every sandbox cgroup left under this harness's cgroup."""
    base = ROOT / "pids" / own_path("pids").lstrip("/") / MARK
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
