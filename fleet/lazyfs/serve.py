"""The lazy file system's own process: the FUSE mount (`serve`, root, ``allow_other``) and its control socket, whose
protocol is one JSON line per call (ping, stats, drop, tear, sync, arm, wait, release)."""
from __future__ import annotations

import json
import os
import shutil
import socketserver
import threading

from fleet.lazyfs.boundaries import Boundaries
from fleet.lazyfs.cache import MARK
from fleet.lazyfs.ops import LazyOps


def check_available() -> str | None:
    """None when a lazy mount can run here, else what is missing (for a bad-input exit before anything runs)."""
    missing = []
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse (modprobe fuse)")
    if shutil.which("fusermount3") is None:
        missing.append("fusermount3 (Debian's fuse3 package)")
    if os.geteuid() != 0:
        missing.append("root (the layer mounts with allow_other for the sandbox's uid)")
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        missing.append(f"mfusepy with libfuse3 ({exc})")
    return ("lazy file system unavailable: missing " + "; ".join(missing)) if missing else None


def _fuse_class():
    import ctypes

    import mfusepy

    class _Fuse(mfusepy.FUSE):
        """mfusepy drops rename's flags and the file handle of ftruncate/fchmod/fchown/futimens: pass them on."""

        def _p(self, path):
            return None if path is None else path.decode(self.encoding, self.errors)

        def rename_fuse_3(self, old, new, flags):
            return self.operations.rename(self._p(old), self._p(new), flags)

        def truncate_fuse_3(self, path, length, fip):
            return self.operations.truncate(self._p(path), length, fip.contents.fh if fip else None)

        def chmod_fuse_3(self, path, mode, fip):
            return self.operations.chmod(self._p(path), mode, fip.contents.fh if fip else None)

        def chown_fuse_3(self, path, uid, gid, fip):
            uid = -1 if mfusepy.c_uid_t(uid + 1).value == 0 else uid
            gid = -1 if mfusepy.c_gid_t(gid + 1).value == 0 else gid
            return self.operations.chown(self._p(path), uid, gid, fip.contents.fh if fip else None)

        def utimens_fuse_3(self, path, buf, fip):
            times = None
            if buf:
                times = (mfusepy.time_of_timespec(buf.contents.actime, use_ns=True),
                         mfusepy.time_of_timespec(buf.contents.modtime, use_ns=True))
            return self.operations.utimens(self._p(path), times, fip.contents.fh if fip else None)

    del ctypes
    return _Fuse, mfusepy


def _set_comm(name: str) -> None:
    """The process name (`comm`, 15 bytes) carries the project's marker too."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


class ControlServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, ops: LazyOps, bounds: Boundaries, ready: threading.Event) -> None:
        self.ops, self.bounds, self.ready = ops, bounds, ready
        super().__init__(path, _ControlHandler)


def printable(v):
    """An answer whose paths a runner named: a name that is not UTF-8 (a surrogate, as os decodes it) is shown
    escaped (`odd\\xffname`), so every record the harness writes from it stays valid UTF-8 JSON."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
            return v
        except UnicodeEncodeError:
            return v.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(v, dict):
        return {printable(k): printable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [printable(x) for x in v]
    return v


class _ControlHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        try:
            req = json.loads(self.rfile.readline() or b"{}")
            out = {"ok": True, **self._do(req)}
        except Exception as exc:  # noqa: BLE001 - every failure is answered, never a dropped connection
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self.wfile.write(json.dumps(printable(out)).encode() + b"\n")

    def _do(self, req: dict) -> dict:
        ops, bounds, op = self.server.ops, self.server.bounds, req.get("op")
        if op == "ping":
            return {"pid": os.getpid(), "ready": self.server.ready.is_set()}
        if op == "stats":
            return {"stats": ops.stats()}
        if op == "drop":
            return {"receipt": ops.drop()}
        if op == "tear":
            return {"receipt": ops.tear(int(req["seed"]))}
        if op == "sync":
            return {"receipt": ops.sync_all()}
        if op == "arm":
            bounds.arm(req["kind"], int(req["n"]))
            return {}
        if op == "wait":
            return {"reached": bounds.wait(req["kind"], int(req["n"]), float(req.get("wait_s", 30)))}
        if op == "release":
            return {"released": bounds.release(req.get("kind"), req.get("n"))}
        raise ValueError(f"unknown op {op!r}: one of ping, stats, drop, tear, sync, arm, wait, release")


def serve(backing: str, mountpoint: str, control: str, fsname: str, undo_dir: str | None = None,
          passthrough: bool = False, debug: bool = False) -> int:
    """Mount and serve until unmounted (fusermount3 -u, or SIGTERM/SIGINT: libfuse unmounts then)."""
    _set_comm(MARK)
    Fuse, mfusepy = _fuse_class()
    bounds = Boundaries()
    ready = threading.Event()

    def caller() -> tuple[int, int]:
        uid, gid, _ = mfusepy.fuse_get_context()
        return uid, gid

    ops = LazyOps(backing, undo_dir, on_boundary=bounds, passthrough=passthrough, caller=caller)

    def init_with_config(conn, config) -> None:
        # the kernel caches no name, attribute or absence: after a drop, the next lookup sees the backing dir
        config.entry_timeout = config.attr_timeout = config.negative_timeout = 0.0
        config.hard_remove = 1  # an unlinked open file is unlinked, not renamed to .fuse_hidden*
        config.use_ino = 1
        conn.max_write = 1 << 20  # one request per MiB written, not eight (libfuse's buffer holds 256 pages)
        ready.set()

    ops.init_with_config = init_with_config  # type: ignore[attr-defined]
    if os.path.exists(control):
        os.unlink(control)
    server = ControlServer(control, ops, bounds, ready)
    os.chmod(control, 0o600)
    threading.Thread(target=server.serve_forever, name="lazyfs-control", daemon=True).start()
    try:
        Fuse(ops, mountpoint, foreground=True, allow_other=True, default_permissions=True, fsname=fsname,
             subtype=MARK, debug=debug)
    finally:
        bounds.release()
        server.shutdown()
        server.server_close()
        try:
            os.unlink(control)
        except OSError:
            pass
    return 0
