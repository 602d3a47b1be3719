"""The docker backend's last resort when the engine stops answering: a runner is ended by its pid only while that
pid still carries its sandbox's marker (a reused pid, or another wave's sandbox, is never signalled)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from fleet.docker_backend import DockerBackend, EngineUnavailable, engine_answered, marked
from fleet.lifecycle import Lifecycle
from fleet.sandbox import SANDBOX_TRANSITIONS, Sandbox, SandboxSpec, SandboxState


def _sleeper(env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=dict(os.environ, **env))


def _sandbox(pid: int, wave: str = "w-20261201T000000-s1-abcd", sid: str = "t000-a1") -> Sandbox:
    spec = SandboxSpec(wave, sid, "t000", 1, ["true"], {}, "/nonexistent", backend="docker")
    sb = Sandbox(spec=spec, life=Lifecycle(SANDBOX_TRANSITIONS, SandboxState.CREATED))
    sb.pid = pid
    return sb


def test_only_a_pid_with_its_sandbox_marker_is_killed():
    wave = "w-20261201T000000-s1-abcd"
    mine = _sleeper({"SANDFLEET_SANDBOX": f"{wave}/t000-a1"})
    other = _sleeper({"SANDFLEET_SANDBOX": f"{wave}/t001-a1"})  # another sandbox of the same wave
    plain = _sleeper({})  # a pid that was reused by something else
    try:
        time.sleep(0.2)
        backend = DockerBackend()
        assert marked(mine.pid, wave, "t000-a1") and not marked(other.pid, wave, "t000-a1")
        assert not backend._signal_by_pid(_sandbox(other.pid), 9)
        assert not backend._signal_by_pid(_sandbox(plain.pid), 9)
        assert backend._signal_by_pid(_sandbox(mine.pid), 9)
        assert mine.wait(10) == -9
        assert other.poll() is None and plain.poll() is None
        assert not backend._signal_by_pid(_sandbox(mine.pid), 9)  # gone: nothing to signal
    finally:
        for p in (mine, other, plain):
            p.kill()
            p.wait(10)


def test_engine_errors_are_told_from_an_engine_that_does_not_answer():
    import docker
    import requests

    assert engine_answered(docker.errors.NotFound("no such container"))
    assert not engine_answered(requests.exceptions.ConnectionError("refused"))
    assert EngineUnavailable("x").harness_part == "docker engine"
