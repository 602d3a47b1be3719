"""The driver renews a lease whose attempt took long to get ready (its store key waited behind thousands of others)
before its host gets it, and keeps the lease as it was when the ledger refuses or cannot answer."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from cluster.wave.attempts import Attempts
from fleet.ledger import LeaseLedger
from fleet.records import Lease


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def _driver(ledger) -> SimpleNamespace:
    async def answer(items):
        return ledger.renew_many(items)

    remote = SimpleNamespace(remote=lambda items: answer(items))
    return SimpleNamespace(parts=SimpleNamespace(ledger=SimpleNamespace(renew_many=remote)),
                           cfg=SimpleNamespace(lease_ttl_s=30.0))


def test_a_lease_that_waited_for_its_key_is_renewed_before_its_host_gets_it(tmp_path):
    clock = Clock()
    led = LeaseLedger(str(tmp_path / "l.db"), clock=clock)
    lease = led.acquire("w/t0", "n0", "t0-a1", 30.0)
    clock.t = 25.0  # the key took 25 s of its 30 s
    got = asyncio.run(Attempts._renewed(_driver(led), lease))
    assert isinstance(got, Lease) and got.version == lease.version + 1
    assert led.get("w/t0", lease.fence)["expires_at"] == 25.0 + 30.0
    clock.t = 40.0  # past the first expiry: the host's renewal at the new version holds
    assert led.renew_many([("w/t0", got.fence, got.version, 30.0, got.holder)]) == [(True, got.version + 1)]


def test_a_lease_that_expired_meanwhile_is_left_as_it_was(tmp_path):
    clock = Clock()
    led = LeaseLedger(str(tmp_path / "l.db"), clock=clock)
    lease = led.acquire("w/t0", "n0", "t0-a1", 30.0)
    clock.t = 31.0
    assert asyncio.run(Attempts._renewed(_driver(led), lease)) is lease  # the host's renewal is refused: fenced


def test_a_ledger_that_cannot_answer_leaves_the_lease_as_it_was(tmp_path):
    led = LeaseLedger(str(tmp_path / "l.db"), clock=Clock())
    lease = led.acquire("w/t0", "n0", "t0-a1", 30.0)
    broken = SimpleNamespace(renew_many=lambda items: [])  # an answer of another shape
    assert asyncio.run(Attempts._renewed(_driver(broken), lease)) is lease
