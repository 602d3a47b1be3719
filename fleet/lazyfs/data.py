"""File data of the lazy file system: writes go to the cache of unsynced data, reads see it over the backing file,
an fsync persists it; ENOSPC and early writeback as a real disk's page cache answers."""
from __future__ import annotations

import errno
import os
import time

from fleet.lazyfs.cache import Node, errno_error


class DataOps:
    """`LazyOps`' file data operations (a mixin: the state lives in `LazyOps.__init__`)."""

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
                raise errno_error(errno.ENOSPC)
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
            raise errno_error(errno.EOPNOTSUPP)
        node = self._fh[fh]
        if self.passthrough:
            os.posix_fallocate(node.fd, off, size)
            return 0
        with self._lock:
            self._dirty(node)
            if off + size > node.size:
                node.size = off + size
        return 0
