"""The lazy file system's model, in-process: LazyOps called as FUSE would call it, on a plain backing dir (no kernel)."""
from __future__ import annotations

import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.lazyfs import Boundaries, Extents, LazyOps


class Fake:
    """The calls the kernel would make for a process using the mount, by path."""

    def __init__(self, ops: LazyOps) -> None:
        self.ops = ops

    def write_file(self, path: str, data: bytes, *, fsync: bool = False, off: int = 0) -> None:
        fh = self.ops.create(path, 0o644) if not os.path.exists(self.ops._b(path)) else self.ops.open(path, os.O_RDWR)
        self.ops.write(path, data, off, fh)
        if fsync:
            self.ops.fsync(path, 0, fh)
        self.ops.release(path, fh)

    def append(self, path: str, data: bytes, *, fsync: bool = False) -> None:
        fh = self.ops.open(path, os.O_RDWR)
        self.ops.write(path, data, self.ops.getattr(path, fh)["st_size"], fh)
        if fsync:
            self.ops.fsync(path, 0, fh)
        self.ops.release(path, fh)

    def read(self, path: str) -> bytes:
        fh = self.ops.open(path, os.O_RDONLY)
        try:
            return self.ops.read(path, 1 << 20, 0, fh)
        finally:
            self.ops.release(path, fh)

    def fsync_dir(self, path: str) -> None:
        fh = self.ops.opendir(path)
        self.ops.fsyncdir(path, 0, fh)
        self.ops.releasedir(path, fh)


@pytest.fixture(autouse=True)
def _closed(monkeypatch):
    """Every LazyOps a test made is destroyed after it: each holds descriptors (its root, its undo dir, its nodes),
    and a hypothesis test makes hundreds; left open they starved later tests of the session of descriptors."""
    made = []
    real = LazyOps.__init__

    def init(self, *a, **kw):
        real(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(LazyOps, "__init__", init)
    yield
    for ops in made:
        try:
            ops.destroy()
        except Exception:  # noqa: BLE001 - a test may have destroyed it already
            pass


@pytest.fixture
def fs(tmp_path):
    backing = tmp_path / "vol"
    backing.mkdir()
    return Fake(LazyOps(backing)), backing


# ---------------------------------------------------------------------------------------------------- the cache


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("w"), st.integers(0, 300), st.binary(min_size=1, max_size=60)),
    st.tuples(st.just("t"), st.integers(0, 300), st.just(b""))), max_size=30))
def test_extents_match_a_flat_buffer(ops):
    ext, ref, size = Extents(), bytearray(400), 0
    for kind, off, data in ops:
        if kind == "w":
            ext.write(off, data)
            ref[off:off + len(data)] = data
            size = max(size, off + len(data))
        else:
            ext.truncate(off)
            ref[off:] = bytes(len(ref) - off)
            size = min(size, off)
    buf = bytearray(400)
    ext.overlay(0, buf)
    assert bytes(buf[:size]) == bytes(ref[:size])
    assert all(a + len(b) < c for (a, b), (c, _) in zip(ext.items(), ext.items()[1:])), "extents overlap or touch"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 200), st.binary(min_size=1, max_size=50)),
    st.tuples(st.just("truncate"), st.integers(0, 200), st.just(b"")),
    st.tuples(st.just("fsync"), st.just(0), st.just(b""))), max_size=25))
