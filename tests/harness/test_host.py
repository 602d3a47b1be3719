"""The real SandboxHost and LeaseLedger against a fake backend."""
from __future__ import annotations

import asyncio


from fleet.host import SandboxHost, WaveHost, WaveHosts
from fleet.ledger import LeaseLedger
from tests.harness.fakes import FakeBackend, LocalLedger, wait_for


def spec(sid: str, wave: str = "w") -> dict:
    return {"wave_id": wave, "sandbox_id": sid, "task_id": "t0", "attempt": 1, "argv": ["x"], "env": {},
            "state_dir": "/nonexistent"}


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_preempted_attempt_reports_the_kill_and_next_attempt_gets_next_fence(tmp_path):
    async def main():
        led = LeaseLedger(str(tmp_path / "l.db"))
        be = FakeBackend()
        host = SandboxHost("n0", be, LocalLedger(led))
        lease = led.acquire("w/t0", "n0", "s1", 30)
        run = asyncio.create_task(host.run_attempt(spec("s1"), lease, 30))
        await wait_for(lambda: "w/s1" in be.exits, "sandbox s1 started")
        be.preempt("w/s1")
        out = await run
        assert out.exit_code == -9 and out.state == "removed"
        assert [h[2] for h in out.history] == ["running", "removed"] or out.killed_by == "preempt"
        led.release("w/t0", lease.fence)
        nxt = led.acquire("w/t0", "n0", "s2", 30)
        assert nxt.fence == lease.fence + 1
    asyncio.run(main())


def test_kill_of_a_finished_sandbox_is_not_applied(tmp_path):
    async def main():
        be = FakeBackend()
        host = SandboxHost("n0", be, None)
        run = asyncio.create_task(host.run_attempt(spec("s1"), {}, 30))
        await wait_for(lambda: "w/s1" in be.exits, "sandbox s1 started")
        be.finish("w/s1", 0)
        await run
        res = await host.kill("w/s1", 0.0, "PK1")
        assert res["applied"] is False and "not running" in res["why"]
    asyncio.run(main())


def test_fenced_attempt_is_killed_when_renewal_is_refused(tmp_path):
    async def main():
        clock = Clock()
        led = LeaseLedger(str(tmp_path / "l.db"), clock=clock)
        be = FakeBackend()
        host = SandboxHost("n0", be, LocalLedger(led))
        lease = led.acquire("w/t0", "n0", "s1", 0.6)
        run = asyncio.create_task(host.run_attempt(spec("s1"), lease, 0.6))
        await wait_for(lambda: "w/s1" in be.exits, "sandbox s1 started")
        clock.t += 5  # the lease expired while the holder was away (e.g. frozen)
        out = await asyncio.wait_for(run, 5)
        assert out.killed_by.startswith("fenced")
    asyncio.run(main())


def test_a_lease_that_arrives_late_in_its_life_is_renewed_before_its_first_tick(tmp_path):
    """Under load a lease reaches its host long after the driver acquired it (at 4,000 hollow sandboxes, 27 s into a
    30 s TTL): the host renews it within FRESH_S of its arrival, not a quarter-TTL tick later (here 100 s)."""
    async def main():
        clock = Clock()
        led = LeaseLedger(str(tmp_path / "l.db"), clock=clock)
        be = FakeBackend()
        host = SandboxHost("n0", be, LocalLedger(led))
        lease = led.acquire("w/t0", "n0", "s1", 400)
        clock.t = 390  # the attempt's key took that long to issue: 10 s of the lease are left when the host gets it
        run = asyncio.create_task(host.run_attempt(spec("s1"), lease, 400))
        await wait_for(lambda: host.renew_stats["renewed"] >= 1, "the late lease renewed", timeout_s=30)
        assert led.get("w/t0", lease.fence)["expires_at"] == 390 + 400
        assert host.renew_stats["ticks"] == 0 and host.renew_stats["fresh_batches"] >= 1
        clock.t = 400  # past the lease's first expiry: it holds, since it was renewed
        be.finish("w/s1", 0)
        out = await asyncio.wait_for(run, 5)
        assert out.exit_code == 0 and not out.killed_by, out
        assert led.get("w/t0", lease.fence)["state"] == "active"  # the host does not release: the driver does
    asyncio.run(main())


class LateAnswerLedger:
    """A LocalLedger whose first `renew_many` is applied at once but answered only after the host gave up
    waiting for it (a ledger busy with 1,000 sandboxes' renewals)."""

    def __init__(self, ledger, host_errors):
        self.inner, self.host_errors, self.late = ledger, host_errors, 0
        for name in ("acquire", "release", "revoke", "active", "dump", "ping"):
            setattr(self, name, getattr(LocalLedger(ledger), name))
        self.renew_many = self

    def remote(self, items):
        res = self.inner.renew_many(items)

        async def answer():
            if self.late == 0:
                self.late += 1
                await wait_for(lambda: self.host_errors() >= 1, "the host stopped waiting for the renewal")
            return res
        return answer()


