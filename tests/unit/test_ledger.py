from fleet.ledger import LeaseLedger


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def make(tmp_path):
    clock = Clock()
    return LeaseLedger(str(tmp_path / "l.db"), clock=clock), clock


def test_fence_grows_with_each_attempt(tmp_path):
    led, _ = make(tmp_path)
    a = led.acquire("w/t0", "n0", "s1", 10)
    assert a.fence == 1 and a.attempt == 1
    assert led.release("w/t0", 1, a.version)[0]
    b = led.acquire("w/t0", "n0", "s2", 10)
    assert b.fence == 2 and b.attempt == 2


def test_acquire_refused_while_an_unexpired_lease_is_active(tmp_path):
    led, clock = make(tmp_path)
    led.acquire("w/t0", "n0", "s1", 10)
    assert led.acquire("w/t0", "n0", "s2", 10) is None
    clock.t += 10.5
    c = led.acquire("w/t0", "n0", "s2", 10)
    assert c.fence == 2
    assert led.get("w/t0", 1)["state"] == "expired"


def test_renew_takes_the_expected_version(tmp_path):
    led, clock = make(tmp_path)
    a = led.acquire("w/t0", "n0", "s1", 10)
    ok, v = led.renew("w/t0", 1, a.version, 10)
    assert ok and v == a.version + 1
    assert led.renew("w/t0", 1, a.version, 10) == (False, v)  # stale version refused
    clock.t += 9
    assert led.renew("w/t0", 1, v, 10)[0]  # renewed before expiry
    clock.t += 11
    assert led.renew("w/t0", 1, v + 1, 10)[0] is False  # expired: a zombie cannot renew


def test_renewal_applied_after_the_host_stopped_waiting_is_not_a_conflict(tmp_path):
    """A renewal the ledger applied after the host's wait for its answer ran out leaves the host one version
    behind; its next renewal names its holder and is renewed, and the answer carries the version to keep."""
    led, clock = make(tmp_path)
    a = led.acquire("w/t0", "n0", "s1", 6)
    assert led.renew_many([("w/t0", 1, a.version, 6, "n0")]) == [(True, a.version + 1)]  # the answer is lost
    clock.t += 2
    ok, v = led.renew_many([("w/t0", 1, a.version, 6, "n0")])[0]  # the host still believes a.version
    assert (ok, v) == (True, a.version + 2)
    assert led.get("w/t0", 1)["expires_at"] == clock.t + 6
    assert led.renew_many([("w/t0", 1, v, 6, "n0")]) == [(True, v + 1)]  # and renews on from the answer
    assert "renew_resynced" in [h["event"] for h in led.dump()["history"]]


def test_a_stale_renewal_of_a_lost_lease_is_still_fenced(tmp_path):
    """Naming the holder does not weaken fencing: another holder, an expired, a released or a revoked lease,
    or a renewal without its holder at a stale version is refused."""
    led, clock = make(tmp_path)
    a = led.acquire("w/t0", "n0", "s1", 6)
    led.renew_many([("w/t0", 1, a.version, 6, "n0")])
    assert led.renew_many([("w/t0", 1, a.version, 6)])[0][0] is False  # no holder named: strict version
    assert led.renew_many([("w/t0", 1, a.version, 6, "n1")])[0][0] is False  # someone else's lease
    clock.t += 7
    assert led.renew_many([("w/t0", 1, a.version, 6, "n0")])[0][0] is False  # expired meanwhile
    b = led.acquire("w/t0", "n0", "s2", 6)
    led.renew_many([("w/t0", b.fence, b.version, 6, "n0")])
    assert led.revoke("w/t0", b.fence, "test")[0]
    assert led.renew_many([("w/t0", b.fence, b.version, 6, "n0")])[0][0] is False  # revoked
    c = led.acquire("w/t0", "n0", "s3", 6)
    led.renew_many([("w/t0", c.fence, c.version, 6, "n0")])
    assert led.release("w/t0", c.fence, None, "done")[0]
    assert led.renew_many([("w/t0", c.fence, c.version, 6, "n0")])[0][0] is False  # released


