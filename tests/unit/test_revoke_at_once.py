"""A second Ctrl-C at a lent store revokes the wave's keys, bounded, and says when some may still work."""
from __future__ import annotations

import threading
from types import SimpleNamespace

from cluster import results
from cluster.wave.teardown import Teardown


class _Book:
    def __init__(self, fail=None, held=0, hang=None):
        self.fail, self._held, self.hang, self.calls = fail, held, hang, []

    def revoke_all(self, prefix=""):
        self.calls.append(prefix)
        if self.hang is not None:
            self.hang.wait(30)
        if self.fail:
            raise OSError(self.fail)
        return []

    def held(self, prefix=""):
        return self._held


def _teardown(tmp_path, book) -> Teardown:
    parts = SimpleNamespace(keys=book, store_lent=True)
    return Teardown(parts, None, lambda *a, **k: None, results.ResultsDir(tmp_path), "w-1", {}, tmp_path, False, 1.0,
                    lambda: None)


def test_the_keys_revoked_leave_nothing_to_say(tmp_path):
    book = _Book()
    assert _teardown(tmp_path, book)._revoke_at_once() is None and book.calls == ["w-1/"]


def test_a_failed_or_partial_or_stuck_revoke_is_said(tmp_path):
    assert "No space left" in _teardown(tmp_path, _Book(fail="No space left"))._revoke_at_once()
    assert "2 still held" in _teardown(tmp_path, _Book(held=2))._revoke_at_once()  # (another thread's write cut)
    gate = threading.Event()
    td = _teardown(tmp_path, _Book(hang=gate))
    td.REVOKE_AT_ONCE_S = 0.2
    try:
        assert "did not finish within 0.2 s" in td._revoke_at_once()
    finally:
        gate.set()
