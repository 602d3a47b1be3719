"""The process sandbox's argv as bwrap runs it (no cgroup, no network namespace: those are the host's part), with the
seccomp filter of fleet/seccomp.py: no new user namespace (alone, or with mount and network namespaces inside it),
clone3 answered ENOSYS so libc falls back, threads and forks still work, and /sys/fs/cgroup is empty (issue 42)."""
from __future__ import annotations

import os
import struct
import subprocess

from fleet import seccomp
from fleet.sandbox import ProcessBackend, SandboxSpec

PROBE = ("unshare -U true 2>/dev/null; echo userns=$?; unshare -Urmn true 2>/dev/null; echo userns_mnt_net=$?; "
         "echo cgroups=$(ls -A /sys/fs/cgroup | wc -l); "
         "python3 -c 'import os,threading; t=threading.Thread(target=lambda: None); t.start(); t.join(); "
         "pid=os.fork(); os._exit(0) if pid == 0 else print(\"threads_forks=ok\", os.waitpid(pid, 0)[1])'; id -u")


def _run(tmp_path, with_filter: bool) -> str:
    spec = SandboxSpec(wave_id="w-20261206T000000-s1-abcd", sandbox_id="t000-a1", task_id="t000", attempt=1,
                       argv=["/bin/sh", "-c", PROBE], env={}, state_dir=str(tmp_path))
    os.makedirs(spec.workspace, exist_ok=True)
    fd = seccomp.filter_fd() if with_filter else None
    try:
        p = subprocess.run(["bwrap", *ProcessBackend.bwrap_args(spec, None, fd)], capture_output=True, text=True,
                           timeout=60, pass_fds=(fd,) if fd is not None else ())
    finally:
        if fd is not None:
            os.close(fd)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_the_sandbox_refuses_new_user_namespaces_and_shows_no_cgroup(tmp_path):
    out = _run(tmp_path, with_filter=True)
    assert "userns=1" in out and "userns_mnt_net=1" in out, out
    assert "cgroups=0" in out and "threads_forks=ok 0" in out and out.strip().endswith("65534"), out


def test_without_the_filter_the_same_sandbox_makes_a_user_namespace(tmp_path):
    """The control: the probe sees what the filter stops (a test that cannot fail is a defect)."""
    out = _run(tmp_path, with_filter=False)
    assert "userns=0" in out and "userns_mnt_net=0" in out, out


def test_the_filter_is_a_well_formed_program_for_each_machine():
    for machine in ("x86_64", "aarch64"):
        prog = seccomp.program(machine)
        assert len(prog) % 8 == 0 and 0 < len(prog) // 8 < 64
        last = struct.unpack("<HBBI", prog[-8:])
        assert last[0] == 0x06  # ends in a return
