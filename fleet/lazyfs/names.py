"""Name operations of the lazy file system (create, mknod, symlink, link, mkdir, unlink, rmdir, rename): applied to
the backing dir at once and recorded in the undo log under the directory whose fsync makes them durable."""
from __future__ import annotations

import errno
import os
import stat as statmod
from collections.abc import Callable

from fleet.lazyfs.cache import RENAME_EXCHANGE, RENAME_NOREPLACE, Undo, errno_error


class NameOps:
    """`LazyOps`' name operations and the undo log's bookkeeping (a mixin: the state lives in `LazyOps.__init__`)."""

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
            raise errno_error(errno.EINVAL)
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
                    raise errno_error(errno.EEXIST)
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
