"""The lazy file system from outside: `LazyFS` starts its process (``python -m fleet.lazyfs serve``), controls it and
unmounts it; `mounts()`, `processes()`, `is_mounted()` and `force_unmount()` are what the sweeps and leftover checks
use; `main` is the module's command line."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleet.lazyfs.cache import MARK, LazyFSError
from fleet.lazyfs.serve import check_available, serve

DESCRIPTION = ("A lazy file system for the crash disk modes: a FUSE passthrough with a page cache of its own "
               "(Jepsen's lazyfs model).")


def _mount_entries() -> list[tuple[str, str, str]]:
    """(mount point, fs type, source) of every mount this process sees."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) >= 5 and len(r) >= 2:
            mp = f[4].encode().decode("unicode_escape")
            out.append((mp, r[0], r[1]))
    return out


def mounts() -> list[dict]:
    """Every lazy mount on this machine (its source or type carries the marker): for the sweep and leftover checks."""
    return [{"mountpoint": mp, "source": src} for mp, typ, src in _mount_entries() if MARK in src or MARK in typ]


def processes() -> list[dict]:
    """Every serving process of the layer on this machine (argv `-m fleet.lazyfs serve ... sandfleet-lazyfs...`)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "fleet.lazyfs serve" in cmd and MARK in cmd:
            out.append({"pid": int(pid), "cmdline": cmd})
    return out


def is_mounted(mountpoint: str | os.PathLike) -> bool:
    mp = os.path.realpath(mountpoint)
    return any(m == mp and (MARK in typ or MARK in src) for m, typ, src in _mount_entries())


def force_unmount(mountpoint: str | os.PathLike) -> bool:
    """Unmount a lazy mount whatever holds it (fusermount3 -u, then a lazy -uz); True when it is gone."""
    mp = os.fspath(mountpoint)
    for args in (["-u"], ["-uz"]):
        if not is_mounted(mp):
            return True
        subprocess.run(["fusermount3", *args, mp], capture_output=True, timeout=30)
    return not is_mounted(mp)


class LazyFS:
    """A lazy mount served by its own process (``python -m fleet.lazyfs serve``), controlled from outside.

    ``LazyFS(backing, mountpoint, label=...).mount()`` returns once the kernel serves the mount; ``drop()``,
    ``tear(seed)``, ``stats()``, ``arm/wait/release`` act on it (see the module doc); ``unmount()`` is a clean
    unmount and ends the process by its PID. The control socket lives in a fresh 0700 dir under /run."""

    def __init__(self, backing: str | os.PathLike, mountpoint: str | os.PathLike, *, label: str = "",
                 undo_dir: str | os.PathLike | None = None, passthrough: bool = False, new_session: bool = False,
                 control_root: str = "/run") -> None:
        self.backing = os.path.realpath(backing)
        self.mountpoint = os.path.realpath(mountpoint)
        label = label or f"{os.getpid()}-{os.path.basename(self.mountpoint)}"
        self.label = re.sub(r"[^A-Za-z0-9._-]", "-", label)[:100]  # it goes into `-o fsname=`: no commas
        self.fsname = f"{MARK}.{self.label}"
        self.undo_dir = os.fspath(undo_dir) if undo_dir else None
        self.passthrough = passthrough
        self.new_session = new_session
        self.control_root = control_root
        self.proc: subprocess.Popen | None = None
        self.control_dir: str | None = None
        self.control: str | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def mount(self, timeout_s: float = 15.0) -> LazyFS:
        why = check_available()
        if why:
            raise LazyFSError(why)
        self.control_dir = tempfile.mkdtemp(prefix=f"{MARK}-", dir=self.control_root)  # mode 0700, root's
        self.control = os.path.join(self.control_dir, "control.sock")
        argv = [sys.executable, "-m", "fleet.lazyfs", "serve", "--backing", self.backing, "--mount", self.mountpoint,
                "--control", self.control, "--fsname", self.fsname]
        if self.undo_dir:
            argv += ["--undo-dir", self.undo_dir]
        if self.passthrough:
            argv += ["--passthrough"]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                          env.get("PYTHONPATH", "")]))
        log = open(os.path.join(self.control_dir, "serve.log"), "wb")
        try:
            self.proc = subprocess.Popen(argv, cwd="/", env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=self.new_session)
        finally:
            log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if self._call("ping", timeout_s=2)["ready"] and is_mounted(self.mountpoint):
                    return self
            except (OSError, LazyFSError):
                pass
            time.sleep(0.02)
        tail = self.log_tail()
        self.unmount(timeout_s=5)
        raise LazyFSError(f"the lazy mount at {self.mountpoint} did not come up in {timeout_s:.0f} s: {tail}")

    def alive(self) -> bool:
        """The serving process runs and the kernel still has the mount (False: a harness fault, not the runner's)."""
        return self.proc is not None and self.proc.poll() is None and is_mounted(self.mountpoint)

    def log_tail(self, n: int = 2000) -> str:
        try:
            return Path(self.control_dir, "serve.log").read_text(errors="replace")[-n:]
        except (OSError, TypeError):
            return ""

    def _call(self, op: str, timeout_s: float = 60.0, **kw) -> dict:
        if not self.control:
            raise LazyFSError("not mounted")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(self.control)
            s.sendall(json.dumps({"op": op, **kw}).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        out = json.loads(buf or b'{"ok": false, "error": "no answer"}')
        if not out.get("ok"):
            raise LazyFSError(f"lazyfs {op}: {out.get('error')}")
        return out

    def drop(self) -> dict:
        """Power loss (module doc); the receipt names files and bytes dropped and names undone."""
        return self._call("drop")["receipt"]

    def tear(self, seed: int) -> dict:
        """`drop()`, and the last unsynced write keeps a seeded prefix: the receipt's ``torn`` names it."""
        return self._call("tear", seed=int(seed))["receipt"]

    def sync(self) -> dict:
        return self._call("sync")["receipt"]

    def stats(self) -> dict:
        return self._call("stats")["stats"]

    def arm(self, kind: str, n: int) -> None:
        """Pause the operation that reaches boundary `kind` number `n` (write, fsync, rename; from 1) until release."""
        self._call("arm", kind=kind, n=int(n))

    def wait(self, kind: str, n: int, timeout_s: float = 30.0) -> dict | None:
        """Until the armed boundary is reached (its op paused): ``{"kind", "n", "path"}``, None on timeout."""
        return self._call("wait", timeout_s=timeout_s + 5, kind=kind, n=int(n), wait_s=timeout_s)["reached"]

    def release(self, kind: str | None = None, n: int | None = None) -> int:
        return self._call("release", kind=kind, n=n)["released"]

    def unmount(self, timeout_s: float = 10.0) -> dict:
        """Clean unmount (everything persists: drop() first for a power loss), then the process ends; by PID if it
        does not by itself. Always leaves no mount and no process; says how it went."""
        how = "clean"
        if self.control and self.proc and self.proc.poll() is None:
            try:
                self._call("release", timeout_s=5)
            except (OSError, LazyFSError):
                pass
        if is_mounted(self.mountpoint):
            r = subprocess.run(["fusermount3", "-u", self.mountpoint], capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                how = f"lazy ({r.stderr.strip()})"
                subprocess.run(["fusermount3", "-uz", self.mountpoint], capture_output=True, timeout=30)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                how += "; the process was sent SIGTERM"
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    how += ", then SIGKILL"
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        if is_mounted(self.mountpoint):
            force_unmount(self.mountpoint)
        rc = self.proc.returncode if self.proc else None
        if self.control_dir:
            shutil.rmtree(self.control_dir, ignore_errors=True)
        self.control = self.control_dir = None
        return {"how": how, "returncode": rc, "mounted": is_mounted(self.mountpoint)}

    def __enter__(self) -> LazyFS:
        return self.mount() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.unmount()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet.lazyfs", description=DESCRIPTION)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="mount and serve in the foreground (root)")
    s.add_argument("--backing", required=True)
    s.add_argument("--mount", required=True)
    s.add_argument("--control", required=True, help="the control socket's path (in a root-only dir)")
    s.add_argument("--fsname", default=MARK)
    s.add_argument("--undo-dir")
    s.add_argument("--passthrough", action="store_true", help="a plain passthrough: no cache, no undo")
    s.add_argument("--debug", action="store_true")
    c = sub.add_parser("ctl", help="one control call: ping, stats, drop, tear, sync, arm, wait, release")
    c.add_argument("--control", required=True)
    c.add_argument("op")
    c.add_argument("--seed", type=int)
    c.add_argument("--kind")
    c.add_argument("--n", type=int)
    a = ap.parse_args(argv)
    if a.cmd == "serve":
        if not a.fsname.startswith(MARK):
            ap.error(f"--fsname must start with {MARK} (the sweep finds mounts by it)")
        return serve(a.backing, a.mount, a.control, a.fsname, a.undo_dir, a.passthrough, a.debug)
    fs = LazyFS("/", "/")
    fs.control = a.control
    kw = {k: v for k, v in (("seed", a.seed), ("kind", a.kind), ("n", a.n)) if v is not None}
    print(json.dumps(fs._call(a.op, **kw), indent=1))
    return 0
