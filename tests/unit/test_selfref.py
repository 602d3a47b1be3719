"""A task with no fault planned is its own reference (cluster/grade/selfref.py): the plan runs none beside it, the
grader compares it with itself only when it ran once and nothing touched it, its artifact fills the reference cache,
and one that needed a second attempt (or that the harness ended) gets its reference run after the tasks."""
import asyncio
from types import SimpleNamespace

import orjson

from cluster.artifacts import ReferenceCache, cache_passed_references, write_artifact
from cluster.config import build_config
from cluster.grade import PASS, TaskHistory, grade_task
from cluster.grade.history import reference_for
from cluster.grade.selfref import SELF_DETAIL, not_uninterrupted, planned_self
from cluster.wave.plan import build_plan
from fleet.workloads.base import tree_digest
from tests.unit.test_workload import apply_script

SEED, STEPS = 7, 8
KEY = "0123456789abcdef0123456789abcdef"
TASK = {"task_id": "t000", "seed": SEED, "runner": "x", "workload": "patch-repo", "steps": STEPS, "faults": [],
        "reference": {"task_id": "ref-t000", "key": KEY, "cached": False, "self": True}}
CLEAN = [{"event": "task_start", "task": "t000"},
         {"event": "attempt_start", "task": "t000", "attempt": 1, "wall": 90.0},
         {"event": "attempt_end", "task": "t000", "attempt": 1, "exit_code": 0, "killed_by": None,
          "artifact": {"captured": True}, "events": {"oom_kills": 0, "pids_max_hits": 0}, "cause": "exit 0"},
         {"event": "task_end", "task": "t000", "state": "done"}]
TWICE = CLEAN[:2] + [{"event": "attempt_end", "task": "t000", "attempt": 1, "exit_code": 1, "killed_by": None,
                      "cause": "exit 1"},
                     {"event": "task_retry", "task": "t000"},
                     {"event": "attempt_start", "task": "t000", "attempt": 2, "wall": 95.0}] + CLEAN[2:]


def test_by_default_a_task_with_no_fault_gets_its_reference_beside_it():
    """`fault_free_reference: run` (the default): two runs of every seed, so a runner that is not deterministic is
    caught in a fault-free wave (tests/integration/test_runners.py's noise runner)."""
    plan = build_plan(build_config({"faults": [], "tasks": 3, "seed": 5}), "w-test")
    assert [r["task_id"] for r in plan["references"]] == ["ref-t000", "ref-t001", "ref-t002"]
    assert not any(planned_self(t) for t in plan["tasks"])


def test_the_plan_runs_no_reference_beside_a_task_with_no_fault_and_keeps_one_beside_a_faulted_task():
    none = build_plan(build_config({"fault_free_reference": "self", "faults": [], "tasks": 3, "seed": 5}), "w-test")
    assert none["references"] == [] and all(planned_self(t) for t in none["tasks"])
    assert {t["reference"]["task_id"] for t in none["tasks"]} == {"ref-t000", "ref-t001", "ref-t002"}
    pk1 = build_plan(build_config({"faults": ["PK1"], "tasks": 3, "seed": 5}), "w-test")
    assert [r["task_id"] for r in pk1["references"]] == ["ref-t000", "ref-t001", "ref-t002"]
    assert not any(planned_self(t) or "self" in t["reference"] for t in pk1["tasks"])


def test_a_task_found_in_the_cache_is_compared_with_the_cached_run_not_with_itself(tmp_path):
    cfg = build_config({"fault_free_reference": "self", "faults": [], "tasks": 2, "seed": 5})
    first = build_plan(cfg, "w-test")
    cache = ReferenceCache(tmp_path)
    cache.put(first["tasks"][0]["reference"]["key"], {"repo/a": b"a"}, {"task_id": "t000"})
    plan = build_plan(cfg, "w-test2", cache)
    assert plan["tasks"][0]["reference"]["cached"] is True and "self" not in plan["tasks"][0]["reference"]
    assert planned_self(plan["tasks"][1]) and plan["references"] == []


