"""What the host writes into or reads from a runner's workspace, which is hostile: a spot notice and DF1's ballast
written without following a link, and the named kill windows the runner announces, read as an untrusted file."""
from __future__ import annotations

import json
import os
import stat

BALLAST = ".sandfleet-ballast"


def write_in_workspace(workspace: str, subdir: str, name: str, data: bytes) -> None:
    """Write `data` to workspace/subdir/name as root without following any link the runner planted."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    ws = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            os.mkdir(subdir, 0o755, dir_fd=ws)
        except FileExistsError:
            pass
        d = os.open(subdir, flags, dir_fd=ws)
        try:
            tmp = f".{name}.{os.getpid()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=d)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=d, dst_dir_fd=d)
        finally:
            os.close(d)
    finally:
        os.close(ws)


def fill(workspace: str) -> int:
    """Write a root-owned ballast into the workspace until the tmpfs is full; returns its size."""
    ws = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    written = 0
    try:
        fd = os.open(BALLAST, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=ws)
        try:
            for size in (1 << 20, 1 << 12, 1):
                block = b"\0" * size
                while True:
                    try:
                        n = os.write(fd, block)
                    except OSError as exc:
                        if exc.errno == 28:  # ENOSPC
                            break
                        raise
                    written += n
                    if n < size:
                        break
        finally:
            os.close(fd)
    finally:
        os.close(ws)
    return written


class CheckpointReader:
    """Reads the JSON lines a runner appends to its workspace's `.sandfleet/checkpoints`, as a hostile file:
    no link is followed (each path component is opened with O_NOFOLLOW from the workspace's fd), a
    non-regular file is ignored, at most 64 KiB is read per call and 1 MiB in all."""

    CAP = 1 << 20

    def __init__(self, workspace: str):
        self.workspace = workspace
        self.offset = 0
        self.partial = b""

    def _open(self) -> int | None:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            ws = os.open(self.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            d = os.open(".sandfleet", flags | os.O_DIRECTORY, dir_fd=ws)
            try:
                fd = os.open("checkpoints", flags, dir_fd=d)
            finally:
                os.close(d)
        except OSError:
            return None
        finally:
            os.close(ws)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def new_lines(self) -> list:
        if self.offset >= self.CAP:
            return []
        fd = self._open()
        if fd is None:
            return []
        try:
            data = os.pread(fd, min(65536, self.CAP - self.offset), self.offset)
        finally:
            os.close(fd)
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out
