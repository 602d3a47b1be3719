"""ScopedKeys writes the store's identities as a group commit: changes made while a write is under way go out
together in the next write, and every change is in a write that reached the store before its caller returns."""
from __future__ import annotations

import threading
import time

from storage.credentials import Credentials
from storage.keys import ScopedKeys


class GatedStore:
    """update_identities records what it was given; the first call waits for `gate`."""

    def __init__(self):
        self.gate = threading.Event()
        self.writes: list[list[str]] = []
        self.calls = 0

    def update_identities(self, admin, tag, mine):
        self.calls += 1
        if self.calls == 1:
            assert self.gate.wait(30), "the test never opened the gate"
        self.writes.append([i["name"] for i in mine])


def change(keys: ScopedKeys, name: str, done: list) -> None:
    with keys.lock:
        keys.slots.append({"name": name, "creds": Credentials(name, "s"), "actions": [], "owner": name})
        keys._apply()
        done.append((name, len(keys.store.writes)))


def wait_until(pred, what: str) -> None:
    for _ in range(3000):  # bounded: 30 s
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"never: {what}")


def test_changes_made_during_a_write_go_out_together_in_the_next():
    store = GatedStore()
    keys = ScopedKeys(store, Credentials("admin", "s"))
    done: list = []
    first = threading.Thread(target=change, args=(keys, "a", done))
    first.start()
    wait_until(lambda: store.calls == 1, "the first write reached the store")
    rest = [threading.Thread(target=change, args=(keys, n, done)) for n in "bcdef"]
    for t in rest:
        t.start()
    wait_until(lambda: keys._changes == 6, "the five other changes were made while the first write waits")
    store.gate.set()
    for t in [first, *rest]:
        t.join(30)
    assert store.writes == [["a"], ["a", "b", "c", "d", "e", "f"]]
    assert keys.writes == 2
    # each caller returned only once a write holding its change had reached the store
    assert sorted(done) == [("a", 1)] + [(n, 2) for n in "bcdef"]


def test_a_failed_write_raises_to_its_caller_and_the_next_change_writes_it_again():
    class Flaky(GatedStore):
        def update_identities(self, admin, tag, mine):
            self.calls += 1
            if self.calls == 1:
                raise OSError("disk full")
            self.writes.append([i["name"] for i in mine])

    store = Flaky()
    keys = ScopedKeys(store, Credentials("admin", "s"))
    try:
        change(keys, "a", [])
        raise AssertionError("the failed write did not raise")
    except OSError:
        pass
    assert not keys._applying
    change(keys, "b", [])
    assert store.writes == [["a", "b"]]


def test_a_write_that_failed_fails_every_change_it_carried_at_once():
    """Changes that waited for a write which then failed raise together; they do not each write again and wait
    out the bound in turn (helper-41: four revokes behind a store that stopped reloading failed at 15, 30, 45 and
    60 s)."""
    class Failing(GatedStore):
        def update_identities(self, admin, tag, mine):
            self.calls += 1
            if self.calls == 1:
                assert self.gate.wait(30), "the test never opened the gate"
            raise OSError("the store did not reload")

    store = Failing()
    keys = ScopedKeys(store, Credentials("admin", "s"))
    raised: list = []

    def failing_change(name):
        try:
            change(keys, name, [])
        except Exception as exc:  # noqa: BLE001 - what each caller got
            raised.append((name, type(exc).__name__))

    first = threading.Thread(target=failing_change, args=("a",))
    first.start()
    wait_until(lambda: store.calls == 1, "the first write reached the store")
    rest = [threading.Thread(target=failing_change, args=(n,)) for n in "bcde"]
    for t in rest:
        t.start()
    wait_until(lambda: keys._changes == 5, "four more changes wait behind the first write")
    store.gate.set()
    for t in [first, *rest]:
        t.join(30)
    assert sorted(n for n, _ in raised) == list("abcde")
    assert store.calls == 2  # the first write (a), then one write for b-e that failed them together
    assert not keys._applying