def test_only_one_attempt_that_nothing_touched_is_an_uninterrupted_run():
    assert not_uninterrupted(TASK, CLEAN, []) is None
    assert not_uninterrupted(TASK, TWICE, []) == "its timeline has task_retry"
    assert not_uninterrupted(TASK, [e for e in TWICE if e["event"] != "task_retry"], []) == "it ran 2 attempts"
    killed = [dict(e, killed_by="silent 30s") if e["event"] == "attempt_end" else e for e in CLEAN]
    assert not_uninterrupted(TASK, killed, []).startswith("the harness stopped its attempt (silent 30s)")
    oom = [dict(e, events={"oom_kills": 1}) if e["event"] == "attempt_end" else e for e in CLEAN]
    assert not_uninterrupted(TASK, oom, []) == "its sandbox recorded oom_kills 1"
    assert not_uninterrupted(TASK, CLEAN, [], harness_fault={"part": "store"}) == "the wave had a harness fault"
    assert not_uninterrupted(TASK, CLEAN, [{"task_id": "t001", "instance": "t001-ST1", "status": "applied"}]) \
        == "faults were applied in the wave, or may have been (t001-ST1)"
    assert not_uninterrupted(TASK, CLEAN, [{"task_id": "t000", "instance": "x", "status": "not_applied"}]) \
        == "a fault receipt names it"
    assert not_uninterrupted(dict(TASK, faults=[{"fault_id": "PK1"}]), CLEAN, []) == "a fault was planned for it"
    assert not_uninterrupted(TASK, CLEAN[:3] + [{"event": "task_end", "state": "failed"}], []).startswith(
        "it did not end done")
    assert not_uninterrupted(TASK, CLEAN, [], receipts_damage="faults.json unreadable").startswith(
        "the wave's fault receipts")


def _wave(tmp_path, receipts=(), hfault=None, skipped=None):
    return SimpleNamespace(out=SimpleNamespace(artifact=lambda tid: tmp_path / "artifacts" / tid),
                           receipts=list(receipts), hfault=hfault, inp=SimpleNamespace(skipped_count=skipped or {}))


def _hist(events, art):
    return TaskHistory(task=TASK, events=events, receipts=[], calls=[], effects=[], writes=[], requests=[],
                       artifact=art)


def test_a_clean_task_with_no_fault_is_graded_as_its_own_reference(tmp_path):
    art = apply_script(SEED, STEPS)
    h = _hist(CLEAN, art)
    h.reference = reference_for(_wave(tmp_path), TASK, {}, h)
    assert h.reference["self"] is True and h.reference["digest"] == tree_digest(art)
    g = grade_task(h)
    re_ = g["checks"]["resume_equivalent"]
    assert re_["verdict"] == PASS and re_["reference"] == "self" and re_["detail"].startswith(SELF_DETAIL), re_
    assert re_["expected"] == re_["got"] == tree_digest(art)


def test_a_task_with_no_fault_that_needed_two_attempts_is_never_its_own_reference(tmp_path):
    """The edge: no fault planned, but attempt 1 failed and attempt 2 completed from its journal. It is no
    uninterrupted run: with no reference run after it (the wave stopped first) it is `unknown`, naming why; with its
    reference run after the tasks, it is compared with that run, as a task with a fault is."""
    art = apply_script(SEED, STEPS)
    h = _hist(TWICE, art)
    h.reference = reference_for(_wave(tmp_path), TASK, {}, h)
    assert "self" not in h.reference and "its timeline has task_retry" in h.reference["why"], h.reference
    re_ = grade_task(h)["checks"]["resume_equivalent"]
    assert re_["verdict"] == "unknown" and "no reference of its seed ran after it" in re_["detail"], re_
    # its reference ran after the tasks (the driver's `_references_after`): compared with that run
    write_artifact(tmp_path / "artifacts" / "ref-t000", art, {"task_id": "ref-t000", "attempt": 1})
    ref_grade = {"task_id": "ref-t000", "checks": {"completed": {"verdict": PASS}}}
    h.reference = reference_for(_wave(tmp_path), TASK, {"ref-t000": ref_grade}, h)
    assert h.reference["task_id"] == "ref-t000" and "self" not in h.reference
    re_ = grade_task(h)["checks"]["resume_equivalent"]
    assert re_["verdict"] == PASS and "reference" not in re_, re_


