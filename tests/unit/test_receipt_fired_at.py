"""An `applied` receipt must say when its fault fired. One with `fired_at: null` was counted as an applied and
exercised fault ("unknown attempt or time: counted as exercised"); a damaged results folder, or a wave resumed from a
timeline that kept no fire time, carried such receipts. Now the grader names it `unknown`, and a resume keeps the
fire time the timeline recorded."""
from __future__ import annotations

import asyncio
import shutil

import orjson

from cluster import results
from cluster.grade import grade_wave
from cluster.receipts import receipts_of
from cluster.report import write_summary
from cluster.wave.injector import Injector
from cluster.wave.resume import prepare_resume
from cluster.wave.timeline import Event
from faults.base import CATALOG, FaultSpec, Receipt
from tests.unit.test_grade_fuzz import FIXTURE, no_picture  # noqa: F401 - a fixture, used by name

APPLIED = {"fault_id": "PK1", "instance": "t0-PK1", "task_id": "t0", "status": "applied",
           "target": {"sandbox_id": "t0-a1"}, "detail": "SIGKILL to every process of the sandbox",
           "fired_at": 1796219241.3, "cleared_at": None, "evidence": {}}


def test_an_applied_receipt_that_says_not_when_it_fired_is_graded_unknown_not_exercised(tmp_path, no_picture):  # noqa: F811
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    recs = orjson.loads((d / results.FAULTS).read_bytes())
    assert recs[0]["fault_id"] == "PK1" and recs[0]["status"] == "applied"
    recs[0]["fired_at"] = None
    (d / results.FAULTS).write_bytes(orjson.dumps(recs))
    result = grade_wave(d)
    g = next(g for g in result["tasks"] if g["task_id"] == recs[0]["task_id"])
    check = g["checks"]["fault_applied"]
    assert check["verdict"] == "unknown", check
    assert f"{recs[0]['instance']}: unknown" in check["detail"] and "fired_at" in check["detail"], check
    summary = write_summary(d, result).read_text()
    assert "PK1 applied 0/1, unknown 1" in summary, summary


def test_receipts_of_names_an_applied_receipt_with_no_fire_time_and_keeps_the_others():
    timed = dict(APPLIED)
    untimed = dict(APPLIED, instance="t1-PK1", task_id="t1", fired_at=None)
    missing = {k: v for k, v in APPLIED.items() if k != "fired_at"} | {"instance": "t2-PK1", "task_id": "t2"}
    skipped = dict(APPLIED, instance="t3-PK1", task_id="t3", status="not_applied", fired_at=None, detail="no")
    got, left = receipts_of([timed, untimed, missing, skipped])
    assert left == []
    assert got[0] == timed and got[3] == skipped
    for r in got[1:3]:
        assert r["status"] == "unknown", r
        assert r["detail"].startswith("written as applied, but fired_at is null"), r
        assert r["detail"].endswith(APPLIED["detail"]), r
    assert untimed["status"] == "applied", "the parsed record itself is left as it was written"


def _timeline(d, clear: dict) -> None:
    events = [{"t": 0.0, "wall": 1796219200.0, "event": "wave_start"},
              {"t": 1.0, "wall": 1796219201.0, "event": "task_start", "task": "t0"},
              dict({"t": 2.0, "wall": 1796219242.0, "event": "fault_clear", "instance": "t0-PK1", "fault": "PK1",
                    "task": "t0", "status": "applied", "detail": "SIGKILL to every process of the sandbox"}, **clear)]
    (d / results.TIMELINE).write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))


def _resumed_receipts(tmp_path, clear: dict) -> list[dict]:
    d = tmp_path / "w"
    d.mkdir()
    _timeline(d, clear)
    plan = {"tasks": [{"task_id": "t0"}], "references": []}
    _, receipts, timeline = prepare_resume(results.ResultsDir(d), plan, "w")
    timeline.f.close()
    return receipts


def test_a_resume_keeps_the_fire_time_and_target_the_timeline_recorded(tmp_path):
    got = _resumed_receipts(tmp_path, {"fired_at": 1796219241.3, "target": {"sandbox_id": "t0-a1"}})
    assert got[0]["fired_at"] == 1796219241.3 and got[0]["target"] == {"sandbox_id": "t0-a1"}, got
    assert receipts_of(got)[0][0]["status"] == "applied"


def test_a_resume_from_a_timeline_with_no_fire_time_gives_a_receipt_the_grader_calls_unknown(tmp_path):
    got = _resumed_receipts(tmp_path, {"fired_at": "soon", "target": ["x"]})
    assert got[0]["fired_at"] is None and got[0]["target"] == {}, got
    assert receipts_of(got)[0][0]["status"] == "unknown"


class _Kill:
    """One fault of the catalog's protocol that applies at a fixed wall time (a fake: only the injector is tested)."""

    id, family, description = "PK1", "preempt", "a fake kill"

    async def inject(self, spec, ctx):
        return {"applied": True, "at": 1796219241.3, "sandbox_id": "t0-a1"}

    async def settle(self, spec, ctx, injected):
        return None

    async def clear(self, spec, ctx, injected):
        return {}

    def receipt(self, spec, injected, cleared):
        return Receipt(fault_id=spec.fault_id, instance=spec.instance, task_id=spec.task_id, status="applied",
                       target={"sandbox_id": injected["sandbox_id"]}, detail="SIGKILL", fired_at=injected["at"])


def test_the_injector_records_when_a_fault_fired_and_at_what_in_its_clear_event(monkeypatch):
    monkeypatch.setitem(CATALOG, "PK1", _Kill())
    events = []
    inj = Injector(lambda event, **fields: events.append(dict(fields, event=str(Event(event).value))), lambda: None)
    spec = FaultSpec(fault_id="PK1", instance="t0-PK1", task_id="t0", trigger="boundary", at_s=0.0)
    asyncio.run(inj.fire(spec, None))
    clear = next(e for e in events if e["event"] == "fault_clear")
    assert clear["fired_at"] == 1796219241.3 and clear["target"] == {"sandbox_id": "t0-a1"}, clear
