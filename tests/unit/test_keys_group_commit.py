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
