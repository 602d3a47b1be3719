"""An enumerated wave counts its uninterrupted run's boundaries from what the harness logged (cluster/wave/plan.py)."""
from cluster.wave.plan import boundary_counts


def test_only_the_reference_runs_own_answered_writes_calls_and_effects_count():
    rows = [{"key": "w/ref-t0/a", "method": "PUT", "status": 200}, {"key": "w/ref-t0/b", "method": "DELETE",
                                                                     "status": 204},
            {"key": "w/ref-t0/c", "method": "PUT", "status": 503}, {"key": "w/ref-t0/d", "method": "GET", "status": 200},
            {"key": "w/t0/e", "method": "PUT", "status": 200}, {"key": None, "method": "PUT", "status": 400}, {}]
    model = [{"task": "ref-t0", "delivered": True}, {"task": "ref-t0", "delivered": False}, {"task": "t0",
                                                                                            "delivered": True}]
    effects = [{"task": "ref-t0"}, {"task": "t1"}]
    assert boundary_counts("ref-t0", "w/ref-t0/", rows, model, effects, None) == \
        {"model_call": 1, "effect": 1, "store_write": 2}
    got = boundary_counts("ref-t0", "w/ref-t0/", [], [], [], {"write": 7, "fsync": 2})
    assert got == {"model_call": 0, "effect": 0, "store_write": 0, "disk_write": 7, "disk_fsync": 2, "disk_rename": 0}
