from cluster.config import build_config
from cluster.driver import build_plan
from faults.planner import plan_faults


def test_same_seed_plans_the_same_faults():
    tasks = [f"t{i:03d}" for i in range(8)]
    a = plan_faults(42, tasks, ["PK1", "ST1"])
    b = plan_faults(42, tasks, ["PK1", "ST1"])
    assert [(t, f.fault_id, f.at_s, f.window_s, f.seed) for t in tasks for f in a[t]] == \
           [(t, f.fault_id, f.at_s, f.window_s, f.seed) for t in tasks for f in b[t]]
    c = plan_faults(43, tasks, ["PK1", "ST1"])
    assert [f.at_s for t in tasks for f in a[t]] != [f.at_s for t in tasks for f in c[t]]


def test_every_fault_kind_is_dealt_and_timed_inside_its_window():
    tasks = [f"t{i:03d}" for i in range(4)]
    plan = plan_faults(1, tasks, ["PK1", "ST1"], {"ST1": {"at_s": (2.0, 3.0), "window_s": (0.5, 0.6)}})
    kinds = [plan[t][0].fault_id for t in tasks]
    assert kinds.count("PK1") == 2 and kinds.count("ST1") == 2
    for t in tasks:
        f = plan[t][0]
        if f.fault_id == "ST1":
            assert 2.0 <= f.at_s <= 3.0 and 0.5 <= f.window_s <= 0.6


def test_no_faults_plans_nothing():
    assert plan_faults(1, ["t000"], []) == {"t000": []}


def test_wave_plan_is_reproducible_from_the_seed():
    cfg = build_config({"tasks": 5, "seed": 9, "faults": ["PK1", "ST1"]})
    a, b = build_plan(cfg, "w-x"), build_plan(cfg, "w-x")
    a.pop("created_at"), b.pop("created_at")
    assert a == b
    assert len({t["seed"] for t in a["tasks"]}) == 5


def test_pk1_after_the_nth_model_answer_is_planned_from_the_seed():
    from faults.planner import plan_faults

    a = plan_faults(9, ["t000", "t001"], ["PK1"], {"PK1": {"after_model_calls": (2, 6)}})
    b = plan_faults(9, ["t000", "t001"], ["PK1"], {"PK1": {"after_model_calls": (2, 6)}})
    assert a == b
    for specs in a.values():
        assert specs[0].trigger == "model_call" and 2 <= specs[0].params["after"] <= 6
