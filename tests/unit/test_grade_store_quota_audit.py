"""`within_store_quota`'s backstop (issue 42, the second hostile review): the end-of-wave store audit's per-task
totals (what SeaweedFS really holds under each task's prefix) are held to the configured quota, so a runner that
gets a write past the proxy's count (a parse the proxy and the store read otherwise) still fails; an audit that is
missing, failed or has no totals gives `unknown` naming why, never a silent pass. On the stored fixture wave."""
from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from cluster import results
from cluster.grade import grade_wave

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "wave-before-results-py"


def _wave(tmp_path, quota_objects: int = 20, quota_mb: int = 1) -> Path:
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    plan = orjson.loads((d / results.PLAN).read_bytes())
    plan["config"]["store"].update(quota_objects=quota_objects, quota_mb=quota_mb)
    (d / results.PLAN).write_bytes(orjson.dumps(plan))
    audit = orjson.loads((d / results.STORE_AUDIT).read_bytes())
    audit["task_totals"] = {tid: {"objects": len(recs), "bytes": sum(r["size"] for r in recs)}
                            for tid, recs in audit["tasks"].items()}
    (d / results.STORE_AUDIT).write_bytes(orjson.dumps(audit))
    return d


def _edit_audit(d: Path, fn) -> None:
    audit = orjson.loads((d / results.STORE_AUDIT).read_bytes())
    fn(audit)
    (d / results.STORE_AUDIT).write_bytes(orjson.dumps(audit))


def _checks(d: Path) -> dict:
    r = grade_wave(d)
    return {g["task_id"]: g["checks"]["within_store_quota"] for g in r["tasks"] + r["references"]}


def test_a_store_within_the_quota_passes_and_says_what_the_audit_listed(tmp_path):
    got = _checks(_wave(tmp_path))
    assert {c["verdict"] for c in got.values()} == {"pass"}, got
    assert "the store audit lists 10 objects" in got["t000"]["detail"]


@pytest.mark.parametrize("held, named", [({"objects": 21, "bytes": 100}, "21 objects"),
                                         ({"objects": 3, "bytes": (1 << 20) + 1}, "1048577 bytes")])
def test_a_store_holding_past_the_quota_fails_the_task_though_the_proxy_refused_nothing(tmp_path, held, named):
    """The hostile runner's writes were logged as parts and tagging (never refused): only the audit sees them."""
    d = _wave(tmp_path)
    _edit_audit(d, lambda a: a["task_totals"].update(t000=held))
    got = _checks(d)
    c = got["t000"]
    assert c["verdict"] == "fail", c
    assert named in c["detail"] and "20 objects, 1048576 bytes (1 MiB)" in c["detail"], c["detail"]
    assert c["store_held"] == held and c["max_objects"] == 20 and c["max_bytes"] == 1 << 20
    assert got["t001"]["verdict"] == "pass"  # another task's holdings are its own


def test_an_audit_from_before_per_task_totals_keeps_the_rule_of_then_and_says_so(tmp_path):
    """Results graded again later (the league's, a user's older waves): an audit the harness wrote before it kept
    task_totals makes no task unknown; the proxy's refusals still decide, and the detail says the backstop did not
    run. Totals that are there but damaged are unknown."""
    d = _wave(tmp_path)
    _edit_audit(d, lambda a: a.pop("task_totals"))
    got = _checks(d)
    assert {c["verdict"] for c in got.values()} == {"pass"}, got
    assert "was not compared" in got["t000"]["detail"] and "task_totals" in got["t000"]["detail"]
    _edit_audit(d, lambda a: a.update(task_totals={"t000": {"objects": "many", "bytes": 1}}))
    assert _checks(d)["t000"]["verdict"] == "unknown"


def test_a_missing_or_failed_audit_is_unknown_naming_why(tmp_path):
    d = _wave(tmp_path)
    (d / results.STORE_AUDIT).write_bytes(orjson.dumps({"bucket": "b", "scope": "", "client": "minio",
                                                        "error": {"message": "list: refused"},
                                                        "failed": "list: refused"}))
    got = _checks(d)
    assert {c["verdict"] for c in got.values()} == {"unknown"}, got
    assert "the audit failed: list: refused" in got["t000"]["detail"]
    (d / results.STORE_AUDIT).unlink()
    got = _checks(d)
    assert {c["verdict"] for c in got.values()} == {"unknown"} and "store-audit.json" in got["t000"]["detail"]


def test_the_audit_totals_each_task_from_the_whole_listing_even_when_it_reads_a_sample():
    from storage.audit import audit
    from tests.unit.test_audit_sample import FakeMinio, store

    objs = store(40)
    mc = FakeMinio(objs)
    out = audit(mc, "b", "w", ["t000", "t001", "t002", "t003"], None, max_objects=5, seed=7)
    assert out["sampled"] and len(mc.read) == 5
    want = {t: {"objects": sum(1 for k in objs if k.startswith(f"w/{t}/")),
                "bytes": sum(len(v) for k, v in objs.items() if k.startswith(f"w/{t}/"))}
            for t in ("t000", "t001", "t002", "t003")}
    assert out["task_totals"] == want and want["t003"] == {"objects": 0, "bytes": 0}
    assert sum(t["objects"] for t in want.values()) == 40  # the stray key outside every prefix is no task's
