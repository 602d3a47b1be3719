"""RaySession.stop: a step of Ray's own stop that fails does not leave the rest of the wave's Ray running."""
from __future__ import annotations

import pytest

from cluster import raysession
from cluster.raysession import RaySession


class FailingHead:
    """A head node whose stop fails (as Ray's `kill_all_processes` can on a process that is already gone)."""

    def __init__(self):
        self.calls = []

    def destroy_external_storage(self):
        self.calls.append("destroy_external_storage")

    def kill_all_processes(self, check_alive, allow_graceful):
        self.calls.append("kill_all_processes")
        raise RuntimeError("a raylet that would not die")


class Cluster:
    def __init__(self):
        self.stopped = False

    def shutdown(self):
        self.stopped = True


def test_a_failed_head_stop_still_ends_the_ray_by_its_marker(tmp_path, monkeypatch):
    ended = []
    monkeypatch.setattr(raysession, "end_leftovers", lambda tmp: ended.append(tmp) or ["killed 1 (ray::DashboardAgent)"])
    tmp = tmp_path / "sfray-x"
    tmp.mkdir()
    s = RaySession("local", tmpdir=str(tmp))
    s.tmpdir, s.head, s.cluster = str(tmp), FailingHead(), Cluster()
    head, cluster = s.head, s.cluster
    with pytest.raises(RuntimeError, match="would not die"):
        s.stop()
    assert head.calls == ["destroy_external_storage", "kill_all_processes"]
    assert cluster.stopped, "a failed head stop kept the cluster's nodes running"
    assert ended == [str(tmp)], "the wave's Ray was not ended by its temp dir"
    assert s.ended_leftovers == ["killed 1 (ray::DashboardAgent)"]
    assert not tmp.exists() and s.tmpdir is None and s.head is None
