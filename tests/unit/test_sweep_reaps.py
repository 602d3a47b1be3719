"""The sweep actor's record of what it reaped (fleet/sweeper.py WaveSweep), with a fake ledger and markers."""
from __future__ import annotations

import asyncio
import threading

from fleet.sweeper import WaveSweep

WAVE = "w-20261202T120000-s1-abcd"


class _Ledger:
    class _M:
        def remote(self, prefix):
            return []  # no lease at all: every sandbox found is a leak

    leases_of = _M()


def _waves(*sids):
    return {WAVE: {"processes": [{"pid": 100 + i, "sandbox": s} for i, s in enumerate(sids)], "cgroups": list(sids),
                   "containers": [], "mounts": []}}


class _Sweep(WaveSweep):
    def __init__(self, fail: set[str], clock):
        super().__init__(WAVE, _Ledger(), settle_s=0.0, clock=clock, period_s=0.0)
        self.fail = fail
        self.calls: list[str] = []
        self.gate = threading.Event()

    def _reap(self, sid: str) -> dict:
        self.calls.append(sid)
        self.gate.wait(2)
        if sid in self.fail:
            raise OSError(19, "No such device")
        return {"sandbox_id": sid}


def test_a_failed_reap_loses_none_of_the_others_and_is_reported(monkeypatch):
    """A pass reaped t1, then t2's reap raised: t1 was killed but went missing from the report (seen as a
    leaked sandbox in `leaked` and not in `reaped` in a loaded make test run)."""
    import fleet.sweeper

    async def plain(x):
        return x

    monkeypatch.setattr(fleet.sweeper, "awaitable", plain)
    sw = _Sweep({"t2-a1"}, clock=lambda: 100.0)
    sw.gate.set()
    asyncio.run(sw.scan(_waves("t1-a1", "t2-a1", "t3-a1")))
    assert [r["sandbox_id"] for r in sw.reaped] == ["t1-a1", "t3-a1"]
    assert any(e.startswith("reap t2-a1: OSError") for e in sw.errors), sw.errors


def test_two_passes_of_one_wave_never_reap_at_once(monkeypatch):
    """The actor's loop and `final` both scan: their passes take turns, so a sandbox is never reaped by two
    threads at once (the second pass finds it gone)."""
    import fleet.sweeper

    async def plain(x):
        return x

    monkeypatch.setattr(fleet.sweeper, "awaitable", plain)
    sw = _Sweep(set(), clock=lambda: 100.0)
    gone: set[str] = set()
    orig = sw._reap

    def reap(sid):
        assert sid not in gone, f"{sid} reaped twice"
        r = orig(sid)
        gone.add(sid)
        return r

    sw._reap = reap

    async def both():
        first = asyncio.create_task(sw.scan(_waves("t1-a1")))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(sw.scan())  # lists by itself (the markers below): t1 until it is reaped
        await asyncio.sleep(0.05)
        sw.gate.set()
        await asyncio.gather(first, second)

    import fleet.markers

    monkeypatch.setattr(fleet.markers, "markers", lambda errors=None, engine_lost=None: (
        _waves(*[s for s in ("t1-a1",) if s not in gone]), {}))
    asyncio.run(both())
    assert sw.calls == ["t1-a1"]
