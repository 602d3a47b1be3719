"""The durable runner trusts a journal record only if it reads back as the record of its step."""
import importlib.util
import json
import sys
from pathlib import Path

RUNNERS = Path(__file__).resolve().parents[2] / "fleet" / "runners"
sys.path.insert(0, str(RUNNERS))
_spec = importlib.util.spec_from_file_location("durable_under_test", RUNNERS / "durable.py")
durable = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(durable)

CALL = {"id": "c1", "type": "function", "function": {"name": "apply_patch", "arguments": "{}"}}


class Store:
    def __init__(self, objects):
        self.objects = dict(objects)
        self.deleted = []

    def put_new(self, key, body):
        if key in self.objects:
            return False
        self.objects[key] = body
        return True

    def get(self, key):
        return self.objects.get(key)

    def delete(self, key):
        self.deleted.append(key)
        self.objects.pop(key, None)


def test_parse_refuses_empty_torn_and_foreign_records():
    good = json.dumps({"step": 3, "call": CALL}).encode()
    assert durable.parse(good, 3)["call"] == CALL
    for raw in (b"", None, good[:20], json.dumps({"step": 4, "call": CALL}).encode(), b"[1, 2]"):
        assert durable.parse(raw, 3) is None


def test_commit_replaces_an_emptied_record_and_adopts_a_good_one():
    rec = {"step": 2, "call": CALL, "fence": 2, "attempt": 2}
    s = Store({"j/0002.json": b""})  # the store emptied it (ST6)
    assert durable.commit(s, "j/0002.json", rec) == rec
    assert s.deleted == ["j/0002.json"] and json.loads(s.objects["j/0002.json"]) == rec
    theirs = dict(rec, fence=1)
    s = Store({"j/0002.json": json.dumps(theirs).encode()})  # an earlier attempt committed it
    assert durable.commit(s, "j/0002.json", rec) == theirs and s.deleted == []
