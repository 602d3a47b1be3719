"""The driver's side of a watch armed with each attempt (PK5): a fired watch hands its kill to its fault, one
that did not fire carries the rest of its count to the next attempt, a crashed one is never a pass."""
from __future__ import annotations

import asyncio

from cluster.wave.injector import Injector
from cluster.wave.timeline import TaskRun
from fleet.records import PlannedTask


def _run_with_arm(nth: int) -> tuple[TaskRun, asyncio.Future]:
    run = TaskRun(plan=PlannedTask("t0", "task", 1, "durable", "patch-repo", 3))
    fut = asyncio.get_running_loop().create_future()
    run.arms["t0-PK5"] = {"arm": {"kind": "checkpoints", "nth": nth, "window": "", "reason": "t0-PK5"},
                          "future": fut}
    return run, fut


def test_a_watch_that_did_not_fire_hands_the_rest_of_its_count_on():
    async def main():
        run, fut = _run_with_arm(3)
        assert Injector.settle_arms(run, "t0-a1", {"t0-PK5": {"fired": False, "seen": 2}}) is False
        assert run.arms["t0-PK5"]["arm"]["nth"] == 1 and not fut.done()
        assert Injector.settle_arms(run, "t0-a2", {}) is False  # an attempt with no report (its host was lost)
        assert run.arms["t0-PK5"]["arm"]["nth"] == 1
        fired = {"fired": True, "applied": True, "window_name": "x", "at": 1.0}
        assert Injector.settle_arms(run, "t0-a3", {"t0-PK5": fired}) is True
        assert fut.result() == dict(fired, sandbox_id="t0-a3")
        assert Injector.settle_arms(run, "t0-a4", {"t0-PK5": fired}) is False  # settled once only
    asyncio.run(main())


def test_a_crashed_watch_is_unknown_not_a_pass():
    async def main():
        run, fut = _run_with_arm(1)
        Injector.settle_arms(run, "t0-a1", {"t0-PK5": {"fired": False, "seen": 0, "error": "OSError: x"}})
        out = fut.result()
        assert out["applied"] is None and "the watch crashed" in out["error"]
    asyncio.run(main())


def test_faults_use_only_what_the_context_protocol_declares_and_the_wave_gives_all_of_it():
    """Every `ctx.<name>` a fault uses is declared by faults.base.FaultContext, and the wave's WaveContext has it."""
    import re
    from pathlib import Path

    from cluster.wave.context import WaveContext
    from faults.base import FaultContext

    used = set()
    for f in (Path(__file__).resolve().parents[2] / "faults").glob("*.py"):
        used |= set(re.findall(r"\bctx\.([a-z_]+)", f.read_text()))
    declared = {n for n in dir(FaultContext) if not n.startswith("_")} | set(FaultContext.__annotations__)
    assert used and used <= declared, sorted(used - declared)
    assert all(hasattr(WaveContext, n) for n in declared - {"bucket"}), sorted(
        n for n in declared if not hasattr(WaveContext, n))
