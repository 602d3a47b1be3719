"""A runner's code shipped to nodes that cannot see the driver's disk: a per-wave, content-addressed snapshot.

`snapshot(workdir)` packs the directory into a deterministic tar (sorted, no owners, no times; symlinks kept as
links, anything but files, dirs and links left out) and names it by its sha256. A host unpacks it under its own
dir as root-owned files the sandbox user can read (dirs 0755, files 0644 or 0755), packs what it wrote the same way
and checks the digest, so a node runs exactly the bytes the driver has, and a workdir only root could read (a
`mktemp -d`, a venv under /root) runs all the same.
"""
from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import shutil
import stat
import tarfile
from pathlib import Path

MAX_BYTES = 64 * 1024 * 1024
MAX_FILES = 20000


class ShipError(RuntimeError):
    pass


IGNORE_FILE = ".sandfleetignore"
NEVER = ("__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache")


def ignored(root: Path) -> list[str]:
    """The globs of `<workdir>/.sandfleetignore` (one per line, relative to the workdir, fnmatch rules; `#` starts a
    comment): paths the snapshot leaves out, as it leaves out virtual environments and caches by itself."""
    try:
        text = (root / IGNORE_FILE).read_text(errors="replace")
    except OSError:
        return []
    return [x.strip().strip("/") for x in text.splitlines() if x.strip() and not x.strip().startswith("#")]


def is_venv(path: str) -> bool:
    """A virtual environment (venv, virtualenv, uv): it has a pyvenv.cfg. Its interpreter and packages are this
    machine's; a node needs its own at the same path (the wave checks before any task)."""
    return os.path.isfile(os.path.join(path, "pyvenv.cfg"))


def is_env(path: str) -> bool:
    """An installed environment, built per machine from a lock file beside it: a Python venv, or a Node
    `node_modules` dir (npm, yarn and pnpm all install there; its packages carry per-platform binaries). Never
    shipped: the snapshot keeps only its place (an empty dir, so a read-only staged copy has the mount point), and
    each node binds its own at the same path, read-only, over the shipped code."""
    return is_venv(path) or (os.path.basename(path) == "node_modules" and os.path.isdir(path)
                             and not os.path.islink(path))


def environments(workdir: str, exclude=()) -> list[str]:
    """The environments (`is_env`) the snapshot of `workdir` leaves out, as absolute paths: what every node must
    have at the same path (the wave checks each one before any task, and each node binds its own)."""
    root = os.path.abspath(workdir)
    skip = {os.path.realpath(e) for e in exclude}
    globs = ignored(Path(root))
    out = []
    for dirpath, dirnames, _ in os.walk(root, followlinks=False):
        keep = []
        for d in sorted(dirnames):
            full = os.path.join(dirpath, d)
            rel = os.path.relpath(full, root)
            if (os.path.realpath(full) in skip or d in NEVER or os.path.islink(full)
                    or any(fnmatch.fnmatchcase(rel, g) for g in globs)):
                continue
            if is_env(full):
                out.append(full)
            else:
                keep.append(d)
        dirnames[:] = keep
    return out


def _entries(root: Path, exclude=()) -> list[Path]:
    out = []
    skip = {os.path.realpath(e) for e in exclude}
    globs = ignored(root)

    def left_out(full: str) -> bool:
        rel = os.path.relpath(full, root)
        return (os.path.realpath(full) in skip or os.path.basename(full) in NEVER
                or any(fnmatch.fnmatchcase(rel, g) for g in globs))

    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        kept = sorted(d for d in dirnames if not left_out(os.path.join(dirpath, d)))
        # an environment keeps its place as an empty dir (the mount point of the node's own), never its contents
        places = [d for d in kept if is_env(os.path.join(dirpath, d))]
        dirnames[:] = [d for d in kept if d not in places]
        for name in kept + sorted(f for f in filenames if not any(
                fnmatch.fnmatchcase(os.path.relpath(os.path.join(dirpath, f), root), g) for g in globs)):
            out.append(Path(dirpath) / name)
    return sorted(out, key=lambda p: str(p.relative_to(root)))


def snapshot(workdir: str, exclude=()) -> tuple[str, bytes]:
    """(sha256 hex, tar bytes) of `workdir` without the dirs in `exclude` (results, the wave's private dir), its
    environments (`is_env`: venvs, node_modules), caches and `.git`, and what its `.sandfleetignore` names;
    ShipError past MAX_BYTES or MAX_FILES."""
    root = Path(workdir)
    buf = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = _entries(root, exclude)
        if len(entries) > MAX_FILES:
            raise ShipError(f"runner workdir {workdir} has {len(entries)} entries; at most {MAX_FILES} are shipped")
        for p in entries:
            st = os.lstat(p)
            ti = tarfile.TarInfo(str(p.relative_to(root)))
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            ti.mtime = 0
            if stat.S_ISLNK(st.st_mode):
                ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, os.readlink(p), 0o777
                tar.addfile(ti)
            elif stat.S_ISDIR(st.st_mode):
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(ti)
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > MAX_BYTES:
                    raise ShipError(f"runner workdir {workdir} is over {MAX_BYTES // (1024 * 1024)} MiB; ship a "
                                    "smaller one (the rest belongs in the image or a path every node has)")
                ti.size, ti.mode = st.st_size, 0o755 if st.st_mode & 0o111 else 0o644
                with open(p, "rb") as f:
                    tar.addfile(ti, f)
    data = buf.getvalue()
    return hashlib.sha256(data).hexdigest(), data


def unpack(data: bytes, dest: str, digest: str) -> str:
    """Unpack a snapshot into `dest` (made fresh) and check that it packs back to `digest`; returns `dest`."""
    if hashlib.sha256(data).hexdigest() != digest:
        raise ShipError(f"the runner snapshot's bytes do not match its digest {digest[:12]}")
    d = Path(dest)
    if d.is_dir():  # already unpacked and checked: the same bytes (the name is the digest)
        if snapshot(str(d))[0] == digest:
            return dest
        shutil.rmtree(d)
    tmp = d.with_name(d.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, mode=0o755)
    os.chmod(tmp, 0o755)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(tmp, filter="tar")  # no absolute names, no ".."; links as they are
    for p in [tmp, *tmp.rglob("*")]:
        if not p.is_symlink():
            os.chmod(p, 0o755 if p.is_dir() else (0o755 if os.stat(p).st_mode & 0o111 else 0o644))
    got = snapshot(str(tmp))[0]
    if got != digest:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ShipError(f"the runner snapshot unpacked to {got[:12]}, not {digest[:12]}")
    os.replace(tmp, d)
    return dest
