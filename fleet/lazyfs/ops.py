"""The lazy file system's operations over a backing dir (mfusepy's path-based API): `LazyOps`, composed of its name
operations, file data and crash control, with the attribute and directory operations here."""
from __future__ import annotations

import os
import stat as statmod
import threading
from collections.abc import Callable

from fleet.lazyfs.cache import MARK, LazyFSError, Node, Undo
from fleet.lazyfs.crash import CrashOps
from fleet.lazyfs.data import DataOps
from fleet.lazyfs.names import NameOps


class LazyOps(NameOps, DataOps, CrashOps):
    """The file system's operations over `backing` (mfusepy's path-based API), and its control: drop, tear, stats.

    `passthrough=True` is a plain FUSE passthrough (writes and names go straight to the backing dir, nothing is
    cached or undone): the benchmark's third column. `caller` returns the calling (uid, gid) for ownership of new
    names (the FUSE context when mounted; None in-process)."""

    use_ns = True

    def __init__(self, backing: str | os.PathLike, undo_dir: str | os.PathLike | None = None, *,
                 on_boundary: Callable[[str, int, str | None], None] | None = None, passthrough: bool = False,
                 caller: Callable[[], tuple[int, int] | None] | None = None,
                 max_dirty_bytes: int = 512 << 20) -> None:
        self.root = os.path.realpath(backing)
        if not os.path.isdir(self.root):
            raise LazyFSError(f"backing dir {self.root} does not exist")
        self.passthrough = passthrough
        self.on_boundary = on_boundary
        self.caller = caller or (lambda: None)
        self._lock = threading.RLock()
        self._nodes: dict[tuple[int, int], Node] = {}
        self._fh: dict[int, Node] = {}
        self._dirfh: dict[int, int] = {}
        self._next_fh = 1
        self._undo: list[Undo] = []
        self._dirs: dict[tuple[int, int], list[int]] = {}  # dir key -> [fd, refs] for undo entries
        self._seq = 0
        self._last_write: tuple[Node, int, bytes, str | None] | None = None
        self.max_dirty_bytes = max_dirty_bytes
        self._dirty_total = 0  # bytes written since their file's last persist (an overwrite counts again)
        self._free = 0  # the backing file system's free bytes, as last asked
        self._free_age = 0
        self.counts = {"writes": 0, "write_bytes": 0, "fsyncs": 0, "dir_fsyncs": 0, "renames": 0, "creates": 0,
                       "unlinks": 0, "mkdirs": 0, "rmdirs": 0, "truncates": 0, "drops": 0, "tears": 0,
                       "early_writebacks": 0}
        self._n = {"write": 0, "fsync": 0, "rename": 0}
        self.undo_dir = None
        if not passthrough:
            self.undo_dir = os.path.realpath(undo_dir or os.path.join(
                os.path.dirname(self.root), f".{os.path.basename(self.root)}.{MARK}-undo"))
            os.makedirs(self.undo_dir, mode=0o700, exist_ok=True)
            if os.stat(self.undo_dir).st_dev != os.stat(self.root).st_dev:
                raise LazyFSError(f"undo dir {self.undo_dir} is not on the backing dir's file system ({self.root}): "
                                  "name an undo_dir beside the backing dir")
            self._undo_fd = os.open(self.undo_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    # ---- helpers

    def _b(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/")) if path not in ("/", "") else self.root

    def _boundary(self, kind: str, path: str | None) -> None:
        with self._lock:
            self._n[kind] += 1
            n = self._n[kind]
        if self.on_boundary is not None:
            self.on_boundary(kind, n, path)

    # ---- attributes and reads of names

    def getattr(self, path: str | None, fh: int | None = None) -> dict:
        node = self._fh.get(fh) if fh else None
        st = os.fstat(node.fd) if node is not None else os.lstat(self._b(path or "/"))
        if node is None and statmod.S_ISREG(st.st_mode):
            node = self._nodes.get((st.st_dev, st.st_ino))
        out = {k: getattr(st, k) for k in ("st_mode", "st_ino", "st_dev", "st_nlink", "st_uid", "st_gid", "st_size",
                                           "st_blocks", "st_rdev", "st_blksize")}
        out["st_atime"], out["st_mtime"], out["st_ctime"] = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        if node is not None and node.dirty:
            with self._lock:
                out["st_size"] = node.size
                out["st_blocks"] = (node.size + 511) // 512
                if node.mtime_ns:
                    out["st_mtime"] = out["st_ctime"] = node.mtime_ns
        return out

    def readlink(self, path: str) -> str:
        return os.readlink(self._b(path))

    def statfs(self, path: str) -> dict:
        sv = os.statvfs(self.root)
        return {k: getattr(sv, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                                             "f_ffree", "f_favail", "f_flag", "f_namemax")}

    def chmod(self, path: str | None, mode: int, fh: int | None = None) -> int:
        node = self._fh.get(fh) if fh else None
        if node is not None:
            os.fchmod(node.fd, mode)
        else:
            os.chmod(self._b(path or "/"), mode)
        return 0

    def chown(self, path: str | None, uid: int, gid: int, fh: int | None = None) -> int:
        node = self._fh.get(fh) if fh else None
        if node is not None:
            os.fchown(node.fd, uid, gid)
        else:
            os.chown(self._b(path or "/"), uid, gid, follow_symlinks=False)
        return 0

    def utimens(self, path: str | None, times: tuple[int, int] | None = None, fh: int | None = None) -> int:
        node = self._fh.get(fh) if fh else None
        target = node.fd if node is not None else self._b(path or "/")
        if times is None:
            os.utime(target)
        else:
            os.utime(target, ns=(int(times[0]), int(times[1])))
        if node is not None:
            node.mtime_ns = 0
        return 0

    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        os.setxattr(self._b(path), name, value, options, follow_symlinks=False)
        return 0

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        return os.getxattr(self._b(path), name, follow_symlinks=False)

    def listxattr(self, path: str) -> list[str]:
        return os.listxattr(self._b(path), follow_symlinks=False)

    def removexattr(self, path: str, name: str) -> int:
        os.removexattr(self._b(path), name, follow_symlinks=False)
        return 0

    # ---- directories

    def opendir(self, path: str) -> int:
        fd = os.open(self._b(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._dirfh[fh] = fd
            return fh

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict, int]]:
        """Entries with their inode and type (an entry of inode 0 is skipped by glibc's readdir)."""
        bpath = self._b(path)
        out = [(".", {"st_ino": os.stat(bpath).st_ino, "st_mode": statmod.S_IFDIR}, 0),
               ("..", {"st_ino": os.stat(os.path.dirname(bpath)).st_ino, "st_mode": statmod.S_IFDIR}, 0)]
        with os.scandir(bpath) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    mode = statmod.S_IFDIR
                elif e.is_file(follow_symlinks=False):
                    mode = statmod.S_IFREG
                elif e.is_symlink():
                    mode = statmod.S_IFLNK
                else:
                    mode = statmod.S_IFMT(e.stat(follow_symlinks=False).st_mode)
                out.append((e.name, {"st_ino": e.inode(), "st_mode": mode}, 0))
        return out

    def releasedir(self, path: str | None, fh: int) -> int:
        with self._lock:
            fd = self._dirfh.pop(fh, None)
        if fd is not None:
            os.close(fd)
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        fd = self._dirfh.get(fh)
        if fd is None:
            fd_owned = os.open(self._b(path or "/"), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            fd_owned = None
        try:
            st = os.fstat(fd if fd is not None else fd_owned)
            key = (st.st_dev, st.st_ino)
            with self._lock:
                self.counts["dir_fsyncs"] += 1
                if not self.passthrough:
                    keep = []
                    for u in self._undo:
                        if u.dir_key == key:
                            self._forget(u)
                        else:
                            keep.append(u)
                    self._undo = keep
                    self._forget_unreachable()
            os.fsync(fd if fd is not None else fd_owned)
        finally:
            if fd_owned is not None:
                os.close(fd_owned)
        self._boundary("fsync", path)
        return 0

    def _forget_unreachable(self) -> None:
        """Drop the cache of files no name and no open file reaches any more (unlinked or replaced, durably): their
        unsynced data can never be read or persisted."""
        for node in [n for n in self._nodes.values() if n.refs <= 0]:
            if os.fstat(node.fd).st_nlink == 0:
                self._dirty_total = max(0, self._dirty_total - node.extents.nbytes())
                self._nodes.pop(node.key, None)
                if self._last_write is not None and self._last_write[0] is node:
                    self._last_write = None
                os.close(node.fd)
