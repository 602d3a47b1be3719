"""A sandbox's cgroup: one dir per v1 controller (`SandboxCgroup`) or one v2 leaf (`UnifiedSandboxCgroup`), made
and limited from outside, frozen, killed and removed by the host."""
from __future__ import annotations

import errno
import os
import signal
import time

from fleet.cgroups.hierarchy import (CONTROLLERS, MARK, UNIFIED, V2_CONTROLLERS, CgroupError, delegated_root, enable,
                                     shares_to_weight, unified, wave_dir)


def procs_of(cgroup_dir) -> list[int]:
    """The PIDs in a cgroup, [] once it is gone: ENOENT, or ENODEV when it went between open and read."""
    try:
        text = (cgroup_dir / "cgroup.procs").read_text()
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENODEV):
            return []
        raise
    return [int(p) for p in text.split()]


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
        return procs_of(self.dirs["pids"])

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
                    enable(d, V2_CONTROLLERS)
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
        return procs_of(self.dir)

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
