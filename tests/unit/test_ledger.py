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
    assert a["fence"] == 1 and a["attempt"] == 1
    assert led.release("w/t0", 1, a["version"])[0]
    b = led.acquire("w/t0", "n0", "s2", 10)
    assert b["fence"] == 2 and b["attempt"] == 2


def test_acquire_refused_while_an_unexpired_lease_is_active(tmp_path):
    led, clock = make(tmp_path)
    led.acquire("w/t0", "n0", "s1", 10)
    assert led.acquire("w/t0", "n0", "s2", 10) is None
    clock.t += 10.5
    c = led.acquire("w/t0", "n0", "s2", 10)
    assert c["fence"] == 2
    assert led.get("w/t0", 1)["state"] == "expired"


def test_renew_takes_the_expected_version(tmp_path):
    led, clock = make(tmp_path)
    a = led.acquire("w/t0", "n0", "s1", 10)
    ok, v = led.renew("w/t0", 1, a["version"], 10)
    assert ok and v == a["version"] + 1
    assert led.renew("w/t0", 1, a["version"], 10) == (False, v)  # stale version refused
    clock.t += 9
    assert led.renew("w/t0", 1, v, 10)[0]  # renewed before expiry
    clock.t += 11
    assert led.renew("w/t0", 1, v + 1, 10)[0] is False  # expired: a zombie cannot renew


def test_zombie_cannot_release_a_newer_lease(tmp_path):
    led, clock = make(tmp_path)
    a = led.acquire("w/t0", "n0", "s1", 5)
    clock.t += 6
    b = led.acquire("w/t0", "n0", "s2", 5)
    assert led.release("w/t0", a["fence"], a["version"])[0] is False
    assert [l["sandbox_id"] for l in led.active()] == ["s2"]
    assert led.release("w/t0", b["fence"], b["version"])[0]
    assert led.active() == []
    events = [h["event"] for h in led.dump()["history"]]
    assert events == ["acquired", "expired", "acquired", "released"]
