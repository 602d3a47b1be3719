"""The record of `sandfleet up` (cluster/localfleet.py) as a hostile user meets it: a file that is not a fleet's
record, or one others could read or change, is refused and left as it is; a record naming a process that is not
the fleet's daemon is never signalled; two `up`s of one file take turns; a relative path means one file."""
from __future__ import annotations

import os
import threading
import time

import orjson
import pytest

from cluster import localfleet
from fleet.markers import _start_time


@pytest.fixture
def record(tmp_path, monkeypatch):
    path = tmp_path / "run" / "fleet.json"
    path.parent.mkdir(mode=0o700)
    monkeypatch.setenv(localfleet.FILE_ENV, str(path))
    return path


def _write(path, body: bytes, mode: int = 0o600) -> None:
    path.write_bytes(body)
    os.chmod(path, mode)


def _valid(pid: int, start: str) -> dict:
    return {"kind": localfleet.KIND, "pid": pid, "start": start, "ready": True, "up_since": time.time(),
            "state_dir": localfleet.STATE_PREFIX + "nonexistent", "namespace": "sandfleet-fleet",
            "ray": {"address": "127.0.0.1:1", "token": "x", "tmpdir": "/tmp/sfray-none"}, "actors": {},
            "node_ids": ["node-0"], "host_info": [], "bucket": "b",
            "store": {"url": "http://127.0.0.1:1", "pid": 1, "start": "0"}}


@pytest.mark.parametrize("body, needle", [
    (b'{"name": "my precious settings"}', "kind is None"),
    (b'{"kind": "sandfleet-fleet", "pid": "abc"', "not JSON"),
    (b"[1, 2]", "is a list, not an object"),
])
def test_a_file_that_is_not_a_fleet_record_is_refused_and_left_as_it_is(record, body, needle):
    _write(record, body)
    for call in (localfleet.read, localfleet.stale, localfleet.down, localfleet.status):
        with pytest.raises(localfleet.FleetError, match="is not the record of a `sandfleet up` fleet") as exc:
            call()
        assert needle in str(exc.value) and "nothing was changed" in str(exc.value)
    assert record.read_bytes() == body


def test_a_record_others_could_read_or_change_is_refused(record):
    body = orjson.dumps(_valid(os.getpid(), _start_time(os.getpid())))
    _write(record, body, 0o644)
    with pytest.raises(localfleet.FleetError, match="has mode 644 .* only a file of this user with mode 600"):
        localfleet.down()
    assert record.read_bytes() == body
    record.unlink()
    record.mkdir()
    with pytest.raises(localfleet.FleetError, match="is not a regular file"):
        localfleet.read()


def test_a_record_naming_a_process_that_is_not_the_daemon_is_never_signalled(record):
    """A forged record naming this very process (right pid, right start time) is a dead fleet's: `read` says no
    fleet, `stale` names it, and `down` removes the record without a signal (this test would die of SIGTERM)."""
    me = os.getpid()
    _write(record, orjson.dumps(_valid(me, _start_time(me))))
    assert localfleet.read() is None and localfleet.stale()["pid"] == me
    got = localfleet.down(timeout_s=1)
    assert got["pid"] == me and not got.get("killed") and not record.exists()


def test_a_relative_record_path_is_one_absolute_file(record, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(localfleet.FILE_ENV, "run/fleet.json")
    assert localfleet.fleet_file() == record and localfleet.fleet_file().is_absolute()


def test_two_ups_of_one_record_take_turns(record):
    held, released = threading.Event(), threading.Event()

    def first():
        with localfleet._UpLock(record, 5):
            held.set()
            released.wait(5)

    t = threading.Thread(target=first)
    t.start()
    try:
        assert held.wait(5)
        with pytest.raises(localfleet.FleetError, match="another `sandfleet up`"):
            with localfleet._UpLock(record, 0.3):
                pass
    finally:
        released.set()
        t.join()
    with localfleet._UpLock(record, 1):  # free again once the first is done
        pass


def test_an_unwritable_record_directory_is_a_fleet_error_naming_it(monkeypatch):
    monkeypatch.setenv(localfleet.FILE_ENV, "/proc/sandfleet-no/fleet.json")
    with pytest.raises(localfleet.FleetError, match="/proc/sandfleet-no cannot be used"):
        localfleet.up(timeout_s=1)
