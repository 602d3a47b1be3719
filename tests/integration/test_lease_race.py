"""Leases under real concurrency: several Ray actors (holders on different "nodes") race for the same few tasks
through the fleet's one ledger actor for a few seconds: acquiring, renewing with the version they hold, letting
some leases run out (a stalled holder) and releasing the rest. Whatever the interleaving, no task ever has two
live leases at once, fences only grow, and a renewal of a lease that expired or was taken over is refused."""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.integration
TASKS = [f"w-20261201T000000-s7-1ea5/t{i}" for i in range(3)]


class Holder:
    """A host stand-in: loops over the tasks, holds what it gets for a while, renews it, sometimes stalls."""

    def __init__(self, name: str, ledger, seed: int):
        import random

        self.name, self.ledger, self.rng = name, ledger, random.Random(seed)

    def run(self, seconds: float) -> list[dict]:
        import ray

        out, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            task = self.rng.choice(TASKS)
            lease = ray.get(self.ledger.acquire.remote(task, self.name, f"{self.name}-{len(out)}", 0.3))
            if lease is None:
                time.sleep(self.rng.uniform(0, 0.02))
                continue
            rec = {"task": task, "fence": lease.fence, "holder": self.name, "renewed": 0, "refused_after": None}
            version = lease.version
            for _ in range(self.rng.randint(0, 4)):
                time.sleep(self.rng.uniform(0.02, 0.12))
                ok, version = ray.get(self.ledger.renew.remote(task, lease.fence, version, 0.3))
                if not ok:
                    rec["refused_after"] = rec["renewed"]
                    break
                rec["renewed"] += 1
            if rec["refused_after"] is None:
                if self.rng.random() < 0.3:  # a stalled holder: it never comes back, the lease runs out
                    time.sleep(0.4)
                    ok, _ = ray.get(self.ledger.renew.remote(task, lease.fence, version, 0.3))
                    rec["late_renewal_accepted"] = ok
                else:
                    ray.get(self.ledger.release.remote(task, lease.fence, None, "done"))
            out.append(rec)
        return out


def test_racing_holders_never_share_a_lease(fleet):
    import ray

    holders = [ray.remote(Holder).options(num_cpus=0).remote(f"node-{i}", fleet.ledger, i) for i in range(4)]
    try:
        recs = [r for rs in ray.get([h.run.remote(4.0) for h in holders], timeout=120) for r in rs]
    finally:
        for h in holders:
            ray.kill(h)
    dump = ray.get(fleet.ledger.dump.remote())
    rows = [r for r in dump["leases"] if r["task_id"] in TASKS]
    assert len(recs) >= 20 and len(rows) == len(recs), (len(recs), len(rows))
    assert not any(r.get("late_renewal_accepted") for r in recs)  # an expired lease is never renewed
    for task in TASKS:
        mine = sorted((r for r in rows if r["task_id"] == task), key=lambda r: r["fence"])
        assert [r["fence"] for r in mine] == list(range(1, len(mine) + 1))  # fences only grow, none reused
        for a, b in zip(mine, mine[1:]):  # the next lease starts only after the previous one ended or expired
            end = a["ended_at"] if a["ended_at"] is not None else a["expires_at"]
            assert b["acquired_at"] >= min(end, a["expires_at"]) - 1e-6, (a, b)
    for task in TASKS:  # leave the ledger as it was: end what is still active
        for lease in ray.get(fleet.ledger.active.remote()):
            if lease["task_id"] == task:
                ray.get(fleet.ledger.release.remote(task, lease["fence"], None, "test over"))
