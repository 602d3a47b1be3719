"""A key issued ahead of its lease is the attempt's one key: a try that found the lease busy keeps it for the next
try of the same attempt, and it dies when the task ends without that attempt starting."""
from __future__ import annotations

from types import SimpleNamespace

from cluster.wave.access import Access
from storage.credentials import Credentials


class _Book:
    def __init__(self):
        self.issued, self.revoked = [], []

    def issue(self, owner, bucket, prefix):
        self.issued.append(owner)
        return Credentials(f"AK{len(self.issued)}", "secret")

    def revoke(self, owner):
        self.revoked.append(owner)
        return True


def _access(tmp_path) -> tuple[Access, _Book]:
    book = _Book()
    parts = SimpleNamespace(keys=book, bucket="b", endpoint=SimpleNamespace(creds=None))
    return Access(parts, "w1", tmp_path, {}, lambda *a, **k: None), book


def test_a_busy_lease_tried_again_keeps_the_key_issued_ahead(tmp_path):
    access, book = _access(tmp_path)
    for _ in range(5):  # five tries of attempt 2 while a zombie's lease runs out
        access.issue_ahead("t000", "t000-a2")
    assert book.issued == ["w1/t000-a2"] and access.has_ahead("t000-a2")
    assert access._issue("t000", "t000-a2").access_key == "AK1"  # the lease came: the attempt gets that key
    assert not access.has_ahead("t000-a2") and book.revoked == []


def test_the_key_of_an_attempt_that_never_started_dies(tmp_path):
    access, book = _access(tmp_path)
    access.issue_ahead("t000", "t000-a2")
    access.drop_ahead("t000-a2")  # the task's deadline came while its lease stayed busy
    assert book.revoked == ["w1/t000-a2"] and not access.has_ahead("t000-a2")
    access.drop_ahead("t000-a2")
    assert book.revoked == ["w1/t000-a2"]
