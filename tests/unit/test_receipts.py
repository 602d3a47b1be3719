"""A fault's receipt says applied only when the effect is known to have happened."""
from faults import CATALOG
from faults.base import FaultSpec

SPEC = FaultSpec(fault_id="PK1", instance="t000-PK1", task_id="t000", trigger="time", at_s=1.0)


def test_pk1_receipt_three_ways():
    pk1 = CATALOG["PK1"]
    assert pk1.receipt(SPEC, {"applied": True, "sandbox_id": "s"}, {}).status == "applied"
    assert pk1.receipt(SPEC, {"applied": False, "why": "exited 0 first"}, {}).status == "not_applied"
    assert pk1.receipt(SPEC, {"applied": None, "why": "did not end"}, {}).status == "unknown"


def test_st1_receipt_needs_a_hit():
    st1 = CATALOG["ST1"]
    spec = FaultSpec(fault_id="ST1", instance="t000-ST1", task_id="t000", trigger="time", at_s=1.0, window_s=1.0)
    opened = {"applied": True, "at": 10.0}
    assert st1.receipt(spec, opened, {"rule": {"hits": 0}}).status == "not_applied"
    assert st1.receipt(spec, opened, {"rule": {"hits": 3, "first_hit_at": 10.5}}).status == "applied"
    assert st1.receipt(spec, opened, {"error": "proxy gone"}).status == "unknown"
