"""A lazy file system for the crash disk modes: a FUSE passthrough with a page cache of its own (Jepsen's lazyfs model).

The mount shows a backing directory. What survives a power loss is exactly what the backing directory holds:

- **Data.** A write goes to an in-memory cache of unsynced data (per file: the extents written since its last fsync,
  its logical size, and a truncation floor); a read sees the cache over the backing file (read-your-writes); a
  truncate (and an open with O_TRUNC) is cached the same way. ``fsync``/``fdatasync`` of a file writes its cached
  extents and size to the backing file and fsyncs that. Closing a file persists nothing (the page cache outlives it).
- **Names.** create, mknod, symlink, link, mkdir, unlink, rmdir and rename are applied to the backing directory at
  once and recorded in an undo log, each under the directory whose fsync makes it durable: the parent of the name
  made or removed; for a rename, the directory it moved into (a rename is durable as one unit, never half). An
  fsync of a directory (opendir + fsync) makes every recorded operation of that directory durable. An unlinked file
  (or a file a rename replaced) is kept by a hard link in the undo dir, beside the backing dir on the same file
  system, until the operation is durable. Attributes (chmod, chown, utimens, xattrs) are applied at once, never
  undone.
- **drop()** is a power loss: every unsynced extent and truncation is forgotten, and the undo log is replayed
  backwards, so every name operation since its directory's last fsync is undone (a directory whose mkdir is undone
  goes with everything in it). The receipt names the files and bytes dropped and every name operation undone.
- **tear(seed)** is ``drop()`` where the write in flight, the last unsynced write to the mount (the one a boundary
  pause holds), keeps a seeded prefix: ``random.Random(seed).randrange(1, n)`` of its ``n`` bytes (0 for a 1-byte
  write) reach the backing file at the write's offset, as if that write alone had been partly on the platter.
  Earlier unsynced writes are dropped (a hole reads as zeros). The same seed and write give the same prefix.
- **Boundaries.** Every write, fsync (of a file or a directory) and rename is counted from 1 per kind; the hook
  ``on_boundary(kind, n, path)`` is called in the operation's FUSE thread right after the Nth write is cached, right
  before the Nth fsync returns (its data already persisted), right after the Nth rename was applied. A hook that
  blocks holds the caller's system call (a SIGKILLed caller stays in it until release): :class:`Boundaries` arms
  ``(kind, n)`` pauses that a harness waits for, kills at, and releases; drop, tear and unmount release them all.
- **Space.** A write whose unsynced data would not fit in the backing file system's free space is ENOSPC (a size-
  limited volume answers at write time, as a real disk does). Past ``max_dirty_bytes`` of cache (512 MiB) a file is
  written back early, as the kernel's writeback does: unsynced data may survive a crash, only its loss is promised
  never; ``stats()["early_writebacks"]`` counts them.
- **When.** Drop or tear once the volume's users are dead (a power loss kills them too): a process that keeps a
  file open across a drop may still read pages the kernel cached before it; new opens, lookups and stats see the
  backing dir (the mount has no name or attribute cache, and an open drops the file's cached pages).
- **A clean unmount** persists everything (as umount writes back the page cache): call ``drop()`` first for a power
  loss. A killed FUSE process loses its cache with no undo (a harness fault, not a mode).

Not modelled: ``sync(1)``/``syncfs`` (the high-level FUSE API never sees them; only per-file and per-directory fsync
persist), RENAME_EXCHANGE (EINVAL), mmap writes are writes like any other (the kernel sends them as writes).

The FUSE layer runs in its own process, ``python -m fleet.lazyfs serve`` (root, ``allow_other`` and
``default_permissions`` so uid 65534 inside a sandbox can use it, fsname ``sandfleet-lazyfs.<label>``), controlled
through a unix socket in a root-only (0700) dir that a sandbox never sees. :class:`LazyFS` starts, controls and
unmounts it; :class:`LazyOps` is the same logic in-process (the unit tests call it directly, with no kernel).
"""
from __future__ import annotations

