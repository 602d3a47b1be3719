"""The end-of-wave store audit is bounded (storage/audit.py): at most `max_objects` objects are read back, a sample
seeded by the wave's seed past that, every key still listed (a stray key is found wherever it is), and the report
and SUMMARY.md say how many of how many were read, and with which seed. A fake second client stands in for minio."""
from __future__ import annotations

import hashlib
from types import SimpleNamespace

import orjson

from cluster import report, results
from storage.audit import audit, sample_keys


class FakeMinio:
    """The calls the audit makes; counts the objects it reads back."""

    def __init__(self, objects: dict[str, bytes]):
        self.objects = objects
        self.read: list[str] = []

    def list_objects(self, bucket, prefix=None, recursive=True):
        for k in reversed(sorted(self.objects)):  # a store's own order, not the audit's
            if prefix is None or k.startswith(prefix):
                yield SimpleNamespace(object_name=k, size=len(self.objects[k]), etag='"e"')

    def get_object(self, bucket, key):
        self.read.append(key)
        body = self.objects[key]
        return SimpleNamespace(stream=lambda n: iter([body]), close=lambda: None, release_conn=lambda: None)

    def _list_multipart_uploads(self, bucket, **kw):
        return SimpleNamespace(uploads=[], is_truncated=False)


def store(n: int) -> dict[str, bytes]:
    objs = {f"w/t{i % 3:03d}/k{i:05d}": b"x" * (i % 7) for i in range(n)}
    objs["w/stray"] = b"?"
    return objs


def test_an_audit_within_its_cap_reads_every_object_and_says_so():
    mc = FakeMinio(store(20))
    out = audit(mc, "b", "w", ["t000", "t001", "t002"], None, max_objects=100, seed=7)
    assert sorted(mc.read) == sorted(mc.objects)
    assert (out["objects_listed"], out["objects_checked"], out["sampled"]) == (21, 21, False)


def test_past_its_cap_it_reads_a_seeded_sample_and_still_lists_every_key():
    mc = FakeMinio(store(500))
    out = audit(mc, "b", "w", ["t000", "t001", "t002"], None, max_objects=50, seed=7)
    assert len(mc.read) == len(set(mc.read)) == 50  # the cap, each read once
    assert (out["objects_listed"], out["objects_checked"], out["sampled"], out["sample_seed"]) == (501, 50, True, 7)
    assert sum(len(v) for v in out["tasks"].values()) <= 50
    assert out["outside_task_prefixes"] == ["w/stray"]  # found from the listing, read or not
    assert [f["signature"] for f in out["findings"]] == ["store_key_outside_task_prefixes"]
    # the same seed reads the same objects, whatever order the store lists them in; another seed others
    again = FakeMinio(store(500))
    audit(again, "b", "w", ["t000", "t001", "t002"], None, max_objects=50, seed=7)
    assert sorted(again.read) == sorted(mc.read)
    other = FakeMinio(store(500))
    audit(other, "b", "w", ["t000", "t001", "t002"], None, max_objects=50, seed=8)
    assert sorted(other.read) != sorted(mc.read)


def test_a_sampled_object_that_differs_from_its_write_is_still_found():
    objs = {"w/t000/a": b"short"}
    mc = FakeMinio(objs)
    log = [{"t": 1, "method": "PUT", "bucket": "b", "key": "w/t000/a", "status": 200, "req_bytes": 9,
            "sha": hashlib.sha256(b"something").hexdigest()}]
    out = audit(mc, "b", "w", ["t000"], log, max_objects=1, seed=1)
    assert [f["signature"] for f in out["findings"]] == ["store_object_differs_from_write"]


def test_sample_keys_is_none_within_the_cap_and_seeded_past_it():
    keys = [f"k{i}" for i in range(10)]
    assert sample_keys(keys, 10, 3) is None
    got = sample_keys(keys, 4, 3)
    assert len(got) == 4 and got == sample_keys(list(reversed(keys)), 4, 3)


def test_summary_says_how_many_of_how_many_and_the_seed(tmp_path):
    mc = FakeMinio(store(500))
    out = audit(mc, "b", "w", ["t000", "t001", "t002"], None, max_objects=50, seed=7)
    (tmp_path / results.STORE_AUDIT).write_bytes(orjson.dumps(out))
    line = report._audit(tmp_path)
    assert "50 of 501 objects checked" in line and "sample seed 7" in line, line
    whole = audit(FakeMinio(store(5)), "b", "w", ["t000", "t001", "t002"], None, max_objects=50, seed=7)
    (tmp_path / results.STORE_AUDIT).write_bytes(orjson.dumps(whole))
    assert "6 of 6 objects checked" in report._audit(tmp_path) and "sample" not in report._audit(tmp_path)