def test_renewal_answered_after_the_host_stopped_waiting_does_not_fence_the_attempt(tmp_path):
    async def main():
        led = LeaseLedger(str(tmp_path / "l.db"), clock=Clock())  # frozen: nothing expires, only versions move
        be = FakeBackend()
        host = SandboxHost("n0", be, None)
        host.ledger = LateAnswerLedger(led, lambda: host.renew_stats["errors"])
        lease = led.acquire("w/t0", "n0", "s1", 2.0)
        run = asyncio.create_task(host.run_attempt(spec("s1"), lease, 2.0))
        await wait_for(lambda: host.renew_stats["errors"] == 1 and host.renew_stats["renewed"] >= 2,
                       "two renewals answered after the late one")
        assert host.renew_stats["refused"] == 0, led.dump()["history"]
        be.finish("w/s1", 0)
        out = await asyncio.wait_for(run, 5)
        assert out.exit_code == 0 and not out.killed_by, out
    asyncio.run(main())


def test_failed_start_leaves_no_sandbox(tmp_path):
    async def main():
        be = FakeBackend()
        be.fail_next()
        host = SandboxHost("n0", be, None)
        out = await host.run_attempt(spec("s1"), {}, 30)  # a start error in one line, never a traceback
        assert out.exit_code is None and "fake start failure" in out.start_error, out
        assert await host.running() == []
    asyncio.run(main())


def _announce(ws, *names) -> None:
    import json
    import os

    os.makedirs(os.path.join(ws, ".sandfleet"), exist_ok=True)
    with open(os.path.join(ws, ".sandfleet", "checkpoints"), "a") as f:
        for n in names:
            f.write(json.dumps({"name": n, "t": 0}) + "\n")


def test_a_checkpoint_watch_armed_with_the_attempt_counts_windows_announced_before_any_other_call(tmp_path):
    """PK5 is armed in the call that starts the attempt: windows announced before a separate watch call could
    have reached the host (here: before the runner starts) are counted, and the kill lands at the Nth. (A
    runner that exits before the watch's first read is reported as `seen`, not killed: that kill is not
    counted as applied.)"""
    async def main():
        be = FakeBackend()
        host = SandboxHost("n0", be, None)
        s = dict(spec("s1"), workspace_dir=str(tmp_path / "ws1"))
        _announce(s["workspace_dir"], "before-commit:1", "after-commit:1", "after-commit:2")
        arm = {"kind": "checkpoints", "nth": 2, "window": "after-commit:", "reason": "t0-PK5"}
        out = await asyncio.wait_for(host.run_attempt(s, {}, 30, None, [arm]), 10)
        w = out.watches["t0-PK5"]
        assert w["fired"] and w["applied"] and w["window_name"] == "after-commit:2", w
        assert out.killed_by == "t0-PK5" and out.exit_code == -9, out
    asyncio.run(main())


def test_a_checkpoint_watch_that_did_not_fire_reports_what_it_saw(tmp_path):
    async def main():
        be = FakeBackend()
        host = SandboxHost("n0", be, None)
        s = dict(spec("s1"), workspace_dir=str(tmp_path / "ws1"))
        arm = {"kind": "checkpoints", "nth": 3, "window": "after-commit:", "reason": "t0-PK5"}
        run = asyncio.create_task(host.run_attempt(s, {}, 30, None, [arm]))
        await wait_for(lambda: "w/s1" in be.exits, "sandbox s1 started")
        _announce(s["workspace_dir"], "after-commit:1", "before-model:2", "after-commit:2")
        be.finish("w/s1", 0)  # it ends with two of the three announced: the next attempt owes one
        out = await asyncio.wait_for(run, 10)
        assert out.watches["t0-PK5"] == {"fired": False, "seen": 2}, out
        assert out.exit_code == 0
    asyncio.run(main())


def test_two_waves_on_one_host_each_name_only_their_own_sandbox():
    """A `sandfleet up` fleet's host runs several waves at once, each with a `t000-a1`: a wave's kill reaches its
    own sandbox through its WaveHost, never the other wave's."""
    async def main():
        be = FakeBackend()
        host = SandboxHost("n0", be, None)

        class Actor:  # the `.method.remote()` shape of a Ray actor handle, over the real host
            def __getattr__(self, name):
                return type("M", (), {"remote": staticmethod(getattr(host, name))})

        a, b = WaveHost(Actor(), "wa"), WaveHosts([Actor()], "wb")[0]
        runs = [asyncio.create_task(host.run_attempt(spec("t000-a1", w), {}, 30)) for w in ("wa", "wb")]
        await wait_for(lambda: {"wa/t000-a1", "wb/t000-a1"} <= set(be.exits), "both sandboxes started")
        res = await a.kill.remote("t000-a1", 0.0, "PK1")
        assert res["applied"] is True
        assert await b.is_running.remote("t000-a1") and not await a.is_running.remote("t000-a1")
        be.finish("wb/t000-a1", 0)
        out_a, out_b = await asyncio.gather(*runs)
        assert (out_a.exit_code, out_a.killed_by) == (-9, "PK1") and (out_b.exit_code, out_b.killed_by) == (0, None)
    asyncio.run(main())
