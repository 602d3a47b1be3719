"""The sandbox's disk: the size-limited tmpfs workspace (mounted, seeded, released), and a task's kept volume across
its attempts (`keep`; `move`: packed on a lost node and laid on another; the crash modes: served through the lazy
file system, fleet/lazyfs/, which drops or tears it before the next attempt)."""
from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil

from fleet.sandbox.spec import SANDBOX_UID, SandboxError, SandboxSpec

_libc = ctypes.CDLL(None, use_errno=True)
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2


def unmount_workspace(path: str) -> None:
    if os.path.ismount(path):
        if _libc.umount2(path.encode(), 0) != 0:
            _libc.umount2(path.encode(), MNT_DETACH)


def release_workspace(path: str) -> None:
    """Unmount a sandbox's workspace tmpfs and remove its (then empty) mount point."""
    unmount_workspace(path)
    if os.path.isdir(path):
        try:
            os.rmdir(path)
        except OSError:
            pass


def _harness_files_anew(workspace: str) -> None:
    """On a kept volume, the harness's own files of the attempt (`.sandfleet/`: the named windows the runner
    announces, a spot notice) start empty: a new sandbox must not read the last attempt's windows as its own."""
    d = os.path.join(workspace, ".sandfleet")
    if os.path.islink(d) or (os.path.exists(d) and not os.path.isdir(d)):
        os.unlink(d)  # the runner's: the harness's dir is made anew
    elif os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    open(os.path.join(d, "checkpoints"), "w").close()
    for x in (d, os.path.join(d, "checkpoints")):
        os.lchown(x, SANDBOX_UID, SANDBOX_UID)


_LAZY: dict[str, object] = {}  # lazy mount point -> its LazyFS, in the process that mounted it (the host's)
# lazy mount point -> the disk boundaries (op, nth) to arm before the attempt's runner starts (a host's watch of a
# PK1 at the runner's Nth write, fsync or rename: armed before the runner can reach it)
PENDING_ARMS: dict[str, list[tuple[str, int]]] = {}


def lazy_of(workspace: str):
    """The LazyFS serving a crash-mode volume at `workspace` (this process mounted it), or None."""
    return _LAZY.get(workspace)


def _arm_pending(workspace: str) -> None:
    lazy = _LAZY.get(workspace)
    for op, nth in PENDING_ARMS.pop(workspace, []):
        if lazy is not None:
            lazy.arm(op, nth)
LAZY_DATA = "data"  # the lazy volume's backing dir inside its tmpfs (its undo dir beside it, on the same tmpfs)


def _lazy_disk(workspace: str) -> str:
    return workspace.rstrip("/") + ".disk"


def release_volume(workspace: str) -> dict | None:
    """A task's kept volume goes: its lazy mount (clean unmount, its process ended) and its tmpfs."""
    lazy = _LAZY.pop(workspace, None)
    got = None
    if lazy is not None:
        got = lazy.unmount()
    else:
        from fleet import lazyfs

        if lazyfs.is_mounted(workspace):  # a host that restarted: no handle, found by its marker
            lazyfs.force_unmount(workspace)
    if os.path.isdir(_lazy_disk(workspace)):
        release_workspace(_lazy_disk(workspace))
    release_workspace(workspace)
    return got


def _prepare_lazy(spec: SandboxSpec) -> dict | None:
    """A crash-mode volume: a size-limited tmpfs at `<workspace>.disk`, seeded, served at the workspace through the
    lazy file system; later attempts first get their crash (drop or tear) done to it. Returns the crash's receipt."""
    from fleet.lazyfs import LazyFS

    lazy = _LAZY.get(spec.workspace)
    if lazy is not None and not spec.volume_fresh:
        receipt = None
        if spec.volume_crash == "tear":
            receipt = dict(lazy.tear(spec.volume_seed), crash="tear")
        elif spec.volume_crash == "drop":
            receipt = dict(lazy.drop(), crash="drop")
        _harness_files_anew(spec.workspace)
        _arm_pending(spec.workspace)
        return receipt
    release_volume(spec.workspace)
    disk = _lazy_disk(spec.workspace)
    seeded = dataclasses.replace(spec, workspace_dir=disk, volume_lazy=False, volume=None)
    _mount_and_seed(seeded, source=spec.mount_source)
    data = os.path.join(disk, LAZY_DATA)
    os.mkdir(data, 0o755)
    for name in os.listdir(disk):  # the seeded files move into the backing dir
        if name != LAZY_DATA:
            os.rename(os.path.join(disk, name), os.path.join(data, name))
    os.lchown(data, SANDBOX_UID, SANDBOX_UID)
    os.makedirs(spec.workspace, exist_ok=True)
    _LAZY[spec.workspace] = LazyFS(data, spec.workspace, label=f"{spec.wave_id}.{spec.volume}").mount()
    _arm_pending(spec.workspace)
    return None


