"""The lazy file system on a real FUSE mount: its own process, real system calls, a non-root writer, SQLite.

Each test mounts its own layer and the fixture unmounts it and asserts that neither the mount nor the process is left.
"""
from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from fleet import lazyfs
from fleet.lazyfs import LazyFS



@pytest.fixture(autouse=True)
def _fuse_here():
    """The integration tier needs the real parts: a machine without FUSE fails here, naming what is missing."""
    why = lazyfs.check_available()
    if why:
        pytest.fail(why)

NOBODY = 65534


def _fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path, data: bytes, *, fsync: bool, append: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o644)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


@pytest.fixture
def lazy():
    """A mounted layer over a fresh backing dir: (fs, backing, mountpoint). Both dirs are reachable by uid 65534."""
    root = Path(tempfile.mkdtemp(prefix="lazyfs-it-", dir="/tmp"))
    root.chmod(0o755)
    backing, mnt = root / "vol", root / "mnt"
    backing.mkdir()
    mnt.mkdir()
    os.chown(backing, NOBODY, NOBODY)
    fs = LazyFS(backing, mnt, label=f"it-{os.getpid()}-{root.name}").mount()
    pid = fs.pid
    try:
        yield fs, backing, mnt
    finally:
        out = fs.unmount()
        shutil.rmtree(root, ignore_errors=True)
    assert not out["mounted"] and not lazyfs.is_mounted(mnt), f"the lazy mount was left: {out}"
    assert not os.path.exists(f"/proc/{pid}") or _zombie(pid), f"the lazy process {pid} was left"
    assert not [m for m in lazyfs.mounts() if m["mountpoint"] == str(mnt)]
    assert not [p for p in lazyfs.processes() if p["pid"] == pid]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_the_mount_and_process_carry_the_markers(lazy):
    fs, backing, mnt = lazy
    assert {"mountpoint": str(mnt), "source": fs.fsname} in lazyfs.mounts() and fs.fsname.startswith("sandfleet-lazyfs")
    assert [p["pid"] for p in lazyfs.processes()].count(fs.pid) == 1
    assert Path(f"/proc/{fs.pid}/comm").read_text().strip() == "sandfleet-lazyf"
    from tests import leftovers

    assert any(str(fs.pid) == p.split()[0] for p in leftovers.marked_processes())
    assert any(fs.fsname in m for m in leftovers.sandfleet_mounts())
    ctl = Path(fs.control_dir)
    assert ctl.stat().st_uid == 0 and (ctl.stat().st_mode & 0o777) == 0o700, "the control is reachable by others"
    probe = ("import socket; s = socket.socket(socket.AF_UNIX); s.connect(%r); s.sendall(b'{\"op\": \"drop\"}\\n'); "
             "print(s.recv(999))" % fs.control)
    p = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", sys.executable,
                        "-c", probe], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "PermissionError" in p.stderr, f"uid 65534 reached the control: {p.stdout}"
    out = subprocess.run([sys.executable, "-m", "fleet.lazyfs", "ctl", "--control", fs.control, "stats"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and '"drops": 0' in out.stdout, out.stderr


def test_write_and_fsync_survives_drop(lazy):
    fs, backing, mnt = lazy
    _write(mnt / "journal", b"record-1\n", fsync=True)
    _fsync_dir(mnt)
    receipt = fs.drop()
    assert (mnt / "journal").read_bytes() == b"record-1\n"
    assert receipt["bytes_dropped"] == 0 and receipt["names_undone"] == 0


def test_write_without_fsync_is_lost_on_drop(lazy):
    fs, backing, mnt = lazy
    _write(mnt / "journal", b"record-1\n", fsync=True)
    _fsync_dir(mnt)
    _write(mnt / "journal", b"record-2\n", fsync=False, append=True)
    assert (mnt / "journal").read_bytes() == b"record-1\nrecord-2\n", "no read-your-writes"
    assert (backing / "journal").read_bytes() == b"record-1\n"
    receipt = fs.drop()
    assert (mnt / "journal").read_bytes() == b"record-1\n"
    assert os.stat(mnt / "journal").st_size == 9, "the kernel kept a stale size after the drop"
    assert receipt["files_dropped"] == 1 and receipt["bytes_dropped"] == 9
    assert receipt["files"][0]["path"] == "/journal"


def test_a_write_to_an_o_dsync_file_is_durable_when_it_returns(lazy):
    fs, backing, mnt = lazy
    (mnt / "log").touch()
    _fsync_dir(mnt)
    fd = os.open(mnt / "log", os.O_WRONLY | os.O_APPEND | os.O_DSYNC)
    os.write(fd, b"synced by O_DSYNC\n")
    os.close(fd)
    fs.drop()
    assert (mnt / "log").read_bytes() == b"synced by O_DSYNC\n"


def test_rename_without_dir_fsync_is_undone_on_drop_with_dir_fsync_it_stays(lazy):
    fs, backing, mnt = lazy
    _write(mnt / "state", b"v1", fsync=True)
    _write(mnt / "state.tmp", b"v2", fsync=True)
    _fsync_dir(mnt)
    os.rename(mnt / "state.tmp", mnt / "state")
    receipt = fs.drop()
    assert sorted(os.listdir(mnt)) == ["state", "state.tmp"] and (mnt / "state").read_bytes() == b"v1"
    assert [(r["op"], r["undone"]) for r in receipt["names"]] == [("rename", True)]
    os.rename(mnt / "state.tmp", mnt / "state")
    _fsync_dir(mnt)
    assert fs.drop()["names_undone"] == 0
    assert os.listdir(mnt) == ["state"] and (mnt / "state").read_bytes() == b"v2"


def _torn_once(fs, mnt, name: str, seed: int) -> tuple[dict, bytes]:
    _write(mnt / name, b"H" * 16, fsync=True)
    _fsync_dir(mnt)
    _write(mnt / name, bytes(range(256)) * 4, fsync=False, append=True)  # the write in flight: 1 KiB
    receipt = fs.tear(seed)
    return receipt, (mnt / name).read_bytes()


def test_tear_keeps_a_seeded_prefix_of_the_write_in_flight_deterministically(lazy):
    fs, backing, mnt = lazy
    r1, data1 = _torn_once(fs, mnt, "wal-a", seed=41)
    r2, data2 = _torn_once(fs, mnt, "wal-b", seed=41)
    r3, _ = _torn_once(fs, mnt, "wal-c", seed=42)
    t1, t2 = r1["torn"], r2["torn"]
    assert t1["path"] == "/wal-a" and t1["offset"] == 16 and t1["length"] == 1024 and t1["survived"]
    assert 1 <= t1["kept"] < 1024
    assert t1["kept"] == t2["kept"] and data1 == data2, "the same seed tore differently"
    assert data1 == b"H" * 16 + (bytes(range(256)) * 4)[:t1["kept"]]
    assert r3["torn"]["kept"] != t1["kept"], "the seed does not reach the torn length"


SQLITE_CHILD = textwrap.dedent("""
    import os, sqlite3, sys
    db, sync, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    c = sqlite3.connect(db, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute(f"PRAGMA synchronous={sync}")
    c.execute("CREATE TABLE IF NOT EXISTS t (i INTEGER PRIMARY KEY, v TEXT)")
    for i in range(rows):
        c.execute("BEGIN")
        c.execute("INSERT INTO t (v) VALUES (?)", (f"row-{i}" * 10,))
        c.execute("COMMIT")
    print("committed", flush=True)
    os._exit(0)  # a crash: no close, no checkpoint
""")


def _sqlite_rows(db: Path) -> int | None:
    if not db.exists():
        return None
    c = sqlite3.connect(db)
    try:
        return c.execute("SELECT count(*) FROM t").fetchone()[0]
    except sqlite3.DatabaseError:
        return None
    finally:
        c.close()


@pytest.mark.parametrize("sync, survives", [("FULL", True), ("OFF", False)])
def test_sqlite_wal_commits_survive_drop_only_when_synced(lazy, sync, survives):
    fs, backing, mnt = lazy
    db = mnt / "state.db"
    p = subprocess.run([sys.executable, "-c", SQLITE_CHILD, str(db), sync, "20"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "committed" in p.stdout, p.stderr
    receipt = fs.drop()
    rows = _sqlite_rows(db)
    if survives:
        assert rows == 20, f"committed rows lost under synchronous=FULL: {rows}; {receipt}"
    else:  # the negative control: the same commits, never fsynced, are gone
        assert rows != 20 and (receipt["bytes_dropped"] > 0 or receipt["names_undone"] > 0)


def test_a_write_by_uid_65534_works_through_the_mount(lazy):
    fs, backing, mnt = lazy
    script = (f"echo from-nobody > {mnt}/mine && cat {mnt}/mine && id -u && mkdir {mnt}/d && mv {mnt}/mine {mnt}/d/ "
              f"&& ln -s d/mine {mnt}/l && cp {mnt}/l {mnt}/copy && rm {mnt}/copy && mv {mnt}/d/mine {mnt}/mine")
    p = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", "sh", "-c", script],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["from-nobody", str(NOBODY)]
    assert os.stat(backing / "mine").st_uid == NOBODY, "a file made by the sandbox's uid is not its own"
    denied = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", "sh", "-c",
                             f"echo x > {mnt}/../not-mine"], capture_output=True, text=True, timeout=30)
    assert denied.returncode != 0, "uid 65534 wrote outside the mount"


JOURNAL_CHILD = textwrap.dedent("""
    import os, sys
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for i in range(10):
        os.write(fd, b"record-%d\\n" % i)
        os.fsync(fd)
        print(i, flush=True)
""")


def test_a_boundary_hook_pauses_the_nth_write_and_a_kill_lands_mid_append(lazy):
    fs, backing, mnt = lazy
    (mnt / "j").touch()
    _fsync_dir(mnt)
    base = fs.stats()["boundaries"]["write"]
    fs.arm("write", base + 3)  # the child's third append
    child = subprocess.Popen([sys.executable, "-c", JOURNAL_CHILD, str(mnt / "j")], stdout=subprocess.PIPE, text=True)
    try:
        reached = fs.wait("write", base + 3, timeout_s=30)
        assert reached == {"kind": "write", "n": base + 3, "path": "/j"}
        time.sleep(0.2)
        assert child.poll() is None, "the child went on past the paused write"
        assert fs.stats()["paused"] == [{"kind": "write", "n": base + 3, "path": "/j"}]
        child.send_signal(signal.SIGKILL)  # it stays in the write until the layer answers
        receipt = fs.drop()  # releases the paused write: the child then dies
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            fs.release()
            child.kill()
            child.wait(timeout=30)
    assert (mnt / "j").read_bytes() == b"record-0\nrecord-1\n", "the append in flight or an fsynced one is wrong"
    assert receipt["bytes_dropped"] == len(b"record-2\n") and receipt["released"] == 1


def test_a_kill_at_a_paused_write_then_tear_leaves_a_torn_record_tail(lazy):
    """DCP-2.0's SENTINEL_WRITE: the kill lands mid-append, and the power loss keeps a seeded prefix of it."""
    fs, backing, mnt = lazy
    (mnt / "j").touch()
    _fsync_dir(mnt)
    n = fs.stats()["boundaries"]["write"] + 3
    fs.arm("write", n)
    child = subprocess.Popen([sys.executable, "-c", JOURNAL_CHILD, str(mnt / "j")], stdout=subprocess.PIPE, text=True)
    try:
        assert fs.wait("write", n, timeout_s=30) is not None
        child.send_signal(signal.SIGKILL)
        receipt = fs.tear(seed=1234)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            fs.release()
            child.kill()
            child.wait(timeout=30)
    torn = receipt["torn"]
    assert torn["path"] == "/j" and torn["offset"] == 18 and torn["length"] == 9 and 1 <= torn["kept"] < 9
    assert (mnt / "j").read_bytes() == b"record-0\nrecord-1\n" + b"record-2\n"[:torn["kept"]]


def test_a_paused_fsync_has_persisted_before_it_returns(lazy):
    fs, backing, mnt = lazy
    (mnt / "j").touch()
    _fsync_dir(mnt)
    n = fs.stats()["boundaries"]["fsync"] + 1
    fs.arm("fsync", n)
    child = subprocess.Popen([sys.executable, "-c", JOURNAL_CHILD, str(mnt / "j")], stdout=subprocess.PIPE, text=True)
    try:
        assert fs.wait("fsync", n, timeout_s=30) == {"kind": "fsync", "n": n, "path": "/j"}
        child.send_signal(signal.SIGKILL)
        fs.drop()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            fs.release()
            child.kill()
            child.wait(timeout=30)
    assert (mnt / "j").read_bytes() == b"record-0\n"


def test_unmount_of_a_busy_mount_still_leaves_no_mount_and_no_process(tmp_path):
    root = Path(tempfile.mkdtemp(prefix="lazyfs-it-", dir="/tmp"))
    (root / "vol").mkdir()
    (root / "mnt").mkdir()
    fs = LazyFS(root / "vol", root / "mnt", label=f"it-busy-{os.getpid()}").mount()
    pid = fs.pid
    holder = subprocess.Popen(["sleep", "300"], cwd=root / "mnt")  # holds the mount busy
    try:
        out = fs.unmount(timeout_s=2)
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(root, ignore_errors=True)
    assert out["how"].startswith("lazy") and not out["mounted"]
    assert not lazyfs.is_mounted(root / "mnt") and not [p for p in lazyfs.processes() if p["pid"] == pid]


def test_a_clean_unmount_persists_the_cache(tmp_path):
    root = Path(tempfile.mkdtemp(prefix="lazyfs-it-", dir="/tmp"))
    (root / "vol").mkdir()
    (root / "mnt").mkdir()
    try:
        with LazyFS(root / "vol", root / "mnt", label=f"it-clean-{os.getpid()}"):
            _write(root / "mnt" / "a", b"unsynced but unmounted cleanly", fsync=False)
        assert (root / "vol" / "a").read_bytes() == b"unsynced but unmounted cleanly"
        assert not list(root.glob(".*undo")), "the undo dir was left"
    finally:
        shutil.rmtree(root, ignore_errors=True)
