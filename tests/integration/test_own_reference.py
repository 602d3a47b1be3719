"""A task with no fault planned is its own reference (cluster/grade/selfref.py), on real parts: a `faults: none` wave
runs no reference beside its tasks, grades each as `reference: self`, and fills the reference cache with their
artifacts; a later wave's faulted task of the same seed takes that cached run as its reference, while a faulted task
of a seed the cache does not hold still runs its own beside it."""
from __future__ import annotations

import orjson
import pytest

from cluster import results
from cluster.grade import exit_code
from cluster.grade.selfref import SELF_DETAIL

pytestmark = pytest.mark.integration

WORKLOAD = {"steps": 4, "think_ms": 20}
SEED = 151  # (a seed of its own: another test's cache would not be this one's, but it keeps the keys apart anyway)


def _lines(path):
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _started(d) -> set[str]:
    return {e["task"] for e in _lines(d / results.TIMELINE) if e["event"] == "attempt_start"}


def test_a_task_with_no_fault_is_its_own_reference_and_a_later_faulted_task_uses_it(run_wave):
    cache = run_wave.root / ".reference-cache"
    # 1. faults none: no reference runs, each task is compared with itself and fills the cache
    r1, d1 = run_wave(runner="durable", tasks=2, concurrency=2, faults=[], seed=SEED, workload=WORKLOAD,
                      fault_free_reference="self")
    assert r1["verdict"] == "pass" and exit_code(r1) == 0, [g["checks"] for g in r1["tasks"]]
    plan1 = orjson.loads((d1 / results.PLAN).read_bytes())
    assert plan1["references"] == [] and r1["references"] == []
    assert _started(d1) == {"t000", "t001"}  # no `ref-` sandbox ever started
    assert r1["wave_checks"]["positive_control"] == "pass"
    keys = {}
    for g, t in zip(r1["tasks"], plan1["tasks"]):
        assert t["reference"]["self"] is True and g["attempts"] == 1, (t["reference"], g["attempt_causes"])
        re_ = g["checks"]["resume_equivalent"]
        assert re_["verdict"] == "pass" and re_["reference"] == "self" and re_["detail"].startswith(SELF_DETAIL), re_
        cached = orjson.loads((cache / t["reference"]["key"] / results.ARTIFACT_MANIFEST).read_bytes())
        assert cached["task_id"] == g["task_id"] and cached["digest"] == re_["got"], cached
        keys[g["task_id"]] = (t["reference"]["key"], re_["got"])
    assert "tasks their own" in (d1 / results.SUMMARY).read_text()

    # 2. the same seeds under PK1, plus a third task whose seed is new: t000 and t001 use the cached runs of wave 1,
    # t002 runs its own reference beside it, as every faulted task did before
    r2, d2 = run_wave(runner="durable", tasks=3, concurrency=3, faults=["PK1"], seed=SEED, workload=WORKLOAD,
                      fault_timing={"PK1": {"after_model_calls": [2, 2]}}, deadline_s=120)
    plan2 = orjson.loads((d2 / results.PLAN).read_bytes())
    assert [r["task_id"] for r in plan2["references"]] == ["ref-t002"], plan2["references"]
    assert _started(d2) >= {"t000", "t001", "t002", "ref-t002"} and not _started(d2) & {"ref-t000", "ref-t001"}
    by_id = {g["task_id"]: g for g in r2["tasks"]}
    for t in plan2["tasks"]:
        tid = t["task_id"]
        assert t["faults"] and "self" not in t["reference"], t
        g = by_id[tid]
        assert g["interrupted"] and g["attempts"] == 2, (tid, g["attempt_causes"])
        re_ = g["checks"]["resume_equivalent"]
        assert re_["verdict"] == "pass" and "reference" not in re_, (tid, re_)
        if tid in keys:
            key, digest = keys[tid]
            assert t["reference"] == {"task_id": f"ref-{tid}", "key": key, "cached": True}, t["reference"]
            art = orjson.loads((d2 / "artifacts" / f"ref-{tid}" / results.ARTIFACT_MANIFEST).read_bytes())
            assert art["from_cache"] == key and re_["expected"] == digest, (art, re_)
        else:
            assert t["reference"]["cached"] is False
    assert [g["task_id"] for g in r2["references"]] == ["ref-t002"] and r2["references"][0]["verdict"] == "pass"
    assert r2["verdict"] == "pass" and exit_code(r2) == 0, [(g["task_id"], g["signature"]) for g in r2["tasks"]]