def test_a_task_that_was_its_own_reference_fills_the_cache_and_one_compared_with_a_run_does_not(tmp_path):
    out = SimpleNamespace(artifact=lambda tid: tmp_path / "artifacts" / tid)
    keys = {tid: (f"{i:x}" * 32)[:32] for i, tid in enumerate(("t000", "t001", "t002"), start=10)}
    for tid in keys:
        write_artifact(out.artifact(tid), {"repo/a.txt": tid.encode()}, {"task_id": tid, "attempt": 1})

    def grade(tid, verdict, reference):
        re_ = {"verdict": PASS, **({"reference": reference} if reference else {})}
        return {"task_id": tid, "reference_key": keys[tid], "verdict": verdict,
                "checks": {"completed": {"verdict": PASS}, "resume_equivalent": re_}}

    cache = ReferenceCache(tmp_path / "root")
    result = {"references": [], "tasks": [grade("t000", PASS, "self"), grade("t001", "fail", "self"),
                                          grade("t002", PASS, None)]}
    cache_passed_references(cache, "w1", out, result)
    got = cache.get(keys["t000"])
    assert got is not None and got[0] == {"repo/a.txt": b"t000"} and got[1]["task_id"] == "t000"
    assert cache.get(keys["t001"]) is None  # it failed a check: no baseline for a later wave
    assert cache.get(keys["t002"]) is None  # a task compared with a reference run is no reference itself


class _Timeline:
    def __init__(self):
        self.events = []

    def __call__(self, event, **fields):
        self.events.append((str(getattr(event, "value", event)), fields))


def test_the_driver_runs_a_reference_after_the_tasks_only_for_a_task_that_was_no_uninterrupted_run(tmp_path):
    """`WaveRun._references_after`: of two tasks with no fault, the one that needed two attempts gets its reference
    (planned, registered, run in a reference slot); the clean one gets none."""
    from cluster import results
    from cluster.driver import WaveRun

    plan = build_plan(build_config({"fault_free_reference": "self", "faults": [], "tasks": 2, "seed": 5}), "w-test")
    out = results.ResultsDir(tmp_path)
    lines = [dict(e, task="t000") for e in TWICE] + [dict(e, task="t001") for e in CLEAN]
    out.timeline.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in lines))
    w = WaveRun.__new__(WaveRun)
    w.plan, w.out, w.dir, w.interrupted, w.health, w.prior_receipts = plan, out, tmp_path, None, None, []
    w.injector, w.timeline, w.runs = SimpleNamespace(receipts=[]), _Timeline(), {}
    registered, ran = [], []
    w.parts = SimpleNamespace(registry=SimpleNamespace(register=lambda *a: registered.append(a[0])))

    async def run_task(run, sem, on_change):
        ran.append((run.plan.task_id, run.plan.role, sem))

    slots = {"task": object(), "reference": object()}
    n = asyncio.run(w._references_after(run_task, slots, lambda: None, lambda: None))
    assert n == 1 and ran == [("ref-t000", "reference", slots["reference"])] and registered == ["ref-t000"]
    assert [r["task_id"] for r in plan["references"]] == ["ref-t000"]
    assert plan["references"][0]["reference"]["key"] == plan["tasks"][0]["reference"]["key"]
    assert orjson.loads((tmp_path / results.PLAN).read_bytes())["references"] == plan["references"]
    assert w.timeline.events == [("references_after", {"run": {"ref-t000": "its timeline has task_retry"}})]
    # run again (a resumed wave): the reference is planned already, nothing more runs
    assert asyncio.run(w._references_after(run_task, slots, lambda: None, lambda: None)) == 0


def test_a_renumbered_attempt_an_unknown_receipt_or_a_misfit_record_is_never_its_own_reference(tmp_path):
    """The hostile review's M2-M4: a timeline record left out for its shape, a receipt of unknown outcome elsewhere in
    the wave, or an attempt numbered other than 1 (a killed task whose fault was removed from the folder) made a task
    its own reference; each now is no uninterrupted run."""
    seventh = [dict(e, attempt=7) if e["event"] in ("attempt_start", "attempt_end") else e for e in CLEAN]
    assert "numbered 7" in not_uninterrupted(TASK, seventh, [])
    unknown = [{"task_id": "t001", "instance": "t001-PK1", "status": "unknown"}]
    assert "may have been" in not_uninterrupted(TASK, CLEAN, unknown)
    assert not_uninterrupted(TASK, CLEAN, [dict(unknown[0], status="not_applied")]) is None
    write_artifact(tmp_path / "artifacts" / "t000", {"repo/a.txt": b"x"}, {"task_id": "t000", "attempt": 1})
    own = SimpleNamespace(events=CLEAN, artifact={"repo/a.txt": b"x"}, receipts_damage=None)
    task = build_plan(build_config({"fault_free_reference": "self", "faults": [], "tasks": 1, "seed": 5}),
                      "w-test")["tasks"][0]
    assert reference_for(_wave(tmp_path), task, {}, own).get("self") is True
    got = reference_for(_wave(tmp_path, skipped={"timeline.jsonl": 1}), task, {}, own)
    assert "self" not in got and "left out for their shape" in got["why"], got