def test_zombie_cannot_release_a_newer_lease(tmp_path):
    led, clock = make(tmp_path)
    a = led.acquire("w/t0", "n0", "s1", 5)
    clock.t += 6
    b = led.acquire("w/t0", "n0", "s2", 5)
    assert led.release("w/t0", a.fence, a.version)[0] is False
    assert [l["sandbox_id"] for l in led.active()] == ["s2"]
    assert led.release("w/t0", b.fence, b.version)[0]
    assert led.active() == []
    events = [h["event"] for h in led.dump()["history"]]
    assert events == ["acquired", "expired", "acquired", "released"]


# ---------------------------------------------------------------- a stateful property test of the lease rules
from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule  # noqa: E402


class LeaseRace(RuleBasedStateMachine):
    """Several holders (hosts, zombies) race for two tasks' leases on one ledger with an injected clock:
    acquire, renew one or many with the version they last saw, release, revoke, and time passing. Whatever
    the interleaving: never two live leases of a task, fences only grow, a renewal wins only at the version
    it expected and only while the lease is live, and a holder whose lease expired or was reclaimed never
    renews it again."""

    TASKS = ("t0", "t1")
    TTL = 5.0

    @initialize()
    def setup(self):
        import tempfile

        self.now = 1000.0
        self.dir = tempfile.mkdtemp()
        self.ledger = LeaseLedger(f"{self.dir}/l.db", clock=lambda: self.now)
        self.held: dict[str, dict] = {}  # holder -> {"task", "fence", "version"} as that holder believes
        self.top = {t: 0 for t in self.TASKS}
        self.dead: set[tuple] = set()  # (task, fence) that expired, were released or revoked

    def teardown(self):
        import shutil

        if hasattr(self, "ledger"):
            self.ledger.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    @rule(holder=st.sampled_from(["h0", "h1", "h2", "h3"]), task=st.sampled_from(TASKS))
    def acquire(self, holder, task):
        got = self.ledger.acquire(task, holder, f"sb-{holder}", self.TTL)
        if got is not None:
            assert got.fence > self.top[task]
            self.top[task] = got.fence
            self.held[holder] = {"task": task, "fence": got.fence, "version": got.version}

    @rule(holder=st.sampled_from(["h0", "h1", "h2", "h3"]), batch=st.booleans())
    def renew(self, holder, batch):
        h = self.held.get(holder)
        if h is None:
            return
        before = self.ledger.get(h["task"], h["fence"])
        live_before = before["state"] == "active" and before["expires_at"] > self.now
        if batch:
            ok, version = self.ledger.renew_many([(h["task"], h["fence"], h["version"], self.TTL)])[0]
        else:
            ok, version = self.ledger.renew(h["task"], h["fence"], h["version"], self.TTL)
        if ok:
            assert live_before and before["version"] == h["version"], (before, h)
            assert (h["task"], h["fence"]) not in self.dead
            h["version"] = version
        else:
            assert not (live_before and before["version"] == h["version"]), (before, h)

    @rule(holder=st.sampled_from(["h0", "h1", "h2", "h3"]), revoke=st.booleans())
    def end(self, holder, revoke):
        h = self.held.pop(holder, None)
        if h is None:
            return
        ok, _ = (self.ledger.revoke(h["task"], h["fence"], "test") if revoke else
                 self.ledger.release(h["task"], h["fence"], h["version"], "done"))
        if ok:
            self.dead.add((h["task"], h["fence"]))

    @rule(dt=st.sampled_from([0.5, 2.0, 4.9, 5.0, 6.0]))
    def time_passes(self, dt):
        self.now += dt
        for row in self.ledger.dump()["leases"]:
            if row["state"] == "active" and row["expires_at"] <= self.now:
                self.dead.add((row["task_id"], row["fence"]))

    @invariant()
    def never_two_live_leases_of_a_task(self):
        if not hasattr(self, "ledger"):
            return
        for task in self.TASKS:
            live = self.ledger.db.execute("SELECT fence FROM leases WHERE task_id=? AND state='active' AND "
                                          "expires_at > ?", (task, self.now)).fetchall()
            assert len(live) <= 1, (task, live)


LeaseRace.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_lease_race = LeaseRace.TestCase