def test_a_file_reads_as_written_and_drops_to_its_last_fsync(tmp_path_factory, ops):
    """Against a flat model: reads see every write and truncate; after drop, the file is as at its last fsync."""
    backing = tmp_path_factory.mktemp("v")
    lazy = LazyOps(backing)
    fh = lazy.create("/f", 0o644)
    dfh = lazy.opendir("/")
    lazy.fsyncdir("/", 0, dfh)
    now, durable = bytearray(), b""
    for kind, off, data in ops:
        if kind == "write":
            lazy.write("/f", data, off, fh)
            if len(now) < off:
                now += bytes(off - len(now))
            now[off:off + len(data)] = data
        elif kind == "truncate":
            lazy.truncate("/f", off, fh)
            now = now[:off] + bytes(max(0, off - len(now)))
        else:
            lazy.fsync("/f", 0, fh)
            durable = bytes(now)
        assert lazy.read("/f", 1000, 0, fh) == bytes(now)
        assert lazy.getattr("/f", fh)["st_size"] == len(now)
    lazy.drop()
    assert lazy.read("/f", 1000, 0, fh) == durable
    assert (backing / "f").read_bytes() == durable


def test_reads_see_unsynced_writes_over_the_backing_file(fs):
    f, backing = fs
    f.write_file("/j", b"A" * 10, fsync=True)
    f.fsync_dir("/")
    f.write_file("/j", b"bb", off=4)
    f.append("/j", b"CC")
    assert f.read("/j") == b"AAAAbbAAAACC"
    assert (backing / "j").read_bytes() == b"A" * 10, "an unsynced write reached the backing file"
    assert f.ops.getattr("/j")["st_size"] == 12


# ---------------------------------------------------------------------------------------------------- data and drop


def test_fsynced_write_survives_drop(fs):
    f, backing = fs
    f.write_file("/j", b"record-1\n", fsync=True)
    f.fsync_dir("/")
    receipt = f.ops.drop()
    assert f.read("/j") == b"record-1\n"
    assert receipt["bytes_dropped"] == 0 and receipt["files_dropped"] == 0 and receipt["names_undone"] == 0


def test_write_without_fsync_is_lost_on_drop_and_the_receipt_says_so(fs):
    f, backing = fs
    f.write_file("/j", b"record-1\n", fsync=True)
    f.fsync_dir("/")
    f.append("/j", b"record-2\n")
    f.append("/j", b"record-3\n")
    receipt = f.ops.drop()
    assert f.read("/j") == b"record-1\n"
    assert receipt["files_dropped"] == 1 and receipt["bytes_dropped"] == 18
    assert receipt["files"] == [{"path": "/j", "bytes_dropped": 18, "writes_dropped": 2, "size_was": 27,
                                 "size_now": 9}]


def test_truncate_is_cached_until_fsync(fs):
    f, backing = fs
    f.write_file("/t", b"0123456789", fsync=True)
    f.fsync_dir("/")
    f.ops.truncate("/t", 3)
    f.write_file("/t", b"X", off=6)  # the bytes 3..5 read as zeros, not the backing's old 345
    assert f.read("/t") == b"012\0\0\0X"
    assert (backing / "t").read_bytes() == b"0123456789"
    fh = f.ops.open("/t", os.O_RDWR)
    f.ops.fsync("/t", 1, fh)
    f.ops.release("/t", fh)
    assert (backing / "t").read_bytes() == b"012\0\0\0X"
    f.ops.truncate("/t", 1)
    assert f.ops.drop()["files_dropped"] == 1
    assert f.read("/t") == b"012\0\0\0X"


def test_data_of_a_closed_file_stays_cached_until_drop(fs):
    f, backing = fs
    f.write_file("/c", b"x", fsync=True)
    f.fsync_dir("/")
    f.append("/c", b"yz")
    assert f.read("/c") == b"xyz", "closing a file lost its cache (the page cache outlives a close)"
    f.ops.drop()
    assert f.read("/c") == b"x"


# ---------------------------------------------------------------------------------------------------- names


NAMES = st.sampled_from(["a", "b", "c"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("create"), NAMES, NAMES), st.tuples(st.just("rename"), NAMES, NAMES),
                          st.tuples(st.just("unlink"), NAMES, NAMES), st.tuples(st.just("fsyncdir"), NAMES, NAMES)),
                max_size=20))
