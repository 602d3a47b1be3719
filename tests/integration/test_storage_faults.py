"""The storage fault family on whole waves (real store, proxy, sandboxes): durable survives every ST fault
(ST7 together with a kill: only a resume reads what the store may still hide), a fault that changed no
request is `not_applied`, and a runner that trusts a lagging store is caught."""
from __future__ import annotations

import orjson
import pytest

pytestmark = pytest.mark.integration
# every fault armed at a boundary of the runner (right after its 1st-2nd model answer), none at a clock time: the
# wave asserts that each one applied, and a task that ended before a clock time would get none (ST7 is armed at
# the start, before the runner's first request, and its window opens at that request)
AT_ANSWER = {"after_model_calls": [1, 2]}
FAMILY = dict(tasks=7, concurrency=7, seed=11, faults=["ST2", "ST3", "ST4", "ST5", "ST8", "ST7+PK1", "CR1"],
              fault_timing={"PK1": {"after_model_calls": [4, 6]}, "ST7": {"at_s": [0.0, 0.1], "window_s": [20, 20], "strength": 8},
                            "ST2": AT_ANSWER, "ST3": AT_ANSWER, "ST5": AT_ANSWER, "ST8": AT_ANSWER,
                            "ST4": {**AT_ANSWER, "window_s": [30, 30]},
                            "CR1": {"after_model_calls": [2, 3], "window_s": [0.4, 0.8]}},
              workload={"steps": 9, "think_ms": 50}, deadline_s=90)
# ST7's lag (`strength`, seconds after each write) is 8 s, longer than any kill-to-resume on a loaded 2-core
# host: the resume's reads always meet records the store still hides (a 0.5-2 s lag raced the restart)


def _receipts(d):
    return orjson.loads((d / "faults.json").read_bytes())


def test_durable_survives_every_storage_fault_and_every_one_applied(run_wave):
    result, d = run_wave(runner="durable", **FAMILY)
    assert result["verdict"] == "pass", [(g["task_id"], g["faults"], g["signature"]) for g in result["tasks"]]
    receipts = _receipts(d)
    assert {r["fault_id"] for r in receipts} == {"ST2", "ST3", "ST4", "ST5", "ST7", "ST8", "PK1", "CR1"}
    for r in receipts:
        assert r["status"] == "applied", r
        assert r["evidence"].get("hits", 1) >= 1
    st4 = next(r for r in receipts if r["fault_id"] == "ST4")
    assert "UploadPart" in st4["detail"]  # durable's workspace snapshots are multipart uploads
    # nothing half-uploaded is left: an UploadPart that failed was retried or its upload aborted
    assert result["leaks"]["incomplete_uploads"] == []
    # the proxy's log shows every fault's answers (what the runner really met)
    log = [orjson.loads(l) for l in (d / "proxy-requests.jsonl").read_bytes().splitlines()]
    met = {r.get("fault") for r in log if r.get("rule")}
    assert {"ST2", "ST3", "ST4", "ST5", "ST8"} <= met, met


def test_naive_is_caught_in_the_storage_family_wave(run_wave):
    """The negative control on the same plan: the task whose outage-era kill makes it resume (ST7+PK1) fails
    (naive re-applies and re-asks what it had done), so the wave fails."""
    result, d = run_wave(runner="naive", **FAMILY)
    by_fault = {"+".join(g["faults"]): g for g in result["tasks"]}
    assert by_fault["ST7+PK1"]["verdict"] == "fail", by_fault["ST7+PK1"]["checks"]
    assert result["verdict"] == "fail"


def test_a_fault_that_changed_no_request_is_not_applied(run_wave):
    # ST7 alone: durable never reads back what it just wrote unless an attempt resumes, so the lag changes
    # nothing: the receipt says so and the wave does not count it as survived
    result, d = run_wave(runner="durable", tasks=1, concurrency=1, seed=2, faults=["ST7"],
                         fault_timing={"ST7": {"at_s": [0.0, 0.05]}},
                         workload={"steps": 5, "think_ms": 20}, deadline_s=60)
    r = _receipts(d)[0]
    assert r["status"] == "not_applied" and "changed nothing" in r["detail"], r
    assert result["tasks"][0]["verdict"] == "not_applied"
    assert "ST7 applied 0/1, not applied 1 — **not tested**" in (d / "SUMMARY.md").read_text()


def test_a_runner_that_trusts_a_lagging_listing_is_caught(run_wave):
    """The defective runner's resume reads its journal from a listing (durable reads each record by key and
    claims the next one with a conditional create). Under ST7 a kill's resume lists a journal that still
    hides the newest record, so it asks the model again for a recorded step."""
    import sys
    from pathlib import Path

    defective = str(Path(__file__).resolve().parents[2] / "tests" / "runners" / "defective.py")
    runner = {"name": "trusts-listing", "command": [sys.executable, defective], "env": {"DEFECT": "trust_listing"}}
    result, d = run_wave(runner=runner, tasks=4, concurrency=4, seed=5, faults=["ST7+PK1"],
                         fault_timing={"PK1": {"after_model_calls": [3, 6]},
                                       "ST7": {"at_s": [0.0, 0.1], "window_s": [30, 30], "strength": 15}},
                         workload={"steps": 8, "think_ms": 50}, deadline_s=90)
    lagged = {r["task_id"] for r in _receipts(d) if r["fault_id"] == "ST7" and r["status"] == "applied"}
    caught = [g for g in result["tasks"] if g["checks"]["no_model_recall"]["verdict"] == "fail"]
    assert lagged and caught, [(g["task_id"], g["signature"]) for g in result["tasks"]]
    assert {g["task_id"] for g in caught} <= lagged  # caught only where the store really lagged


