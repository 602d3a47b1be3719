"""The record of `sandfleet up` (cluster/localfleet.py) as a hostile user meets it: a file that is not a fleet's
record, or one others could read or change, is refused and left as it is; a record naming a process that is not
the fleet's daemon is never signalled; two `up`s of one file take turns; a relative path means one file."""
from __future__ import annotations

import os
import shutil
import threading
import time

import orjson
import pytest
from pathlib import Path

from cluster import fleetrecord, localfleet
from fleet.markers import proc_cmdline, proc_start_time


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
    body = orjson.dumps(_valid(os.getpid(), proc_start_time(os.getpid())))
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
    _write(record, orjson.dumps(_valid(me, proc_start_time(me))))
    assert localfleet.read() is None and localfleet.stale()["pid"] == me
    got = localfleet.down(timeout_s=1)
    assert got["pid"] == me and not got.get("killed") and not got.get("stopped") and not record.exists()


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


def test_one_record_file_has_one_spelling(record, tmp_path, monkeypatch):
    """The daemon is found by the record's path on its command line: `//`, `..` and a linked directory are the same
    file as the plain path (else a live fleet looked dead, and `sweep` removed its record)."""
    (tmp_path / "lnk").symlink_to(record.parent)
    for spelling in (f"/{record}", str(tmp_path / "run" / ".." / "run" / "fleet.json"), str(tmp_path / "lnk" / "fleet.json")):
        monkeypatch.setenv(localfleet.FILE_ENV, spelling)
        assert localfleet.fleet_file() == record.resolve(), spelling


def test_a_huge_file_or_a_state_dir_outside_tmp_is_not_a_record(record):
    with open(record, "wb") as f:
        f.truncate(fleetrecord.RECORD_MAX + 1)  # (sparse)
    os.chmod(record, 0o600)
    with pytest.raises(localfleet.FleetError, match="bytes; a record is a few kB"):
        localfleet.read()
    info = _valid(os.getpid(), proc_start_time(os.getpid()))
    for sd in ("/tmp/sandfleet-fleet-../../etc", "/tmp/sandfleet-fleet-x/sub", "/etc/sandfleet-fleet-x"):
        _write(record, orjson.dumps(dict(info, state_dir=sd)))
        with pytest.raises(localfleet.FleetError, match="state_dir"):
            localfleet.read()


def test_a_dead_fleets_dir_never_names_a_live_owners_ray(tmp_path):
    """Anyone can make a dir under /tmp: a dead fleet's dir that names the Ray temp dir of a live owner (a wave's
    driver, a fleet) must not make the sweep end that Ray. Without the live owner, the same Ray is the dead one's."""
    import secrets
    import subprocess
    import sys

    from cluster import sweep

    tag = secrets.token_hex(4)
    ray_tmp = f"/tmp/sfray-test{tag}"
    live, forged = Path(f"/tmp/sandfleet-fleet-live{tag}"), Path(f"/tmp/sandfleet-fleet-evil{tag}")
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)",
                             ray_tmp], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"  # (up and running, as the sweep will see it)
        for d, owner in ((live, os.getpid()), (forged, None)):
            d.mkdir()
            (d / "ray.json").write_bytes(orjson.dumps({"tmpdir": ray_tmp}))
            (d / "driver.json").write_bytes(orjson.dumps({"pid": owner or 999999999, "start": proc_start_time(owner)
                                                          if owner else "1"}))
        got = sweep.dead_fleets()
        assert str(live) not in got and got[str(forged)]["ray_tmpdir"] is None
        assert proc.pid not in [p["pid"] for p in got[str(forged)]["processes"]]
        (live / "driver.json").unlink()  # the negative control: no live owner names it now
        got = sweep.dead_fleets()
        assert got[str(forged)]["ray_tmpdir"] == ray_tmp
        assert proc.poll() is None, f"the stand-in for the dead fleet's Ray ended on its own ({proc.returncode})"
        assert proc.pid in [p["pid"] for p in got[str(forged)]["processes"]], (got, proc_cmdline(str(proc.pid)))
    finally:
        proc.kill()
        proc.wait()
        for d in (live, forged):
            shutil.rmtree(d, ignore_errors=True)