def prepare_workspace(spec: SandboxSpec) -> dict | None:
    """Mount the size-limited tmpfs workspace (owned by the sandbox user) and seed it with the task's files. A kept
    volume already mounted is used as its last attempt left it (a fresh one asked for is mounted anew); a crash-mode
    volume first has its crash done to it (returns what it dropped)."""
    if spec.volume and spec.volume_image is not None:  # moved here from a lost node
        if os.path.ismount(spec.workspace):
            release_workspace(spec.workspace)
        _mount_and_seed(dataclasses.replace(spec, files={}), spec.mount_source)
        got = unpack_volume(spec.volume_image, spec.workspace)
        _harness_files_anew(spec.workspace)
        return dict(got, moved=True)
    if spec.volume and spec.volume_lazy:
        return _prepare_lazy(spec)
    if spec.volume and os.path.ismount(spec.workspace):
        if not spec.volume_fresh:
            _harness_files_anew(spec.workspace)
            return None
        release_workspace(spec.workspace)
    _mount_and_seed(spec, spec.mount_source)
    return None


MOVED_SKIP = (".sandfleet",)  # the harness's own files of an attempt: never carried to the next node


def pack_volume(path: str) -> tuple[bytes, dict]:
    """A kept volume read back as a tar (no link followed, the harness's `.sandfleet/` left out): what a network disk
    carries to another node (`move`). Bounded by the volume's own size limit. Returns (tar, {files, bytes})."""
    import io
    import tarfile

    buf, files, size = io.BytesIO(), 0, 0
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(os.listdir(path)):
            if name in MOVED_SKIP:
                continue
            tar.add(os.path.join(path, name), arcname=name, recursive=True)
        for m in tar.getmembers():
            files += m.isfile()
            size += m.size if m.isfile() else 0
    return buf.getvalue(), {"files": files, "bytes": size}


def unpack_volume(image: bytes, path: str) -> dict:
    """Lay a moved volume's tar into a fresh volume at `path` (tarfile's `data` filter: no absolute path, no `..`,
    no link out of it, no device, no setuid: what a runner wrote is untrusted), owned by the sandbox user."""
    import io
    import tarfile

    members, refused = [], []
    with tarfile.open(fileobj=io.BytesIO(image), mode="r") as tar:
        for m in tar.getmembers():
            if m.name.split("/")[0] in MOVED_SKIP:
                continue
            try:
                members.append(tarfile.data_filter(m, path))
            except tarfile.FilterError as exc:  # e.g. a symlink to an absolute path: not carried, and said so
                refused.append(f"{m.name[:200]}: {type(exc).__name__}")
        tar.extractall(path, members=members, filter="fully_trusted")  # (each member filtered above)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), SANDBOX_UID, SANDBOX_UID)
    out = {"files": sum(m.isfile() for m in members), "bytes": sum(m.size for m in members if m.isfile())}
    return dict(out, refused=refused[:20]) if refused else out


def _mount_and_seed(spec: SandboxSpec, source: str) -> None:
    os.makedirs(spec.workspace, exist_ok=True)
    opts = f"size={spec.workspace_mb * 1024 * 1024},mode=0755,uid={SANDBOX_UID},gid={SANDBOX_UID}"
    if _libc.mount(source.encode(), spec.workspace.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                   opts.encode()) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"could not mount the workspace tmpfs on {spec.workspace}: {os.strerror(err)}")
    for rel in list(spec.files) + [".sandfleet/checkpoints"]:
        full = os.path.join(spec.workspace, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(spec.files.get(rel, ""))
    for dirpath, dirnames, filenames in os.walk(spec.workspace):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), SANDBOX_UID, SANDBOX_UID)
