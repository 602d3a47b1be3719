"""The reference cache keeps only references that ran as an uninterrupted run: a reference the harness had to end
(a hang, then a second attempt that completed from its journal) is run again by every later wave, never reused."""
from types import SimpleNamespace

from cluster.artifacts import ReferenceCache, cache_passed_references, write_artifact


def _wave(tmp_path, grades):
    out = SimpleNamespace(artifact=lambda tid: tmp_path / "artifacts" / tid)
    for g in grades:
        write_artifact(out.artifact(g["task_id"]), {"repo/a.txt": b"a\n"}, {"task_id": g["task_id"], "attempt": 1})
    return out, {"references": grades}


def _key(tid: str) -> str:
    import hashlib

    return hashlib.sha256(tid.encode()).hexdigest()[:32]


def _ref(tid, verdict, completed):
    return {"task_id": tid, "reference_key": _key(tid), "verdict": verdict,
            "checks": {"completed": {"verdict": completed}, "liveness": {"verdict": verdict}}}


def test_only_a_reference_that_passed_whole_is_cached(tmp_path):
    cache = ReferenceCache(tmp_path / "root")
    out, result = _wave(tmp_path, [_ref("ref-t000", "pass", "pass"), _ref("ref-t001", "fail", "pass"),
                                   _ref("ref-t002", "unknown", "pass"), _ref("ref-t003", "fail", "fail")])
    cache_passed_references(cache, "w1", out, result)
    assert cache.get(_key("ref-t000")) is not None
    assert [cache.get(_key(t)) for t in ("ref-t001", "ref-t002", "ref-t003")] == [None, None, None]


def test_a_key_that_is_not_one_names_no_directory(tmp_path):
    """A plan's key (damaged, or a hostile one: `../../x`) never reaches a path: get and put take only 32 hex digits."""
    cache = ReferenceCache(tmp_path / "root")
    for key in ("../../../x", "/etc", "", "A" * 32, None):
        cache.put(key, {"a": b"a"}, {})
        assert cache.get(key) is None
    assert not (tmp_path / "x").exists() and not (tmp_path / "root" / ".reference-cache").exists()


def test_a_plan_with_no_task_or_a_key_that_is_a_path_is_damaged(tmp_path):
    """A hostile review's finds: `tasks: []` graded as a pass of nothing, and a reference key of `../../..` made
    `wave resume` write an artifact outside the results root. Both are now a damaged plan.json, named."""
    import copy
    import shutil

    import orjson
    import pytest

    from cluster import planfile
    from tests.unit.test_grade_fuzz import FIXTURE

    shutil.copytree(FIXTURE, tmp_path / "w")
    plan = orjson.loads((tmp_path / "w" / "plan.json").read_bytes())
    planfile.check(copy.deepcopy(plan))  # the real wave's plan is whole
    empty = dict(copy.deepcopy(plan), tasks=[], references=[])
    with pytest.raises(planfile.PlanError, match=r"field `tasks`.*at least one"):
        planfile.check(empty)
    bad = copy.deepcopy(plan)
    bad["tasks"][0]["reference"]["key"] = "../../../../tmp/x"
    with pytest.raises(planfile.PlanError, match=r"reference.key.*32 hex digits"):
        planfile.check(bad)


def test_a_second_runs_key_is_a_key_and_its_plan_is_whole(tmp_path):
    """CI found it: a wave that ran a second uninterrupted reference (key + '-b', wave/confirm.SECOND) wrote a
    plan.json that `shrink` and `replay` then refused as damaged, and the cache never kept that second run."""
    import copy
    import shutil

    import orjson

    from cluster import planfile
    from cluster.wave.confirm import SECOND
    from tests.unit.test_grade_fuzz import FIXTURE

    cache = ReferenceCache(tmp_path / "root")
    key = _key("ref-t000") + SECOND
    cache.put(key, {"a": b"a"}, {})
    assert cache.get(key) is not None
    for bad in (_key("ref-t000") + "-c", _key("ref-t000") + SECOND + SECOND, "-b"):
        assert cache.get(bad) is None
    shutil.copytree(FIXTURE, tmp_path / "w")
    plan = orjson.loads((tmp_path / "w" / "plan.json").read_bytes())
    second = copy.deepcopy(plan["references"][0])
    second["task_id"] += SECOND
    second["reference"] = {"task_id": second["task_id"], "key": plan["tasks"][0]["reference"]["key"] + SECOND,
                           "cached": False, "second_of": plan["references"][0]["task_id"]}
    plan["references"].append(second)
    planfile.check(plan)


def test_a_cached_reference_keeps_the_names_its_capture_left_out(tmp_path):
    """A reference whose capture left a file out (a name that is not UTF-8, named escaped) passes since that skip is
    the harness's (issue 42's last review, finding 5), so it is cached: the wave that reuses it still names what was
    left out (it said `skipped: []`, as if the runner had left nothing else)."""
    from cluster.artifacts import seed_cached_references

    cache = ReferenceCache(tmp_path / "root")
    out = SimpleNamespace(artifact=lambda tid: tmp_path / "artifacts" / tid)
    skip = "artifact capture skipped: a file name that is not UTF-8 (shown escaped)"
    write_artifact(out.artifact("ref-t000"), {"a.txt": b"a\n"},
                   {"task_id": "ref-t000", "attempt": 1, "skipped": ["odd\\xffname.txt"], "capped": [skip]})
    cache_passed_references(cache, "w1", out, {"references": [_ref("ref-t000", "pass", "pass")]})
    later = SimpleNamespace(artifact=lambda tid: tmp_path / "later" / tid)
    seed_cached_references(cache, {"tasks": [{"reference": {"task_id": "ref-t000", "key": _key("ref-t000"),
                                                            "cached": True}}]}, later)
    import orjson
    m = orjson.loads((later.artifact("ref-t000") / "artifact.json").read_bytes())
    assert m["skipped"] == ["odd\\xffname.txt"] and m["capped"] == [skip] and m["from_cache"] == _key("ref-t000")
