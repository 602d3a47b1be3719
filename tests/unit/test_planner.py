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


def test_storage_faults_armed_at_a_model_answer_are_planned_from_the_seed():
    """`after_model_calls` on a storage fault: armed at a boundary of the runner (trigger model_call, at_s 0), N
    seeded in [lo, hi]; the clock-timed plan of the same seed is unchanged by the option existing."""
    tasks = [f"t{i:03d}" for i in range(6)]
    faults = ["ST1", "ST2", "ST3", "ST4", "ST5", "ST6", "ST7", "ST8"]
    timing = {f: {"after_model_calls": (2, 4)} for f in faults}
    a = plan_faults(5, tasks, faults, timing)
    assert a == plan_faults(5, tasks, faults, timing)
    specs = [f for t in tasks for f in a[t]]
    assert specs and all(f.trigger == "model_call" and f.at_s == 0.0 and 2 <= f.params["after"] <= 4 for f in specs)
    clock = plan_faults(5, tasks, faults)
    assert all(f.trigger == "time" and f.at_s > 0 and "after" not in f.params for t in tasks for f in clock[t])
    # the boundary adds one draw after the clock plan's: window and seed are those of the clock plan
    same = plan_faults(5, tasks, faults, timing)
    assert [(f.window_s, f.seed) for t in tasks for f in same[t]] == [(f.window_s, f.seed) for t in tasks
                                                                      for f in clock[t]]


def test_a_storage_fault_armed_at_a_model_answer_waits_for_it_and_is_not_applied_when_the_task_ends_first():
    import asyncio

    from faults.base import CATALOG

    class Proxy:
        def __init__(self):
            self.opened = []

        def open_rule(self, **rule):
            self.opened.append(rule)
            return rule

    class Ctx:
        bucket = "b"

        def __init__(self, answered: bool):
            self.answered, self.asked, self._proxy = answered, [], Proxy()

        def task_prefix(self, task_id):
            return f"w/{task_id}/"

        async def wait_model_answers(self, task_id, n):
            self.asked.append((task_id, n))
            return self.answered

        def proxy(self):
            return self._proxy

    for fid in ("ST1", "ST2", "ST6"):
        spec = plan_faults(3, ["t000"], [fid], {fid: {"after_model_calls": (3, 3)}})["t000"][0]
        ended = Ctx(answered=False)
        got = asyncio.run(CATALOG[fid].inject(spec, ended))
        assert got == {"applied": False, "why": "the task ended before its model answer #3 was delivered"}, got
        assert ended.asked == [("t000", 3)] and not ended.proxy().opened
        assert CATALOG[fid].receipt(spec, got, {}).status == "not_applied"
        came = Ctx(answered=True)
        assert asyncio.run(CATALOG[fid].inject(spec, came))["applied"] is True
        assert came.asked == [("t000", 3)] and came.proxy().opened[0]["key_prefix"] == "w/t000/"
