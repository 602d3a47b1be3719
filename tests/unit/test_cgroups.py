"""Sandbox cgroup edges that a live wave only hits by chance."""
from __future__ import annotations

import errno
from pathlib import Path

import pytest

from fleet.cgroups import SandboxCgroup


class _Gone:
    """A cgroup file whose directory was removed between open and read (cgroup v1 answers ENODEV)."""

    def __init__(self, err: int):
        self.err = err

    def __truediv__(self, name: str) -> "_Gone":
        return self

    def read_text(self) -> str:
        raise OSError(self.err, "gone")


def _cgroup_with_pids_dir(d) -> SandboxCgroup:
    cg = SandboxCgroup.__new__(SandboxCgroup)
    cg.dirs = {"pids": d}
    return cg


@pytest.mark.parametrize("err", [errno.ENODEV, errno.ENOENT])
def test_a_cgroup_removed_while_a_kill_waits_on_it_has_no_pids(err):
    """PK2's grace loop read cgroup.procs of a sandbox that had exited by itself and been cleaned up: ENODEV
    crashed the injection and the fault was graded unknown (seen in a make test run)."""
    assert _cgroup_with_pids_dir(_Gone(err)).pids() == []


def test_other_errors_reading_a_cgroup_are_not_hidden():
    with pytest.raises(OSError):
        _cgroup_with_pids_dir(_Gone(errno.EACCES)).pids()


def test_pids_are_read_from_cgroup_procs(tmp_path: Path):
    (tmp_path / "cgroup.procs").write_text("12\n345\n")
    assert _cgroup_with_pids_dir(tmp_path).pids() == [12, 345]
