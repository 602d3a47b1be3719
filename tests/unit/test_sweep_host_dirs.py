"""`sandfleet sweep` on a node: a dead sandbox host's dir (credentials included) is found and removed, a live host's
is never touched, and `--wave W` touches only W (its part of a dead host's dir; no other wave's harness cgroup)."""
from __future__ import annotations

import os
import subprocess
import sys

import orjson

from cluster import sweep
from fleet import hostdirs, markers

W1, W2 = "w-20261206T060000-s1-aaaa", "w-20261206T060000-s2-bbbb"


def _host_dir(root, node: str, pid: int | None, waves=(W1, W2)):
    d = root / f"sandfleet-host-{node}"
    for w in waves:
        (d / w / "creds" / "t000-a1").mkdir(parents=True)
        (d / w / "creds" / "t000-a1" / "credentials.json").write_text('{"AccessKeyId": "AK"}')
        (d / w / "sandboxes" / "t000-a1").mkdir(parents=True)
    (d / "code" / "abc").mkdir(parents=True)
    if pid is not None:
        (d / hostdirs.HOST_RECORD).write_bytes(orjson.dumps({"pid": pid, "start": markers.proc_start_time(pid)}))
    return d


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_dead_hosts_dir_goes_with_its_credentials_and_a_live_ones_stays(tmp_path):
    dead = _host_dir(tmp_path, "node-1", _dead_pid())
    live = _host_dir(tmp_path, "node-2", os.getpid())
    found = hostdirs.dead_host_dirs(root=str(tmp_path))
    assert [e["dir"] for e in found] == [str(dead)] and found[0]["waves"] == [W1, W2]
    assert len(found[0]["credentials"]) == 2
    assert "removed the dead sandbox host's dir" in hostdirs.remove(found[0])[-1]
    assert not dead.exists() and (live / W1 / "creds" / "t000-a1" / "credentials.json").exists()


def test_with_a_wave_only_that_waves_part_of_a_dead_hosts_dir_goes(tmp_path):
    dead = _host_dir(tmp_path, "node-1", _dead_pid())
    found = hostdirs.dead_host_dirs(W1, root=str(tmp_path))
    assert [e["path"] for e in found] == [str(dead / W1)] and len(found[0]["credentials"]) == 1
    hostdirs.remove(found[0])
    assert not (dead / W1).exists() and (dead / W2 / "creds" / "t000-a1" / "credentials.json").exists()
    assert (dead / "code").is_dir()
    assert hostdirs.dead_host_dirs("w-20261206T060000-s3-cccc", root=str(tmp_path)) == []


def test_a_dir_with_no_record_is_dead_only_once_it_is_old(tmp_path):
    d = _host_dir(tmp_path, "node-3", None)
    assert hostdirs.dead_host_dirs(root=str(tmp_path)) == []  # a host may be making it right now
    old = d.stat().st_mtime - hostdirs.NO_RECORD_AGE_S - 1
    os.utime(d, (old, old))
    assert [e["dir"] for e in hostdirs.dead_host_dirs(root=str(tmp_path))] == [str(d)]


def test_record_owner_names_this_process(tmp_path):
    home = tmp_path / "sandfleet-host-node-9"
    hostdirs.record_owner(home)
    assert hostdirs.owner_alive(home) is True and oct(home.stat().st_mode & 0o777) == "0o711"


def test_sweep_of_one_wave_leaves_other_waves_harness_cgroups(tmp_path, monkeypatch):
    """`sweep --wave W` removed every empty harness cgroup, other waves' drivers' included."""
    private = tmp_path / f"sandfleet-{W1}"
    private.mkdir()
    gone = _dead_pid()
    (private / "driver.json").write_bytes(orjson.dumps({"pid": gone, "start": "1"}))
    cg = tmp_path / "cg"
    for name in (f"driver-{gone}", "driver-1", "host-node-1-1"):
        (cg / name).mkdir(parents=True)
        (cg / name / "cgroup.procs").write_text("")
    monkeypatch.setattr(sweep, "markers", lambda errors=None: (
        {W1: {"processes": [], "cgroups": [], "mounts": [], "containers": [], "private_dir": str(private)}},
        {W1: private}))
    monkeypatch.setattr(sweep.cgroups, "harness_dirs", lambda: sorted(str(p) for p in cg.iterdir()))
    monkeypatch.setattr(sweep, "dead_node_cgroups", lambda tags=frozenset(): [])
    monkeypatch.setattr(hostdirs, "dead_host_dirs", lambda wave=None: [])
    assert sweep.find(W1)["harness_cgroups"] == [str(cg / f"driver-{gone}")]
    assert sorted(sweep.find(None)["harness_cgroups"]) == sorted(str(p) for p in cg.iterdir())


def test_a_wave_whose_driver_runs_on_another_node_is_not_a_dead_one_here(monkeypatch):
    """On a node, no wave has its private dir: without the cluster's live waves, `sweep --cluster` took a running
    wave's sandboxes there for a dead wave's."""
    monkeypatch.setattr(sweep, "markers", lambda errors=None: (
        {W1: {"processes": [{"pid": 1, "cmd": "x", "sandbox": "t000-a1"}], "cgroups": ["t000-a1"], "mounts": [],
              "containers": [], "private_dir": None}}, {}))
    monkeypatch.setattr(sweep, "dead_node_cgroups", lambda tags=frozenset(): [])
    monkeypatch.setattr(hostdirs, "dead_host_dirs", lambda wave=None: [])
    assert W1 in sweep.find(W1)["waves"]
    assert sweep.find(W1, live={W1})["waves"] == {}