import argparse
import bisect
import errno
import json
import os
import random
import re
import shutil
import signal
import socket
import socketserver
import stat as statmod
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MARK = "sandfleet-lazyfs"
KINDS = ("write", "fsync", "rename")
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


class LazyFSError(RuntimeError):
    """The layer cannot run here, or its process did not answer."""


# --------------------------------------------------------------------------------------------------- the data cache


class Extents:
    """Sorted, non-overlapping byte extents of unsynced data; adjacent or overlapping writes merge (later wins)."""

    __slots__ = ("starts", "bufs")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.bufs: list[bytearray] = []

    def write(self, off: int, data: bytes) -> None:
        end = off + len(data)
        starts, bufs = self.starts, self.bufs
        if not starts or starts[-1] + len(bufs[-1]) < off:  # past every extent: the append of a new one
            starts.append(off)
            bufs.append(bytearray(data))
            return
        if starts[-1] + len(bufs[-1]) == off:  # a journal's append: grow the last extent in place
            bufs[-1] += data
            return
        i = bisect.bisect_right(starts, off) - 1
        if i < 0 or starts[i] + len(bufs[i]) < off:
            i += 1
        j = i
        while j < len(starts) and starts[j] <= end:
            j += 1
        if i == j:
            starts.insert(i, off)
            bufs.insert(i, bytearray(data))
            return
        if j == i + 1 and starts[i] <= off and end <= starts[i] + len(bufs[i]):  # an overwrite inside one extent
            bufs[i][off - starts[i]:end - starts[i]] = data
            return
        lo = min(starts[i], off)
        hi = max(starts[j - 1] + len(bufs[j - 1]), end)
        merged = bytearray(hi - lo)
        for k in range(i, j):
            merged[starts[k] - lo:starts[k] - lo + len(bufs[k])] = bufs[k]
        merged[off - lo:end - lo] = data
        starts[i:j] = [lo]
        bufs[i:j] = [merged]

    def truncate(self, size: int) -> None:
        while self.starts and self.starts[-1] >= size:
            self.starts.pop()
            self.bufs.pop()
        if self.starts and self.starts[-1] + len(self.bufs[-1]) > size:
            del self.bufs[-1][size - self.starts[-1]:]

    def overlay(self, off: int, buf: bytearray) -> None:
        """Copy every cached byte of [off, off + len(buf)) into buf."""
        end = off + len(buf)
        i = max(bisect.bisect_right(self.starts, off) - 1, 0)
        while i < len(self.starts) and self.starts[i] < end:
            s, b = self.starts[i], self.bufs[i]
            lo, hi = max(s, off), min(s + len(b), end)
            if lo < hi:
                buf[lo - off:hi - off] = b[lo - s:hi - s]
            i += 1

    def items(self) -> list[tuple[int, bytearray]]:
        return list(zip(self.starts, self.bufs))

    def nbytes(self) -> int:
        return sum(len(b) for b in self.bufs)

    def clear(self) -> None:
        self.starts.clear()
        self.bufs.clear()


@dataclass(eq=False)
class Node:
    """One backing file (by device and inode) while it is open or holds unsynced data; its fd keeps the inode alive."""

    key: tuple[int, int]
    fd: int
    refs: int = 0
    dirty: bool = False
    size: int = 0  # logical size, while dirty
    floor: int = 0  # bytes of the backing file still valid under the cache (lowered by truncation), while dirty
    extents: Extents = field(default_factory=Extents)
    writes: int = 0  # unsynced writes
    mtime_ns: int = 0


