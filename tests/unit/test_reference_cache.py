"""The reference cache keeps only references that ran as an uninterrupted run: a reference the harness had to end
(a hang, then a second attempt that completed from its journal) is run again by every later wave, never reused."""
from types import SimpleNamespace

from cluster.artifacts import ReferenceCache, cache_passed_references, write_artifact


def _wave(tmp_path, grades):
    out = SimpleNamespace(artifact=lambda tid: tmp_path / "artifacts" / tid)
    for g in grades:
        write_artifact(out.artifact(g["task_id"]), {"repo/a.txt": b"a\n"}, {"task_id": g["task_id"], "attempt": 1})
    return out, {"references": grades}


def _ref(tid, verdict, completed):
    return {"task_id": tid, "reference_key": "k" + tid, "verdict": verdict,
            "checks": {"completed": {"verdict": completed}, "liveness": {"verdict": verdict}}}


def test_only_a_reference_that_passed_whole_is_cached(tmp_path):
    cache = ReferenceCache(tmp_path / "root")
    out, result = _wave(tmp_path, [_ref("ref-t000", "pass", "pass"), _ref("ref-t001", "fail", "pass"),
                                   _ref("ref-t002", "unknown", "pass"), _ref("ref-t003", "fail", "fail")])
    cache_passed_references(cache, "w1", out, result)
    assert cache.get("kref-t000") is not None
    assert [cache.get("k" + t) for t in ("ref-t001", "ref-t002", "ref-t003")] == [None, None, None]