def test_a_dir_drops_to_what_it_held_at_its_last_fsync(tmp_path_factory, ops):
    """Against a flat model: after drop, the directory holds exactly the names (and files) of its last fsync."""
    backing = tmp_path_factory.mktemp("v")
    lazy = LazyOps(backing)
    f = Fake(lazy)
    now: dict[str, bytes] = {}
    durable: dict[str, bytes] = {}
    for i, (kind, x, y) in enumerate(ops):
        if kind == "create" and x not in now:
            f.write_file(f"/{x}", b"file-%d" % i, fsync=True)
            now[x] = b"file-%d" % i
        elif kind == "rename" and x in now and x != y:
            lazy.rename(f"/{x}", f"/{y}")
            now[y] = now.pop(x)
        elif kind == "unlink" and x in now:
            lazy.unlink(f"/{x}")
            del now[x]
        elif kind == "fsyncdir":
            f.fsync_dir("/")
            durable = dict(now)
    lazy.drop()
    assert {n: (backing / n).read_bytes() for n in os.listdir(backing)} == durable
    assert not os.listdir(lazy.undo_dir)


def test_create_without_dir_fsync_is_undone_with_it_stays(fs):
    f, backing = fs
    f.write_file("/kept", b"k", fsync=True)
    f.fsync_dir("/")
    f.write_file("/lost", b"l", fsync=True)
    receipt = f.ops.drop()
    assert sorted(os.listdir(backing)) == ["kept"]
    assert receipt["names"] == [{"op": "create", "path": "/lost", "undone": True, "files_removed": 1,
                                 "bytes_removed": 1}]


def test_rename_without_dir_fsync_is_undone_and_the_replaced_file_comes_back(fs):
    f, backing = fs
    f.write_file("/state", b"old", fsync=True)
    f.write_file("/state.tmp", b"new", fsync=True)
    f.fsync_dir("/")
    f.ops.rename("/state.tmp", "/state")
    assert f.read("/state") == b"new"
    receipt = f.ops.drop()
    assert (backing / "state").read_bytes() == b"old"
    assert (backing / "state.tmp").read_bytes() == b"new"
    assert [r["op"] for r in receipt["names"]] == ["rename"] and receipt["names"][0]["undone"]
    assert not os.listdir(f.ops.undo_dir), "the replaced file's stash was not cleaned"


def test_rename_with_dir_fsync_stays(fs):
    f, backing = fs
    f.write_file("/state", b"old", fsync=True)
    f.write_file("/state.tmp", b"new", fsync=True)
    f.fsync_dir("/")
    f.ops.rename("/state.tmp", "/state")
    f.fsync_dir("/")
    assert f.ops.drop()["names_undone"] == 0
    assert sorted(os.listdir(backing)) == ["state"] and (backing / "state").read_bytes() == b"new"
    assert not os.listdir(f.ops.undo_dir)


def test_a_rename_into_another_dir_is_durable_by_the_destination_dir_fsync(fs):
    f, backing = fs
    f.ops.mkdir("/staging", 0o755)
    f.ops.mkdir("/final", 0o755)
    f.fsync_dir("/")
    f.write_file("/staging/a", b"a", fsync=True)
    f.fsync_dir("/staging")
    f.ops.rename("/staging/a", "/final/a")
    f.fsync_dir("/staging")  # the source dir's fsync does not make the move durable
    f.ops.drop()
    assert os.listdir(backing / "staging") == ["a"] and os.listdir(backing / "final") == []
    f.ops.rename("/staging/a", "/final/a")
    f.fsync_dir("/final")
    f.ops.drop()
    assert os.listdir(backing / "staging") == [] and os.listdir(backing / "final") == ["a"]


