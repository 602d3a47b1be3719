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
