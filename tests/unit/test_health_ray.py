"""The health watch follows the processes of the wave's own Ray by pid and start time (stand-in processes here:
`sleep`s we start and end by pid), and names a dead one as the cause of what it took with it."""
from __future__ import annotations

import subprocess
import time
from types import SimpleNamespace

from cluster.wave.health import Health


def _health(procs: list[tuple[str, str, int]]) -> tuple[Health, list]:
    session = SimpleNamespace(core_processes=lambda: list(procs))
    parts = SimpleNamespace(fleet=SimpleNamespace(ray_session=session, down=set()))
    events: list = []
    h = Health(SimpleNamespace(), lambda name, **kw: events.append((name, kw)), parts, SimpleNamespace(out=set()),
               lambda: None)
    return h, events


def _gone(p: subprocess.Popen) -> None:
    p.kill()
    p.wait(10)


def test_a_dead_raylet_is_named_as_the_cause_of_the_actor_it_took_and_every_dead_one_is_listed():
    raylet, agent = (subprocess.Popen(["sleep", "60"]) for _ in range(2))
    try:
        h, events = _health([("raylet node-0", "node-0", raylet.pid), ("Ray dashboard agent node-0", "node-0",
                                                                       agent.pid)])
        assert h.track_ray() == {"raylet node-0": raylet.pid, "Ray dashboard agent node-0": agent.pid}
        assert h.dead_ray_process() is None
        _gone(agent)
        _gone(raylet)
        part, why = h.dead_ray_process()
        assert part == "raylet node-0" and f"pid {raylet.pid} exited" in why and "Ray dashboard agent node-0" in why
        h.part_lost("sandbox host node-0", "the actor died while it ran attempt t000-a1")
        assert h.harness_fault.part == "raylet node-0" and "seen as sandbox host node-0" in h.harness_fault.why
        assert events[0][0] == "harness_fault" and events[0][1]["part"] == "raylet node-0"
    finally:
        for p in (raylet, agent):
            if p.poll() is None:
                _gone(p)


def test_a_lost_nodes_processes_are_not_watched_and_a_process_seen_late_is_still_watched():
    early, late = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        procs = [("raylet node-1", "node-1", early.pid)]
        h, _ = _health(procs)
        h.track_ray()
        h.nodes.out.add("node-1")  # PK3 takes node-1: its raylet goes on purpose
        _gone(early)
        assert h.dead_ray_process() is None
        h.nodes.out.discard("node-1")  # back, as a new raylet
        procs[:] = [("raylet node-1", "node-1", late.pid)]
        assert h.dead_ray_process() is None and h.ray_procs["raylet node-1"][1] == late.pid
        _gone(late)
        assert h.dead_ray_process()[0] == "raylet node-1"
    finally:
        for p in (early, late):
            if p.poll() is None:
                _gone(p)
        time.sleep(0)


def test_a_stopped_raylet_is_struck_out_named_as_the_cause_and_ended_by_its_pid():
    """Regression (a hostile user's find: a SIGSTOPped GCS, raylet or sweep actor held the wave's teardown without a
    bound, and after SIGCONT the wave passed): a stopped process of the wave is a strike per probe, named as the
    cause of what its stop took (the GCS calls a stopped raylet's node dead, and its actors with it), and ended by
    its pid, checked by start time; a process that goes on again is no longer struck."""
    import asyncio
    import signal

    raylet, ledger = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        h, events = _health([("raylet node-0", "node-0", raylet.pid)])
        h.parts.store = h.parts.proxy = None
        h.track_ray()
        h.own("lease ledger", ledger.pid)
        assert asyncio.run(h.probe_stopped()) == {"raylet node-0": None, "lease ledger": None}
        ledger.send_signal(signal.SIGSTOP)
        _wait_state(ledger.pid, "T")
        got = asyncio.run(h.probe_stopped())
        assert got["raylet node-0"] is None and "is stopped (state T" in got["lease ledger"][0], got
        ledger.send_signal(signal.SIGCONT)
        _wait_state(ledger.pid, "S")
        assert asyncio.run(h.probe_stopped())["lease ledger"] is None

        raylet.send_signal(signal.SIGSTOP)
        _wait_state(raylet.pid, "T")
        h.part_lost("lease ledger", "the actor died (its node was marked dead)")
        assert h.harness_fault.part == "raylet node-0", h.harness_fault
        assert "is stopped" in h.harness_fault.why and f"SIGKILL to pid {raylet.pid}" in h.harness_fault.why
        assert raylet.wait(10) == -signal.SIGKILL
        assert ledger.poll() is None  # not the cause: left alone
    finally:
        for p in (raylet, ledger):
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                _gone(p)


def test_only_a_stopped_process_with_its_recorded_start_time_is_ended():
    import signal

    p = subprocess.Popen(["sleep", "60"])
    try:
        h, _ = _health([])
        h.parts.store = h.parts.proxy = None
        h.own_pids["sweep actor"] = (p.pid, "1")  # another process once had this pid
        p.send_signal(signal.SIGSTOP)
        _wait_state(p.pid, "T")
        assert h.end_stopped("sweep actor") is None and p.poll() is None
        h.own("sweep actor", p.pid)
        assert "SIGKILL" in h.end_stopped("sweep actor") and p.wait(10) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            _gone(p)


def _wait_state(pid: int, want: str) -> None:
    from cluster.wave.health import _state

    deadline = time.monotonic() + 5
    while _state(pid) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _state(pid) == want