def test_unlink_and_rmdir_without_dir_fsync_come_back_with_synced_content(fs):
    f, backing = fs
    f.ops.mkdir("/d", 0o750)
    f.write_file("/f", b"synced", fsync=True)
    f.fsync_dir("/")
    f.append("/f", b"+unsynced")
    f.ops.unlink("/f")
    f.ops.rmdir("/d")
    assert sorted(os.listdir(backing)) == []
    receipt = f.ops.drop()
    assert sorted(os.listdir(backing)) == ["d", "f"]
    assert (backing / "f").read_bytes() == b"synced"
    assert oct((backing / "d").stat().st_mode & 0o777) == oct(0o750)
    assert receipt["names_undone"] == 2


def test_an_undone_mkdir_takes_what_was_made_durable_inside_it(fs):
    f, backing = fs
    f.ops.mkdir("/d", 0o755)
    f.write_file("/d/x", b"12345", fsync=True)
    f.fsync_dir("/d")  # x is durable in d, but d itself is not in /
    receipt = f.ops.drop()
    assert os.listdir(backing) == []
    assert receipt["files_removed"] == 1 and receipt["bytes_removed"] == 5


def test_a_dir_renamed_after_creates_in_it_still_undoes_them(fs):
    """Undo entries hold their directory by fd, not by path: a later rename of the dir does not hide them."""
    f, backing = fs
    f.ops.mkdir("/a", 0o755)
    f.fsync_dir("/")
    f.write_file("/a/x", b"x", fsync=True)
    f.ops.rename("/a", "/b")
    f.fsync_dir("/")
    f.ops.drop()
    assert os.listdir(backing) == ["b"] and os.listdir(backing / "b") == []


def test_sync_all_makes_everything_durable(fs):
    f, backing = fs
    f.write_file("/a", b"aa")
    f.ops.mkdir("/d", 0o755)
    assert f.ops.sync_all() == {"files_synced": 1, "bytes_synced": 2, "names_made_durable": 2}
    assert f.ops.drop()["bytes_dropped"] == 0
    assert sorted(os.listdir(backing)) == ["a", "d"] and (backing / "a").read_bytes() == b"aa"


# ---------------------------------------------------------------------------------------------------- tear


def _torn_run(tmp_path, name: str, seed: int) -> tuple[dict, bytes]:
    backing = tmp_path / name
    backing.mkdir()
    f = Fake(LazyOps(backing))
    f.write_file("/wal", b"H" * 8, fsync=True)
    f.fsync_dir("/")
    f.append("/wal", b"earlier-unsynced")
    f.append("/wal", bytes(range(200)))  # the write in flight
    receipt = f.ops.tear(seed)
    return receipt, (backing / "wal").read_bytes()


def test_tear_keeps_a_seeded_prefix_of_the_write_in_flight(tmp_path):
    receipt, data = _torn_run(tmp_path, "a", seed=7)
    torn = receipt["torn"]
    assert torn["path"] == "/wal" and torn["offset"] == 24 and torn["length"] == 200 and torn["survived"]
    assert 1 <= torn["kept"] < 200
    # the earlier unsynced write is dropped (a hole of zeros), the torn prefix is at its offset
    assert data == b"H" * 8 + bytes(16) + bytes(range(torn["kept"]))
    assert receipt["mode"] == "torn" and receipt["bytes_dropped"] == 216


def test_tear_is_deterministic_per_seed(tmp_path):
    kept = {s: _torn_run(tmp_path, f"s{s}", s)[0]["torn"]["kept"] for s in range(6)}
    again = {s: _torn_run(tmp_path, f"t{s}", s)[0]["torn"]["kept"] for s in range(6)}
    assert kept == again
    assert len(set(kept.values())) > 1, "the seed does not reach the torn length"


def test_tear_of_a_file_whose_create_was_not_durable_leaves_nothing(fs):
    f, backing = fs
    f.write_file("/new", b"0123456789")
    receipt = f.ops.tear(3)
    assert receipt["torn"]["survived"] is False and os.listdir(backing) == []


# ---------------------------------------------------------------------------------------------------- boundaries