@dataclass
class Undo:
    """A name operation not yet durable: `dir_key` is the directory whose fsync makes it durable."""

    seq: int
    op: str  # create | unlink | rmdir | rename
    dir_key: tuple[int, int]
    path: str  # as the mount named it, for receipts
    dirfd: int  # the directory the name lives in (create/unlink/rmdir), or the rename's destination dir
    name: str
    ino: int = 0
    isdir: bool = False
    stash: str | None = None  # a hard link in the undo dir: the unlinked file, or the file a rename replaced
    src_dirfd: int = -1  # rename: the source directory
    src_name: str = ""
    replaced_dir: tuple[int, int, int] | None = None  # rename over an empty dir: its (mode, uid, gid)
    mode: int = 0o755  # rmdir: the removed dir's mode, uid, gid
    uid: int = 0
    gid: int = 0


def _err(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class Boundaries:
    """Armed ``(kind, n)`` pauses: the operation that reaches one blocks in its FUSE thread until released.

    Use as ``LazyOps(on_boundary=Boundaries())``; the serving process has one behind its control socket. A pause is
    bounded (``max_pause_s``) so a harness that forgets to release never wedges a mount for good."""

    def __init__(self, max_pause_s: float = 600.0) -> None:
        self._cv = threading.Condition()
        self._armed: dict[tuple[str, int], dict] = {}
        self.max_pause_s = max_pause_s

    def arm(self, kind: str, n: int) -> None:
        if kind not in KINDS or int(n) < 1:
            raise ValueError(f"boundary ({kind!r}, {n!r}): kind must be one of {', '.join(KINDS)} and n >= 1")
        with self._cv:
            self._armed[(kind, int(n))] = {"kind": kind, "n": int(n), "path": None, "reached": False,
                                           "released": False}

    def __call__(self, kind: str, n: int, path: str | None) -> None:
        with self._cv:
            st = self._armed.get((kind, n))
            if st is None or st["released"]:
                return
            st["reached"], st["path"], st["t"] = True, path, time.time()
            self._cv.notify_all()
            self._cv.wait_for(lambda: st["released"], timeout=self.max_pause_s)
            self._armed.pop((kind, n), None)

    def wait(self, kind: str, n: int, timeout_s: float) -> dict | None:
        """Until the armed boundary is reached: ``{"kind", "n", "path"}``, or None on timeout / not armed."""
        with self._cv:
            st = self._armed.get((kind, int(n)))
            if st is None:
                return None
            if not self._cv.wait_for(lambda: st["reached"], timeout=timeout_s):
                return None
            return {"kind": kind, "n": int(n), "path": st["path"]}

    def release(self, kind: str | None = None, n: int | None = None) -> int:
        """Let paused operations go on and disarm the rest (all of them with no arguments); how many were paused."""
        with self._cv:
            hit = [k for k in self._armed if (kind is None or k[0] == kind) and (n is None or k[1] == int(n))]
            paused = 0
            for k in hit:
                st = self._armed[k]
                if st["reached"]:
                    st["released"] = True
                    paused += 1
                else:
                    del self._armed[k]
            self._cv.notify_all()
            return paused

    def paused(self) -> list[dict]:
        with self._cv:
            return [{"kind": s["kind"], "n": s["n"], "path": s["path"]} for s in self._armed.values()
                    if s["reached"] and not s["released"]]


# ------------------------------------------------------------------------------------------------ the operations


class LazyOps:
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

    def _node_for_fd(self, fd: int) -> Node:
        """The node of an fd just opened on a backing file (the fd is closed if the node already has one)."""
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with self._lock:
            node = self._nodes.get(key)
            if node is None:
                node = self._nodes[key] = Node(key, fd)
            else:
                os.close(fd)
            node.refs += 1
            return node

    def _new_fh(self, node: Node) -> int:
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._fh[fh] = node
            return fh

    def _unref(self, node: Node) -> None:
        node.refs -= 1
        if node.refs <= 0 and not node.dirty:
            self._nodes.pop(node.key, None)
            os.close(node.fd)

    def _dirty(self, node: Node) -> None:
        if not node.dirty:
            node.size = node.floor = os.fstat(node.fd).st_size
            node.dirty = True

    def _parent(self, path: str) -> tuple[int, str, tuple[int, int]]:
        """An fd on the backing parent dir of `path` (shared per dir while undo entries use it), the name, the key."""
        parent, name = os.path.split(self._b(path))
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        held = self._dirs.get(key)
        if held is not None:
            os.close(fd)
            return held[0], name, key
        self._dirs[key] = [fd, 0]
        return fd, name, key

    def _done_with_dir(self, key: tuple[int, int]) -> None:
        held = self._dirs.get(key)
        if held is not None and held[1] <= 0:
            os.close(held[0])
            del self._dirs[key]

    def _record(self, u: Undo, *extra_dirs: tuple[int, int]) -> None:
        self._seq += 1
        u.seq = self._seq
        for k in (u.dir_key, *extra_dirs):
            self._dirs[k][1] += 1
        u._dirs = (u.dir_key, *extra_dirs)  # type: ignore[attr-defined]
        self._undo.append(u)

    def _forget(self, u: Undo) -> None:
        if u.stash:
            try:
                os.unlink(u.stash, dir_fd=self._undo_fd)
            except FileNotFoundError:
                pass
        for k in u._dirs:  # type: ignore[attr-defined]
            self._dirs[k][1] -= 1
            self._done_with_dir(k)

    def _stash(self, dirfd: int, name: str) -> str:
        self._seq += 1
        stash = f"u{self._seq}"
        os.link(name, stash, src_dir_fd=dirfd, dst_dir_fd=self._undo_fd, follow_symlinks=False)
        return stash

    def _own(self, dirfd: int, name: str) -> None:
        who = self.caller()
        if who and who[0] != os.geteuid():
            os.chown(name, who[0], who[1], dir_fd=dirfd, follow_symlinks=False)

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

    def mkdir(self, path: str, mode: int) -> int:
        with self._lock:
            dirfd, name, key = self._parent(path)
            try:
                os.mkdir(name, mode, dir_fd=dirfd)
                self._own(dirfd, name)
                self.counts["mkdirs"] += 1
                if not self.passthrough:
                    ino = os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_ino
                    self._record(Undo(0, "create", key, path, dirfd, name, ino=ino, isdir=True))
            finally:
                self._done_with_dir(key)
        return 0

    def rmdir(self, path: str) -> int:
        with self._lock:
            dirfd, name, key = self._parent(path)
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                os.rmdir(name, dir_fd=dirfd)
                self.counts["rmdirs"] += 1
                if not self.passthrough:
                    self._record(Undo(0, "rmdir", key, path, dirfd, name, mode=statmod.S_IMODE(st.st_mode),
                                      uid=st.st_uid, gid=st.st_gid))
            finally:
                self._done_with_dir(key)
        return 0

    # ---- names

    def _made(self, path: str, make: Callable[[int, str], None]) -> None:
        """Apply a name-making operation in the parent dir and record its undo."""
        with self._lock:
            dirfd, name, key = self._parent(path)
            try:
                make(dirfd, name)
                self._own(dirfd, name)
                self.counts["creates"] += 1
                if not self.passthrough:
                    ino = os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_ino
                    self._record(Undo(0, "create", key, path, dirfd, name, ino=ino))
            finally:
                self._done_with_dir(key)

    def mknod(self, path: str, mode: int, dev: int) -> int:
        self._made(path, lambda d, n: os.mknod(n, mode, dev, dir_fd=d))
        return 0

    def symlink(self, target: str, source: str) -> int:
        """`target` is the new link's path in the mount, `source` what it points to (mfusepy's order)."""
        self._made(target, lambda d, n: os.symlink(source, n, dir_fd=d))
        return 0

    def link(self, target: str, source: str) -> int:
        self._made(target, lambda d, n: os.link(self._b(source), n, dst_dir_fd=d, follow_symlinks=False))
        return 0

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        holder: list[int] = []

        def make(dirfd: int, name: str) -> None:
            holder.append(os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, mode, dir_fd=dirfd))

        try:
            self._made(path, make)
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
            return self.open(path, flags)  # another opener made it first: O_CREAT without O_EXCL opens it
        return self._new_fh(self._node_for_fd(holder[0]))

    def unlink(self, path: str) -> int:
        with self._lock:
            dirfd, name, key = self._parent(path)
            try:
                stash = None if self.passthrough else self._stash(dirfd, name)
                try:
                    os.unlink(name, dir_fd=dirfd)
                except OSError:
                    if stash:
                        os.unlink(stash, dir_fd=self._undo_fd)
                    raise
                self.counts["unlinks"] += 1
                if stash:
                    self._record(Undo(0, "unlink", key, path, dirfd, name, stash=stash))
            finally:
                self._done_with_dir(key)
        return 0

    def rename(self, old: str, new: str, flags: int = 0) -> int:
        if flags & RENAME_EXCHANGE:
            raise _err(errno.EINVAL)
        with self._lock:
            sfd, sname, skey = self._parent(old)
            dfd, dname, dkey = self._parent(new)
            try:
                src = os.stat(sname, dir_fd=sfd, follow_symlinks=False)
                try:
                    dst = os.stat(dname, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    dst = None
                if dst is not None and flags & RENAME_NOREPLACE:
                    raise _err(errno.EEXIST)
                stash, replaced_dir = None, None
                if dst is not None and not self.passthrough and (dst.st_dev, dst.st_ino) != (src.st_dev, src.st_ino):
                    if statmod.S_ISDIR(dst.st_mode):
                        replaced_dir = (statmod.S_IMODE(dst.st_mode), dst.st_uid, dst.st_gid)
                    else:
                        stash = self._stash(dfd, dname)
                try:
                    os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
                except OSError:
                    if stash:
                        os.unlink(stash, dir_fd=self._undo_fd)
                    raise
                self.counts["renames"] += 1
                if not self.passthrough:
                    self._record(Undo(0, "rename", dkey, f"{old} -> {new}", dfd, dname, ino=src.st_ino,
                                      isdir=statmod.S_ISDIR(src.st_mode), stash=stash, src_dirfd=sfd, src_name=sname,
                                      replaced_dir=replaced_dir), skey)
            finally:
                self._done_with_dir(skey)
                self._done_with_dir(dkey)
        self._boundary("rename", new)
        return 0

    # ---- file data

    def open(self, path: str, flags: int) -> int:
        bpath = self._b(path)
        try:
            fd = os.open(bpath, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            fd = os.open(bpath, os.O_RDONLY | os.O_CLOEXEC)
        node = self._node_for_fd(fd)
        fh = self._new_fh(node)
        if flags & os.O_TRUNC:
            self.truncate(path, 0, fh)
        return fh

    def read(self, path: str | None, size: int, off: int, fh: int) -> bytes:
        node = self._fh[fh]
        if self.passthrough or not node.dirty:
            return os.pread(node.fd, size, off)
        with self._lock:
            if not node.dirty:
                return os.pread(node.fd, size, off)
            if off >= node.size:
                return b""
            n = min(size, node.size - off)
            buf = bytearray(n)
            if off < node.floor:
                got = os.pread(node.fd, min(n, node.floor - off), off)
                buf[:len(got)] = got
            node.extents.overlay(off, buf)
            return bytes(buf)

    def write(self, path: str | None, data: bytes, off: int, fh: int) -> int:
        node = self._fh[fh]
        if self.passthrough:
            n = os.pwrite(node.fd, data, off)
        else:
            n = len(data)
            with self._lock:
                self._room(node, n)
                self._dirty(node)
                node.extents.write(off, data)
                node.size = max(node.size, off + n)
                node.writes += 1
                node.mtime_ns = time.time_ns()
                self._last_write = (node, off, data, path)
        with self._lock:
            self.counts["writes"] += 1
            self.counts["write_bytes"] += n
        self._boundary("write", path)
        return n

    def _room(self, node: Node, n: int) -> None:
        """ENOSPC when the unsynced data would not fit in the backing file system (as a real disk answers at write
        time); past `max_dirty_bytes` of cache, this file is written back early, as the kernel's writeback does
        (unsynced data may always survive a crash: only its loss is not promised)."""
        self._dirty_total += n
        self._free_age += 1
        if self._dirty_total > self._free // 2 or self._free_age >= 256:
            sv = os.statvfs(self.root)
            self._free, self._free_age = sv.f_bavail * sv.f_frsize, 0
            if self._dirty_total > self._free:
                self._dirty_total -= n
                raise _err(errno.ENOSPC)
        if self._dirty_total > self.max_dirty_bytes and node.dirty:
            self._persist(node)
            self.counts["early_writebacks"] += 1

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        node = self._fh.get(fh) if fh else None
        if self.passthrough:
            if node is not None:
                os.ftruncate(node.fd, length)
            else:
                os.truncate(self._b(path or "/"), length)
            return 0
        opened = node is None
        if opened:
            node = self._node_for_fd(os.open(self._b(path or "/"), os.O_RDWR | os.O_CLOEXEC))
        try:
            with self._lock:
                self._dirty(node)
                node.extents.truncate(length)
                node.size = length
                node.floor = min(node.floor, length)
                node.mtime_ns = time.time_ns()
                self.counts["truncates"] += 1
                lw = self._last_write
                if lw is not None and lw[0] is node and lw[1] + len(lw[2]) > length:
                    self._last_write = None if lw[1] >= length else (node, lw[1], lw[2][:length - lw[1]], lw[3])
        finally:
            if opened:
                with self._lock:
                    self._unref(node)
        return 0

    def _persist(self, node: Node) -> int:
        """Write a node's cache into its backing file (under the lock); the bytes written."""
        if not node.dirty:
            return 0
        if node.floor < os.fstat(node.fd).st_size:
            os.ftruncate(node.fd, node.floor)
        n = 0
        for off, buf in node.extents.items():
            os.pwrite(node.fd, buf, off)
            n += len(buf)
        if os.fstat(node.fd).st_size != node.size:
            os.ftruncate(node.fd, node.size)
        node.extents.clear()
        node.dirty = False
        node.writes = 0
        self._dirty_total = max(0, self._dirty_total - n)
        if self._last_write is not None and self._last_write[0] is node:
            self._last_write = None
        return n

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        node = self._fh[fh]
        with self._lock:
            if not self.passthrough:
                self._persist(node)
            self.counts["fsyncs"] += 1
        (os.fdatasync if datasync else os.fsync)(node.fd)
        self._boundary("fsync", path)
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0  # a close persists nothing: the page cache outlives it

    def release(self, path: str | None, fh: int) -> int:
        with self._lock:
            node = self._fh.pop(fh, None)
            if node is not None:
                self._unref(node)
        return 0

    def fallocate(self, path: str | None, mode: int, off: int, size: int, fh: int) -> int:
        if mode != 0:
            raise _err(errno.EOPNOTSUPP)
        node = self._fh[fh]
        if self.passthrough:
            os.posix_fallocate(node.fd, off, size)
            return 0
        with self._lock:
            self._dirty(node)
            if off + size > node.size:
                node.size = off + size
        return 0

    # ---- control

    def _file_path(self, node: Node) -> str:
        try:
            p = os.readlink(f"/proc/self/fd/{node.fd}")
        except OSError:
            return "?"
        return "/" + os.path.relpath(p, self.root) if p.startswith(self.root + "/") else p

    def _undo_all(self) -> list[dict]:
        """Replay the undo log backwards; one record per operation."""
        out = []
        for u in reversed(self._undo):
            rec = {"op": u.op, "path": u.path, "undone": True}
            try:
                if u.op == "create":
                    st = os.stat(u.name, dir_fd=u.dirfd, follow_symlinks=False)
                    if st.st_ino != u.ino:
                        rec.update(undone=False, why="the name now holds another file")
                    elif statmod.S_ISDIR(st.st_mode):
                        files, nbytes = _tree_size(f"/proc/self/fd/{u.dirfd}/{u.name}")
                        shutil.rmtree(f"/proc/self/fd/{u.dirfd}/{u.name}")
                        rec.update(files_removed=files, bytes_removed=nbytes)
                    else:
                        os.unlink(u.name, dir_fd=u.dirfd)
                        rec.update(files_removed=1 if st.st_nlink <= 1 else 0, bytes_removed=st.st_size)
                elif u.op == "unlink":
                    os.link(u.stash, u.name, src_dir_fd=self._undo_fd, dst_dir_fd=u.dirfd, follow_symlinks=False)
                elif u.op == "rmdir":
                    os.mkdir(u.name, u.mode, dir_fd=u.dirfd)
                    os.chown(u.name, u.uid, u.gid, dir_fd=u.dirfd, follow_symlinks=False)
                elif u.op == "rename":
                    st = os.stat(u.name, dir_fd=u.dirfd, follow_symlinks=False)
                    if st.st_ino != u.ino:
                        rec.update(undone=False, why="the name now holds another file")
                    elif _exists(u.src_dirfd, u.src_name):
                        rec.update(undone=False, why="its old name was taken by a durable operation")
                    else:
                        os.rename(u.name, u.src_name, src_dir_fd=u.dirfd, dst_dir_fd=u.src_dirfd)
                        if u.stash:
                            os.link(u.stash, u.name, src_dir_fd=self._undo_fd, dst_dir_fd=u.dirfd,
                                    follow_symlinks=False)
                        elif u.replaced_dir:
                            os.mkdir(u.name, u.replaced_dir[0], dir_fd=u.dirfd)
                            os.chown(u.name, u.replaced_dir[1], u.replaced_dir[2], dir_fd=u.dirfd,
                                     follow_symlinks=False)
            except FileNotFoundError:
                rec.update(undone=False, why="already gone with an operation undone before it")
            except OSError as exc:
                rec.update(undone=False, why=f"{type(exc).__name__}: {exc.strerror}")
            out.append(rec)
        for u in self._undo:
            self._forget(u)
        self._undo = []
        return out

    def drop(self, tear_seed: int | None = None) -> dict:
        """Power loss: forget every unsynced write and undo every name operation not made durable (see module doc).
        With `tear_seed`, the last unsynced write keeps a seeded prefix first (:meth:`tear`)."""
        with self._lock:
            torn = None
            if tear_seed is not None:
                torn = {"seed": tear_seed, "path": None, "offset": None, "length": 0, "kept": 0}
                if self._last_write is not None:
                    node, off, data, path = self._last_write
                    kept = random.Random(tear_seed).randrange(1, len(data)) if len(data) > 1 else 0
                    if kept:
                        os.pwrite(node.fd, data[:kept], off)
                        os.fsync(node.fd)
                    torn.update(path=self._file_path(node), offset=off, length=len(data), kept=kept)
                    torn["_node"] = node
            files, closing = [], []
            for node in list(self._nodes.values()):
                if node.dirty:
                    files.append({"path": self._file_path(node), "bytes_dropped": node.extents.nbytes(),
                                  "writes_dropped": node.writes, "size_was": node.size,
                                  "size_now": os.fstat(node.fd).st_size})
                    node.extents.clear()
                    node.dirty = False
                    node.writes = 0
                    if node.refs <= 0:
                        self._nodes.pop(node.key, None)
                        closing.append(node.fd)
            self._last_write = None
            self._dirty_total = 0
            names = self._undo_all()
            if torn is not None and "_node" in torn:
                node = torn.pop("_node")
                torn["survived"] = os.fstat(node.fd).st_nlink > 0
                if torn["survived"]:
                    torn["path"] = self._file_path(node)
            for fd in closing:
                os.close(fd)
            self.counts["tears" if tear_seed is not None else "drops"] += 1
            receipt = {"mode": "torn" if tear_seed is not None else "lose-unsynced",
                       "files_dropped": len([f for f in files if f["bytes_dropped"] or f["size_was"] != f["size_now"]]),
                       "bytes_dropped": sum(f["bytes_dropped"] for f in files), "files": files,
                       "names_undone": sum(1 for r in names if r["undone"]), "names": names,
                       "files_removed": sum(r.get("files_removed", 0) for r in names),
                       "bytes_removed": sum(r.get("bytes_removed", 0) for r in names)}
            if torn is not None:
                receipt["torn"] = torn
        if isinstance(self.on_boundary, Boundaries):
            receipt["released"] = self.on_boundary.release()
        return receipt

    def tear(self, seed: int) -> dict:
        """`drop()`, and the write in flight (the last unsynced write) keeps ``Random(seed).randrange(1, n)`` bytes."""
        return self.drop(tear_seed=int(seed))

    def sync_all(self) -> dict:
        """What a clean unmount does: persist every file's cache and make every name operation durable."""
        with self._lock:
            nbytes = files = 0
            for node in list(self._nodes.values()):
                if node.dirty:
                    files += 1
                    nbytes += self._persist(node)
                    os.fsync(node.fd)
                if node.refs <= 0:
                    self._nodes.pop(node.key, None)
                    os.close(node.fd)
            names = len(self._undo)
            for u in self._undo:
                self._forget(u)
            self._undo = []
        return {"files_synced": files, "bytes_synced": nbytes, "names_made_durable": names}

    def stats(self) -> dict:
        with self._lock:
            return {**self.counts, "boundaries": dict(self._n),
                    "dirty_files": sum(1 for n in self._nodes.values() if n.dirty),
                    "dirty_bytes": sum(n.extents.nbytes() for n in self._nodes.values() if n.dirty),
                    "pending_names": len(self._undo),
                    "paused": self.on_boundary.paused() if isinstance(self.on_boundary, Boundaries) else []}

    def destroy(self, path: str | None = None) -> None:
        """The FUSE loop ended (a clean unmount): persist everything, remove the empty undo dir."""
        if self.passthrough:
            return
        self.sync_all()
        os.close(self._undo_fd)
        try:
            os.rmdir(self.undo_dir)
        except OSError:
            pass


def _exists(dirfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _tree_size(path: str) -> tuple[int, int]:
    files = nbytes = 0
    for d, _, names in os.walk(path):
        for n in names:
            try:
                st = os.lstat(os.path.join(d, n))
            except OSError:
                continue
            files += 1
            nbytes += st.st_size
    return files, nbytes


# ------------------------------------------------------------------------------------------------ the FUSE process


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


class _Control(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, ops: LazyOps, bounds: Boundaries, ready: threading.Event) -> None:
        self.ops, self.bounds, self.ready = ops, bounds, ready
        super().__init__(path, _ControlHandler)


def _printable(v):
    """An answer whose paths a runner named: a name that is not UTF-8 (a surrogate, as os decodes it) is shown
    escaped (`odd\\xffname`), so every record the harness writes from it stays valid UTF-8 JSON."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
            return v
        except UnicodeEncodeError:
            return v.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(v, dict):
        return {_printable(k): _printable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_printable(x) for x in v]
    return v


class _ControlHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        try:
            req = json.loads(self.rfile.readline() or b"{}")
            out = {"ok": True, **self._do(req)}
        except Exception as exc:  # noqa: BLE001 - every failure is answered, never a dropped connection
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self.wfile.write(json.dumps(_printable(out)).encode() + b"\n")

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
    server = _Control(control, ops, bounds, ready)
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
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
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
    ap = argparse.ArgumentParser(prog="python -m fleet.lazyfs", description=__doc__.split("\n\n")[0])
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


if __name__ == "__main__":
    sys.exit(main())
