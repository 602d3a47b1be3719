"""The lazy file system's crash control: `drop()` (power loss), `tear(seed)` (the write in flight keeps a seeded
prefix), `sync_all()` (a clean unmount), `stats()`."""
from __future__ import annotations

import os
import random
import shutil
import stat as statmod

from fleet.lazyfs.boundaries import Boundaries
from fleet.lazyfs.cache import Node


class CrashOps:
    """`LazyOps`' drop, tear and sync (a mixin: the state lives in `LazyOps.__init__`)."""

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