def test_boundaries_are_counted_per_kind_and_reported_with_their_path(tmp_path):
    seen = []
    (tmp_path / "v").mkdir()
    f = Fake(LazyOps(tmp_path / "v", on_boundary=lambda k, n, p: seen.append((k, n, p))))
    f.write_file("/a", b"1", fsync=True)
    f.append("/a", b"2")
    f.ops.rename("/a", "/b")
    f.fsync_dir("/")
    assert seen == [("write", 1, "/a"), ("fsync", 1, "/a"), ("write", 2, "/a"), ("rename", 1, "/b"),
                    ("fsync", 2, "/")]
    assert f.ops.stats()["boundaries"] == {"write": 2, "fsync": 2, "rename": 1}


def test_a_boundary_pauses_the_nth_write_until_released_and_drop_releases_it(tmp_path):
    (tmp_path / "v").mkdir()
    bounds = Boundaries()
    f = Fake(LazyOps(tmp_path / "v", on_boundary=bounds))
    f.write_file("/j", b"", fsync=True)  # write 1
    f.fsync_dir("/")
    bounds.arm("write", 4)  # the third append
    done = []

    def runner():
        for i in range(4):
            f.append("/j", b"r%d" % i)
            done.append(i)

    t = threading.Thread(target=runner)
    t.start()
    reached = bounds.wait("write", 4, timeout_s=10)
    assert reached == {"kind": "write", "n": 4, "path": "/j"}
    t.join(0.3)
    assert t.is_alive() and done == [0, 1], "the 3rd write was not held"
    assert bounds.paused() == [{"kind": "write", "n": 4, "path": "/j"}]
    receipt = f.ops.drop()  # the kill landed after the 3rd append: it is lost with the others, and the op goes on
    assert receipt["released"] == 1 and receipt["bytes_dropped"] == 6
    t.join(10)
    assert done == [0, 1, 2, 3]


def test_an_armed_boundary_that_is_released_before_it_is_reached_never_pauses(tmp_path):
    bounds = Boundaries()
    bounds.arm("fsync", 1)
    assert bounds.release() == 0
    (tmp_path / "v").mkdir()
    Fake(LazyOps(tmp_path / "v", on_boundary=bounds)).write_file("/a", b"x", fsync=True)  # would hang if still armed


def test_a_bad_boundary_names_the_valid_kinds():
    with pytest.raises(ValueError, match="write, fsync, rename"):
        Boundaries().arm("read", 1)


# ---------------------------------------------------------------------------------------------------- passthrough


def test_passthrough_writes_straight_to_the_backing_dir(tmp_path):
    (tmp_path / "v").mkdir()
    f = Fake(LazyOps(tmp_path / "v", passthrough=True))
    f.write_file("/a", b"x")
    f.ops.rename("/a", "/b")
    assert (tmp_path / "v" / "b").read_bytes() == b"x"
    assert f.ops.drop()["names_undone"] == 0 and (tmp_path / "v" / "b").read_bytes() == b"x"


# ---------------------------------------------------------------------------------------------------- limits


def test_unsynced_data_that_would_not_fit_the_backing_disk_is_enospc(fs, monkeypatch):
    import errno
    from types import SimpleNamespace

    f, backing = fs
    monkeypatch.setattr("fleet.lazyfs.data.os.statvfs", lambda p: SimpleNamespace(f_bavail=4, f_frsize=1024))
    fh = f.ops.create("/big", 0o644)
    f.ops.write("/big", b"x" * 3000, 0, fh)
    with pytest.raises(OSError) as exc:
        f.ops.write("/big", b"y" * 2000, 3000, fh)
    assert exc.value.errno == errno.ENOSPC
    f.ops.release("/big", fh)


