"""Daemons start clean (issue 42): `infra/dockerd-up` gave dockerd every descriptor of its caller, so a
`flock LOCK make test` left dockerd and containerd holding the lock for 41 minutes. The script runs here with a fake
`dockerd` first on PATH that records its descriptors and session (the machine's own dockerd is never stopped or
started by a test), while the caller holds an inherited flock."""
from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
FAKE_DOCKERD = """#!/usr/bin/python3
import json, os
fds = {}
for f in os.listdir("/proc/self/fd"):
    try:
        fds[f] = os.readlink("/proc/self/fd/" + f)
    except OSError:
        pass
out = os.environ["SF_DUMP"]
with open(out + ".tmp", "w") as fh:
    json.dump({"fds": {k: v for k, v in fds.items() if not v.startswith("/proc/")}, "sid": os.getsid(0),
               "pid": os.getpid()}, fh)
os.rename(out + ".tmp", out)
"""


def held_lock(path: Path) -> int:
    """An flock on `path` whose descriptor children inherit (not CLOEXEC), as `flock LOCK make ...` holds one."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.set_inheritable(fd, True)
    return fd


def test_dockerd_up_starts_dockerd_without_the_callers_descriptors_in_its_own_session(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dockerd").write_text(FAKE_DOCKERD)
    (bin_dir / "docker").write_text('#!/bin/sh\n[ -e "$SF_DUMP" ]\n')  # answers once the fake engine ran
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    dump, lock = tmp_path / "dockerd.json", tmp_path / "suite.lock"
    fd = held_lock(lock)
    try:
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SF_DUMP=str(dump),
                   SANDFLEET_DOCKERD_LOG=str(tmp_path / "dockerd.log"))
        p = subprocess.run(["bash", str(ROOT / "infra" / "dockerd-up")], env=env, pass_fds=(fd,),
                           capture_output=True, text=True, timeout=60)
    finally:
        os.close(fd)
    assert p.returncode == 0 and "dockerd up" in p.stdout, (p.stdout, p.stderr)
    deadline = time.monotonic() + 10
    while not dump.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    got = orjson.loads(dump.read_bytes())
    assert str(lock) not in got["fds"].values(), got
    assert sorted(got["fds"]) == ["0", "1", "2"], got  # stdin /dev/null, the log twice
    assert got["fds"]["0"] == "/dev/null" and got["fds"]["1"] == str(tmp_path / "dockerd.log"), got
    assert got["sid"] == got["pid"], got  # a session of its own