def test_a_revoke_whose_write_failed_keeps_the_key_its_owners_for_a_later_revoke():
    """A revoke that may not have reached the store leaves the owner in the book with its key, so revoke_all at the
    wave's end revokes it again (helper-41: it was dropped, and the key outlived the wave)."""
    class FlakyOnce(GatedStore):
        def update_identities(self, admin, tag, mine):
            self.calls += 1
            if self.calls == 1:
                raise OSError("No space left on device")
            self.writes.append([(i["name"], i["credentials"][0]["accessKey"]) for i in mine])

    store = FlakyOnce()
    keys = ScopedKeys(store, Credentials("admin", "s"))
    keys._prober = lambda *a: None  # (no store to probe here: the writes are what is looked at)
    keys._await = lambda probes, error: None
    slot = {"name": "k0", "creds": Credentials("LIVEKEY", "s"), "actions": ["Read:b/w/t0/*"], "owner": "w/t0-a1",
            "probe": ("b", "w/t0/p")}
    keys.slots.append(slot)
    keys._owned["w/t0-a1"] = slot
    try:
        keys.revoke("w/t0-a1")
        raise AssertionError("the failed revoke did not raise")
    except OSError:
        pass
    assert keys._owned.get("w/t0-a1") is slot and slot["creds"].access_key == "LIVEKEY"
    assert keys.revoke_all("w/") == ["w/t0-a1"]
    assert store.writes[-1][0][0] == "k0" and store.writes[-1][0][1] != "LIVEKEY"  # its key replaced at the store
    assert keys._owned == {} and keys._free == [slot]


def test_revoke_all_ends_every_key_of_a_wave_in_one_write_and_no_other_waves():
    """A wave's end (or its second Ctrl-C) revokes its keys in one write, not one write and reload per key."""
    store = GatedStore()
    store.gate.set()
    keys = ScopedKeys(store, Credentials("admin", "s"))
    keys._prober = lambda *a: None  # (no store to probe here: the writes are what is looked at)
    keys._await = lambda probes, error, nudge=None: None
    mine = [keys.issue(f"w1/t{i}-a1", "b", f"w1/t{i}/") for i in range(5)]
    other = keys.issue("w2/t0-a1", "b", "w2/t0/")
    writes = len(store.writes)
    assert sorted(keys.revoke_all("w1/")) == [f"w1/t{i}-a1" for i in range(5)]
    assert len(store.writes) == writes + 1 and keys.revoked == 5
    live = {s["creds"].access_key for s in keys.slots if s["owner"]}
    assert live == {other.access_key} and not live & {c.access_key for c in mine}
    assert keys.held("w1/") == 0 and keys.held("w2/") == 1


def test_a_revoke_all_whose_one_write_failed_leaves_every_key_its_owners_and_a_retry_ends_them():
    class FailOnce(GatedStore):
        fail = False

        def update_identities(self, admin, tag, mine):
            if self.fail:
                self.fail = False
                raise OSError("No space left on device")
            self.writes.append([(i["name"], i["credentials"][0]["accessKey"]) for i in mine])

    store = FailOnce()
    keys = ScopedKeys(store, Credentials("admin", "s"))
    keys._prober = lambda *a: None
    keys._await = lambda probes, error, nudge=None: None
    issued = {keys.issue(f"w1/t{i}-a1", "b", f"w1/t{i}/").access_key for i in range(3)}
    store.fail = True
    try:
        keys.revoke_all("w1/")
        raise AssertionError("the failed write did not raise")
    except OSError:
        pass
    assert {s["creds"].access_key for s in keys.slots if s["owner"]} == issued and keys.held("w1/") == 3
    assert len(keys.revoke_all("w1/")) == 3 and keys.held("w1/") == 0
    assert not issued & {key for _, key in store.writes[-1]}  # the last write holds none of them
