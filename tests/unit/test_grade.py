"""Grading on synthetic histories, including the detection the negative controls rely on."""
from fleet import workload
from cluster.grade import FAIL, NOT_APPLIED, PASS, UNKNOWN, grade_task, merge

TASK = {"task_id": "t000", "seed": 7, "runner": "durable", "steps": 5,
        "faults": [{"fault_id": "PK1", "instance": "t000-PK1"}]}
END = [{"event": "attempt_end", "exit_code": -9}, {"event": "attempt_end", "exit_code": 0},
       {"event": "task_end", "state": "done"}]
RECEIPT = [{"task_id": "t000", "instance": "t000-PK1", "status": "applied", "detail": "ok"}]


def calls(per_step):
    log = [{"step": s, "tokens": 10} for s, n in per_step.items() for _ in range(n)]
    return {"calls": len(log), "steps": {str(s): n for s, n in per_step.items()}, "log": log}


def test_merge_order():
    assert merge([PASS, NOT_APPLIED]) == NOT_APPLIED
    assert merge([PASS, NOT_APPLIED, UNKNOWN]) == UNKNOWN
    assert merge([UNKNOWN, FAIL, PASS]) == FAIL
    assert merge([]) == PASS


def test_reference_artifact_passes():
    art = workload.reference(7, 5)
    g = grade_task(TASK, END, RECEIPT, calls({s: 1 for s in range(5)}), art)
    assert g["verdict"] == PASS, g["checks"]


def test_double_apply_is_caught():
    art = workload.reference(7, 5)
    d = workload.decide(7, 3)
    art = workload.apply(art, d)  # step 3 applied twice
    g = grade_task(TASK, END, RECEIPT, calls({s: 1 for s in range(5)}), art)
    assert g["checks"]["no_double_apply"]["verdict"] == FAIL
    assert g["checks"]["no_double_apply"]["applied_twice"] == [3]
    assert g["checks"]["resume_equivalent"]["verdict"] == FAIL
    assert g["verdict"] == FAIL and "no_double_apply" in g["signature"]


def test_recalls_beyond_one_per_interruption_fail():
    art = workload.reference(7, 5)
    ok = grade_task(TASK, END, RECEIPT, calls({0: 1, 1: 2, 2: 1, 3: 1, 4: 1}), art)
    assert ok["checks"]["no_model_recall"]["verdict"] == PASS
    bad = grade_task(TASK, END, RECEIPT, calls({0: 2, 1: 2, 2: 1, 3: 1, 4: 1}), art)
    assert bad["checks"]["no_model_recall"]["verdict"] == FAIL
    assert bad["model_recalls"] == 2 and bad["extra_tokens"] == 20


def test_fault_not_applied_is_not_a_pass():
    art = workload.reference(7, 5)
    r = [dict(RECEIPT[0], status="not_applied")]
    g = grade_task(TASK, END, r, calls({s: 1 for s in range(5)}), art)
    assert g["verdict"] == NOT_APPLIED
    g = grade_task(TASK, END, [], calls({s: 1 for s in range(5)}), art)
    assert g["verdict"] == UNKNOWN  # no receipt at all


def test_missing_artifact_and_missing_history():
    g = grade_task(TASK, END, RECEIPT, calls({}), None)
    assert g["checks"]["completed"]["verdict"] == FAIL
    g = grade_task(TASK, [], RECEIPT, calls({}), None)
    assert g["verdict"] == UNKNOWN


def test_a_crashing_check_is_unknown():
    g = grade_task(TASK, END, RECEIPT, {"steps": {"x": "not a number"}}, workload.reference(7, 5))
    assert g["checks"]["no_model_recall"]["verdict"] == UNKNOWN
    assert g["verdict"] == UNKNOWN
