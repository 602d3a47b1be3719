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


PK2 = FaultSpec(fault_id="PK2", instance="t000-PK2", task_id="t000", trigger="model_call", at_s=0.0,
                params={"after": 3, "grace_s": 2.0})
NOTICE = {"written": True, "at": 99.9}


def test_pk2_answered_by_an_exit_0_in_the_grace_is_applied_and_says_no_sigkill_was_sent():
    """The host reports a notice's SIGTERM that reached the runner; the runner's exit 0 in the grace is its answer
    (the receipt said `not_applied`, "SIGKILL ...")."""
    got = CATALOG["PK2"].receipt(PK2, {"applied": True, "sandbox_id": "t000-a1", "notice": NOTICE, "at": 100.0,
                                       "sigterm_at": 100.0, "sigkill": False, "exit_code": 0, "ended_at": 100.4},
                                 {})
    assert got.status == "applied", got
    assert got.detail.startswith("notice written to $SANDFLEET_NOTICE, SIGTERM delivered, 2.0 s grace: the runner "
                                 "exited 0 0.40 s after the SIGTERM, within the grace: no SIGKILL was sent"), got.detail
    assert got.detail.endswith(", right after model answer #3") and "SIGKILL to every" not in got.detail
    assert got.target["exited_in_grace"] is True and got.target["sigkill"] is False


def test_pk2_still_running_at_the_end_of_the_grace_is_sigkilled_and_says_so():
    got = CATALOG["PK2"].receipt(PK2, {"applied": True, "sandbox_id": "t000-a1", "notice": NOTICE, "at": 100.0,
                                       "sigterm_at": 100.0, "sigkill": True, "exit_code": -9, "ended_at": 102.1},
                                 {})
    assert got.status == "applied" and "still running at the end of the grace: SIGKILL to every process" in \
        got.detail, got.detail
    assert got.target["exited_in_grace"] is False


def test_pk2_with_no_notice_or_no_sigterm_delivered_is_not_a_notice_applied():
    pk2 = CATALOG["PK2"]
    base = {"applied": True, "sandbox_id": "t000-a1", "at": 100.0, "sigkill": True, "exit_code": -9}
    no_term = pk2.receipt(PK2, dict(base, notice=NOTICE, sigterm_at=None), {})
    assert no_term.status == "unknown" and "SIGTERM NOT delivered" in no_term.detail
    no_notice = pk2.receipt(PK2, dict(base, notice={"written": False, "why": "gone"}, sigterm_at=100.0), {})
    assert no_notice.status == "unknown" and "notice NOT written (gone)" in no_notice.detail
    # a runner that exited 0 before any SIGTERM reached it: the kill missed (the host says applied False)
    missed = pk2.receipt(PK2, {"applied": False, "why": "the runner exited 0 before the kill landed"}, {})
    assert missed.status == "not_applied"
