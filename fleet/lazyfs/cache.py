"""The lazy file system's records: the unsynced data cache of a file (`Extents`), an open or dirty file (`Node`), a
name operation not yet durable (`Undo`), and the constants and errors the rooms share."""
from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field

MARK = "sandfleet-lazyfs"
KINDS = ("write", "fsync", "rename")
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


class LazyFSError(RuntimeError):
    """The layer cannot run here, or its process did not answer."""


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


def errno_error(code: int) -> OSError:
    """An OSError carrying `code` and its message, as a system call raises it."""
    return OSError(code, os.strerror(code))