def test_cr1_rotates_the_key_at_the_store_and_only_a_runner_that_resolves_again_survives(run_wave):
    """CR1: the store itself rejects the old key (real 403s, not the proxy's); the credential source serves
    the new key only after a seeded delay. durable resolves credentials again after a 403 and passes; a
    runner that keeps its first client (the defective `stale_creds` mode) fails."""
    import sys
    from pathlib import Path

    timing = {"CR1": {"after_model_calls": [2, 3], "window_s": [0.4, 0.8]}}
    result, d = run_wave(runner="durable", tasks=2, concurrency=2, seed=8, faults=["CR1"], fault_timing=timing,
                         workload={"steps": 7, "think_ms": 60}, deadline_s=60)
    assert result["verdict"] == "pass", [(g["task_id"], g["signature"], g["checks"]) for g in result["tasks"]]
    for r in _receipts(d):
        assert r["status"] == "applied", r
        assert r["evidence"]["old_key_rejected"] >= 1 and r["evidence"]["new_key_ok"] >= 1, r
    log = [orjson.loads(l) for l in (d / "proxy-requests.jsonl").read_bytes().splitlines()]
    old = {r["target"]["old_akid"] for r in _receipts(d)}
    assert all(x.get("rule") is None for x in log if x.get("akid") in old and x.get("status") == 403)
    # the evidence files never carry a secret: only key ids appear in the receipt
    assert "secret" not in (d / "faults.json").read_text().lower()

    defective = str(Path(__file__).resolve().parents[2] / "tests" / "runners" / "defective.py")
    runner = {"name": "stale-creds", "command": [sys.executable, defective], "env": {"DEFECT": "stale_creds"}}
    result, d = run_wave(runner=runner, tasks=2, concurrency=2, seed=8, faults=["CR1"], fault_timing=timing,
                         workload={"steps": 7, "think_ms": 60}, deadline_s=9, max_attempts=1)
    applied = [r for r in _receipts(d) if r["status"] == "applied"]
    assert applied and all(g["verdict"] == "fail" for g in result["tasks"]
                           if g["task_id"] in {r["task_id"] for r in applied}), \
        [(g["task_id"], g["signature"]) for g in result["tasks"]]


def test_a_campaign_bisects_a_fault_strength_and_writes_its_table_and_picture(fleet, tmp_path):
    """`sandfleet campaign storage` on the session's fleet: ST8 (PUTs throttled) from 1 to 8 for durable,
    a runner that backs off: both ends survived, so the bracket says it survives the whole range."""
    from cluster.campaign import run_campaign

    wave = {"tasks": 2, "concurrency": 2, "seed": 4, "workload": {"steps": 5, "think_ms": 20}, "deadline_s": 60}
    out = run_campaign("ST8", ["durable"], 1, 8, wave, tmp_path, probes=2, fleet=fleet)
    data = orjson.loads((out / "campaign.json").read_bytes())
    assert [(r["strength"], r["outcome"]) for r in data["rows"]] == [(1, "survived"), (8, "survived")], data
    assert all(r["met"] == 2 for r in data["rows"])
    text = (out / "CAMPAIGN.md").read_text()
    assert "survives the whole range tried (up to 8)" in text and (out / "campaign.png").stat().st_size > 1000
    page = (out / "index.html").read_text()  # the campaign as a page, each wave linked to its report
    assert "campaign.png" in page and all(f"href='waves/{r['wave_id']}/index.html'" in page for r in data["rows"])


def test_a_kill_armed_on_a_storage_request_interrupts_that_transfer(run_wave):
    """PK1 `at_request`: the proxy holds the task's next UploadPart of a workspace snapshot (never forwarded)
    while the sandbox is killed, so the kill provably lands mid-transfer; durable aborts the upload the dead
    attempt left and passes, nothing half-uploaded remains."""
    timing = {"PK1": {"at_request": {"ops": ["UploadPart"], "key_prefix": "snapshots/"}}}
    result, d = run_wave(runner="durable", tasks=2, concurrency=2, seed=6, faults=["PK1"], fault_timing=timing,
                         workload={"steps": 7, "think_ms": 20}, deadline_s=60)
    assert result["verdict"] == "pass", [(g["task_id"], g["signature"]) for g in result["tasks"]]
    log = [orjson.loads(l) for l in (d / "proxy-requests.jsonl").read_bytes().splitlines()]
    for r in _receipts(d):
        assert r["status"] == "applied" and "held its store request UploadPart" in r["detail"], r
        held = [x for x in log if x.get("rule") == r["instance"]]
        assert len(held) == 1 and held[0]["held"] and held[0]["aborted"] and held[0]["op"] == "UploadPart"
    assert result["leaks"]["incomplete_uploads"] == []
    runner_logs = "".join(p.read_text() for p in (d / "sandboxes").glob("t*-a2/runner.log"))
    assert "aborted 1 snapshot upload(s)" in runner_logs