def test_past_the_cache_limit_a_file_is_written_back_early(tmp_path):
    (tmp_path / "v").mkdir()
    f = Fake(LazyOps(tmp_path / "v", max_dirty_bytes=10))
    f.write_file("/j", b"12345678")
    f.fsync_dir("/")
    f.append("/j", b"abcdefgh")  # past 10 bytes: the first 8 reach the backing file before this write is cached
    assert (tmp_path / "v" / "j").read_bytes() == b"12345678"
    assert f.ops.stats()["early_writebacks"] == 1
    assert f.ops.drop()["bytes_dropped"] == 8
    assert f.read("/j") == b"12345678"


def test_the_cache_of_a_file_durably_replaced_is_forgotten(fs):
    f, backing = fs
    f.write_file("/state", b"old", fsync=True)
    f.write_file("/state.tmp", b"new", fsync=True)
    f.fsync_dir("/")
    f.append("/state", b"-unsynced")  # a closed file with cached data, then replaced by a rename
    f.ops.rename("/state.tmp", "/state")
    assert f.ops.stats()["dirty_files"] == 1
    f.fsync_dir("/")
    assert f.ops.stats()["dirty_files"] == 0 and not f.ops._nodes
    assert f.read("/state") == b"new"


def test_create_of_a_name_made_meanwhile_opens_it_unless_exclusive(fs):
    f, backing = fs
    (backing / "x").write_bytes(b"there")
    fh = f.ops.create("/x", 0o644, os.O_CREAT | os.O_RDWR)
    assert f.ops.read("/x", 10, 0, fh) == b"there"
    f.ops.release("/x", fh)
    with pytest.raises(FileExistsError):
        f.ops.create("/x", 0o644, os.O_CREAT | os.O_EXCL | os.O_RDWR)


def test_an_answer_naming_a_path_that_is_not_utf8_is_escaped():
    """A hostile review: a runner's `odd\\xffname` under `torn` reached the driver as a lone surrogate and orjson
    refused the record, ending the wave as a harness error. The control answers escape such names."""
    import orjson

    from fleet.lazyfs import printable

    got = printable({"ok": True, "torn": {"path": "repo/odd\udcffname", "offset": 3}, "files": ["a\udcfe", "b"]})
    assert got == {"ok": True, "torn": {"path": "repo/odd\\xffname", "offset": 3}, "files": ["a\\xfe", "b"]}
    orjson.dumps(got)


def test_the_serving_process_keeps_its_module_path_and_marker(monkeypatch, tmp_path):
    """The sweep and the leftover checks find a lazy mount's process by `fleet.lazyfs serve` and the marker in its
    command line (`processes()`): the argv `LazyFS.mount` starts must carry both, and `-m fleet.lazyfs` must run
    (a package split once had to keep `python -m fleet.lazyfs` working)."""
    import subprocess
    import sys

    from fleet import lazyfs
    from fleet.lazyfs import client

    started = {}

    class Popen:
        def __init__(self, argv, **kw):
            started["argv"], started["env"] = argv, kw["env"]
            raise OSError("not started in a unit test")

    monkeypatch.setattr(client, "check_available", lambda: None)
    monkeypatch.setattr(client.subprocess, "Popen", Popen)
    fs = lazyfs.LazyFS(tmp_path, tmp_path, label="pin", control_root=str(tmp_path))
    with pytest.raises(OSError, match="not started"):
        fs.mount()
    cmd = " ".join(started["argv"])
    assert started["argv"][1:4] == ["-m", "fleet.lazyfs", "serve"]
    assert "fleet.lazyfs serve" in cmd and lazyfs.MARK in cmd  # what `processes()` matches
    root = started["env"]["PYTHONPATH"].split(os.pathsep)[0]
    monkeypatch.undo()  # the real Popen again
    assert os.path.isfile(os.path.join(root, "fleet", "lazyfs", "__main__.py"))  # the checkout, not fleet/
    out = subprocess.run([sys.executable, "-m", "fleet.lazyfs", "--help"], capture_output=True, text=True,
                         timeout=60, cwd=root)
    assert out.returncode == 0 and "serve" in out.stdout and "ctl" in out.stdout
