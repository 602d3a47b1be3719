"""The spine, end to end on real parts: Ray, SeaweedFS behind the fault proxy, process sandboxes."""
from __future__ import annotations

import re
import subprocess
import sys

import orjson
import pytest

from cluster.grade import exit_code, grade_wave
from tests import leftovers

pytestmark = pytest.mark.integration

# PK1 and ST1 land at boundaries of the runner (its Nth model answer), so load cannot move where in the run they
# land; the clock triggers have their own test (test_clock_timed_faults_say_what_they_hit)
FAULTY = dict(faults=["PK1", "ST1"], seed=11, workload={"steps": 10, "think_ms": 150}, deadline_s=90,
              fault_timing={"PK1": {"after_model_calls": [3, 8]}, "ST1": {"after_model_calls": [2, 6]}})
# the negative control's kill: the proxy holds naive's first progress save (never forwarded) while the sandbox is
# killed, so steps 0-2 were applied in place and never saved, on every run, however loaded the machine
NAIVE_FAULTY = dict(FAULTY, workload={"steps": 10, "think_ms": 60}, fault_timing={"PK1": {"at_request": {"methods": ["PUT"],
                                                                 "key_prefix": "naive/progress.json"}},
                                          "ST1": {"after_model_calls": [2, 6]}})


def _lines(path):
    return [orjson.loads(l) for l in path.read_bytes().splitlines() if l.strip()]


def _journal_commit_times(d, wave_id, task_id) -> dict[int, float]:
    """When each step's journal record was durably committed, from the proxy's request log."""
    out = {}
    pat = re.compile(rf"^{re.escape(wave_id)}/{task_id}/journal/(\d+)\.json$")
    for r in _lines(d / "proxy-requests.jsonl"):
        m = pat.match(r["key"])
        # a resume's claim of the next step is a tiny placeholder (durable.claim), not the step's record
        if m and r["method"] == "PUT" and r["status"] == 200 and (r.get("req_bytes") or 0) > 100:
            out.setdefault(int(m.group(1)), r["t"])
    return out


@pytest.fixture(scope="module")
def durable_wave(run_wave):
    return run_wave(runner="durable", tasks=6, concurrency=4, **FAULTY)


@pytest.fixture(scope="module")
def naive_wave(run_wave):
    return run_wave(runner="naive", tasks=6, concurrency=4, **NAIVE_FAULTY)


def test_durable_runner_survives_pk1_and_st1(durable_wave):
    result, d = durable_wave
    bad = {g["task_id"]: {k: c for k, c in g["checks"].items() if c["verdict"] != "pass"}
           for g in result["tasks"] if g["verdict"] != "pass"}
    assert not bad, bad
    assert result["verdict"] == "pass" and exit_code(result) == 0
    # the host looked for processes that outlived each exit (and found none: durable leaves none)
    assert all(g["checks"]["no_outliving_process"]["verdict"] == "pass" for g in result["tasks"])
    receipts = orjson.loads((d / "faults.json").read_bytes())
    assert len(receipts) == 6 and {r["fault_id"] for r in receipts} == {"PK1", "ST1"}
    assert all(r["status"] == "applied" for r in receipts), receipts
    st1 = [r for r in receipts if r["fault_id"] == "ST1"]
    assert all(r["evidence"]["hits"] > 0 for r in st1)
    # every window was closed by its own clear, before grading (no forced close needed)
    assert all(r["cleared_at"] for r in st1)
    assert not [e for e in _lines(d / "timeline.jsonl") if e["event"] == "proxy_rules_force_closed"]
    # the proxy really answered 503 to those tasks' requests
    faulted = [r for r in _lines(d / "proxy-requests.jsonl") if r["fault"] == "ST1"]
    assert faulted and all(r["status"] == 503 for r in faulted)
    # each outage lasted its seeded length, counted from the task's first request after arming
    for r in st1:
        times = [q["t"] for q in faulted if q["rule"] == r["instance"]]
        opened = r["evidence"]["first_hit_at"]
        assert len(times) == r["evidence"]["hits"]
        assert min(times) >= opened - 0.01 and max(times) <= opened + r["target"]["window_s"] + 0.05


def test_durable_resumes_without_reasking_recorded_steps(durable_wave):
    result, d = durable_wave
    calls = _lines(d / "model-calls.jsonl")
    interrupted = [g for g in result["tasks"] if "PK1" in g["faults"]]
    assert interrupted and all(g["attempts"] >= 2 and g["interrupted"] for g in interrupted)
    for g in interrupted:
        committed = _journal_commit_times(d, result["wave_id"], g["task_id"])
        assert sorted(committed) == list(range(10))
        mine = [c for c in calls if c["task"] == g["task_id"] and c["step"] < 10]
        late = [c for c in mine if c["t"] > committed[c["step"]]]
        assert not late, f"{g['task_id']} asked the model again for recorded steps: {late}"
        assert g["model_recalls"] == 0 and g["wasted_calls"] <= g["attempts"] - 1
    # the effects of interrupted tasks were retried with their Idempotency-Key, never applied twice
    effects = _lines(d / "effects.jsonl")
    for g in result["tasks"]:
        applied = [e["effect_id"] for e in effects if e["task"] == g["task_id"] and not e["deduped"]]
        assert applied and len(applied) == len(set(applied))


def test_naive_runner_is_flagged(naive_wave):
    """Negative control: every naive task killed after an unsaved in-place write must be flagged."""
    result, d = naive_wave
    grades = {g["task_id"]: g for g in result["tasks"]}
    vulnerable = []
    for g in grades.values():
        if "PK1" not in g["faults"]:
            continue
        log = (d / "sandboxes" / f"{g['task_id']}-a1" / "runner.log").read_text()
        acted = [int(m) for m in re.findall(r"step (\d+) (?:applied in place|published)", log)]
        # what was saved is what the next attempt resumed from (a kill can land between a save and its log line)
        nxt = d / "sandboxes" / f"{g['task_id']}-a2" / "runner.log"
        m = re.search(r"resumed attempt=2 from progress=(\d+)", nxt.read_text()) if nxt.exists() else None
        if acted and m and max(acted) + 1 > int(m.group(1)):
            vulnerable.append(g["task_id"])
    assert vulnerable, "no kill landed between two progress saves: the control proved nothing"
    kills = [r for r in orjson.loads((d / "faults.json").read_bytes()) if r["fault_id"] == "PK1"]
    assert kills and all(r["status"] == "applied" and "naive/progress.json" in r["detail"] for r in kills), kills
    for tid in vulnerable:
        g = grades[tid]
        assert g["verdict"] == "fail", g
        assert g["checks"]["no_double_apply"]["verdict"] == "fail"
        assert g["checks"]["no_model_recall"]["verdict"] == "fail"
    assert any(grades[t]["checks"]["resume_equivalent"]["verdict"] == "fail" for t in vulnerable)
    assert result["verdict"] == "fail" and exit_code(result) == 1
    assert (d / "evidence" / vulnerable[0] / "runner-logs.txt").exists()


@pytest.mark.parametrize("runner", ["durable", "naive"])
def test_positive_control_without_faults(run_wave, runner):
    result, d = run_wave(runner=runner, tasks=3, concurrency=3, faults=[], seed=5,
                         workload={"steps": 6, "think_ms": 20})
    assert result["verdict"] == "pass", [g["checks"] for g in result["tasks"]]
    assert all(g["attempts"] == 1 and g["model_recalls"] == 0 for g in result["tasks"])
    assert orjson.loads((d / "faults.json").read_bytes()) == []
    # every task was compared with an uninterrupted reference run of the same runner and seed
    assert result["wave_checks"]["positive_control"] == "pass"
    for g in result["tasks"]:
        re_ = g["checks"]["resume_equivalent"]
        assert re_["verdict"] == "pass" and re_["expected"] == re_["got"]


def test_grade_regrades_a_finished_wave_without_running(durable_wave):
    result, d = durable_wave
    again = grade_wave(d)
    assert [(g["task_id"], g["verdict"]) for g in again["tasks"]] == \
           [(g["task_id"], g["verdict"]) for g in result["tasks"]]
    cli = subprocess.run([sys.executable, "-m", "cluster.cli", "grade", str(d)], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert "SUMMARY:" in cli.stdout
    (d / "index.html").unlink()
    cli = subprocess.run([sys.executable, "-m", "cluster.cli", "report", str(d)], capture_output=True, text=True)
    assert cli.returncode == 0 and f"REPORT: {d / 'index.html'}" in cli.stdout, (cli.stdout, cli.stderr)
    summary = (d / "SUMMARY.md").read_text()
    assert "durable × patch-repo × PK1" in summary and "Resume survival rate" in summary


def test_wave_results_layout(durable_wave):
    result, d = durable_wave
    for name in ("plan.json", "timeline.jsonl", "faults.json", "ledger.jsonl", "store-audit.json",
                 "sandbox-sweep.json", "SUMMARY.md", "model-calls.jsonl", "effects.jsonl", "proxy-requests.jsonl",
                 "timeline.png", "index.html"):
        assert (d / name).exists(), name
    for g in result["tasks"] + result["references"]:
        assert (d / f"{g['task_id']}.grade.json").exists()
        assert f"pages/{g['task_id']}.html" in (d / "index.html").read_text()
        assert g["verdict"] in (d / "pages" / f"{g['task_id']}.html").read_text()
        assert (d / "artifacts" / g["task_id"] / "artifact.json").exists()
    latest = d.parent / "latest"
    assert latest.is_symlink() and (latest.resolve() / "plan.json").is_file()  # points at a finished wave
    sweep = orjson.loads((d / "sandbox-sweep.json").read_bytes())
    assert sweep["leaked"] == [] and sweep["active_leases"] == []
    leases = [r for r in _lines(d / "ledger.jsonl") if r["kind"] == "lease"]
    for g in result["tasks"]:
        fences = [r["fence"] for r in leases if r["task_id"].endswith("/" + g["task_id"])]
        assert fences == list(range(1, g["attempts"] + 1)), "each attempt takes the next fence"
    assert all(r["state"] == "released" for r in leases)


def test_wave_leaves_nothing_behind(durable_wave, naive_wave, baseline):
    left = leftovers.wait_clean(baseline["snapshot"])
    assert not left, left


def test_waves_on_a_lent_fleet_share_its_store_each_under_its_own_prefix(durable_wave, naive_wave, fleet):
    """A lent fleet's store serves every wave: one weed process and one bucket, each wave's objects, audit and keys
    under its own `<wave id>/` prefix; no wave stops the store, and no key of an ended wave is still live."""
    ready, audits = [], []
    for result, d in (durable_wave, naive_wave):
        ready.append(next(e for e in _lines(d / "timeline.jsonl") if e["event"] == "parts_ready"))
        audits.append((result["wave_id"], orjson.loads((d / "store-audit.json").read_bytes())))
    assert all(r["store_lent"] for r in ready) and len({(r["store"], r["bucket"]) for r in ready}) == 1, ready
    assert ready[0]["store"] == fleet.store.endpoint.url and fleet.store.proc.poll() is None
    assert ready[0]["pids"]["store"] == fleet.store.proc.pid
    for wave_id, a in audits:
        assert a["scope"] == f"{wave_id}/" and a["objects_checked"] > 0 and not a["outside_task_prefixes"], a
    # what the store holds of each wave is what that wave's audit read back, and nothing else
    listed = {}
    for o in fleet.store.endpoint.client().get_paginator("list_objects_v2").paginate(Bucket=ready[0]["bucket"]):
        for obj in o.get("Contents", []):
            listed.setdefault(obj["Key"].split("/", 1)[0], 0)
            listed[obj["Key"].split("/", 1)[0]] += 1
    for wave_id, a in audits:
        assert listed.get(wave_id) == a["objects_checked"], (wave_id, listed.get(wave_id), a["objects_checked"])
    live = [s["owner"] for s in fleet.keys.slots if s.get("owner")]
    assert not [o for o in live if o.split("/", 1)[0] in {w for w, _ in audits}], live


def test_wave_on_an_existing_s3_endpoint(run_wave, tmp_path):
    """store.url: the wave uses a store it did not start (here a second weed mini) and stops nothing of it."""
    from storage.store import EmbeddedStore

    other = EmbeddedStore(tmp_path / "external")
    ep = other.start()
    try:
        result, d = run_wave(runner="durable", tasks=2, concurrency=2, faults=["ST1"], seed=8,
                             workload={"steps": 8, "think_ms": 150},
                             # at a boundary of the runner, not a clock (a task that ended first is not_applied)
                             fault_timing={"ST1": {"after_model_calls": [2, 3], "window_s": [1.0, 1.5]}},
                             store={"url": ep.url, "access_key": ep.creds.access_key,
                                    "secret_key": ep.creds.secret_key})
        assert result["verdict"] == "pass", [g["checks"] for g in result["tasks"]]
        assert other.proc.poll() is None, "the wave must not stop a store it did not start"
        keys = ep.client().list_objects_v2(Bucket=orjson.loads((d / "store-audit.json").read_bytes())["bucket"])
        assert keys["KeyCount"] > 0
    finally:
        other.stop()


def test_regrade_of_damaged_inputs_is_unknown_or_a_named_error(durable_wave, tmp_path):
    """Grading integrity: a damaged input is never a fail or a pass; the grade names what it read."""
    import shutil

    result, d = durable_wave
    copy = tmp_path / "copy"
    shutil.copytree(d, copy, symlinks=True)
    g = orjson.loads((copy / "t000.grade.json").read_bytes())
    assert "timeline.jsonl" in g["inputs"]["digests"] and "model-calls.jsonl" in g["inputs"]["digests"]
    calls = (copy / "model-calls.jsonl").read_bytes().splitlines()
    (copy / "model-calls.jsonl").write_bytes(b"\n".join(calls[:2] + [b"{garbage"] + calls[2:]))
    art = next((copy / "artifacts" / "t001" / "files").rglob("*.md"))
    art.write_text("tampered\n")
    again = grade_wave(copy)
    by = {g["task_id"]: g for g in again["tasks"]}
    assert all(g["checks"]["no_model_recall"]["verdict"] == "unknown" for g in again["tasks"])
    assert by["t001"]["checks"]["resume_equivalent"]["verdict"] == "unknown"
    assert "model-calls.jsonl" in by["t000"]["inputs"]["unreadable"]
    assert again["verdict"] == "unknown" and exit_code(again) == 2
    # a log that lost whole lines (crash, disk full) is caught by the driver's counts: unknown, never pass
    (copy / "model-calls.jsonl").write_bytes(b"\n".join(calls[:4]) + b"\n")
    again = grade_wave(copy)
    assert all(g["checks"]["no_model_recall"]["verdict"] == "unknown" for g in again["tasks"])
    assert exit_code(again) == 2
    for bad in (b"{broken\n", b"[1, 2]\n", b'{"no_event": 1}\n'):
        (copy / "timeline.jsonl").write_bytes(bad + (d / "timeline.jsonl").read_bytes())
        cli = subprocess.run([sys.executable, "-m", "cluster.cli", "grade", str(copy)], capture_output=True,
                             text=True)
        assert cli.returncode == 2 and "timeline.jsonl line 1" in cli.stderr, cli.stderr
        assert "Traceback" not in cli.stderr


def test_durable_survives_puts_cut_after_their_head(run_wave):
    """ST6 on every task: each task's next PUT after the planned time is cut after its head (receipt
    `applied`, naming the key); the durable runner retries, verifies what it reads back, and passes."""
    # armed right after a model answer (a boundary): armed by the clock, a task that ended first got no cut
    result, d = run_wave(runner="durable", tasks=4, concurrency=2, faults=["ST6"], seed=5,
                         fault_timing={"ST6": {"after_model_calls": [2, 4]}},
                         workload={"steps": 8, "think_ms": 100}, deadline_s=90)
    receipts = orjson.loads((d / "faults.json").read_bytes())
    assert len(receipts) == 4 and all(r["status"] == "applied" and r["evidence"]["keys"] for r in receipts)
    bad = {g["task_id"]: g["signature"] or g["verdict"] for g in result["tasks"] if g["verdict"] != "pass"}
    assert not bad, bad


def test_durable_survives_a_kill_inside_a_storage_outage(run_wave):
    """ST1+PK1 on one task: the kill lands inside the outage's window, while the runner is retrying its store
    calls; both receipts are applied and durable still passes."""
    # the outage is armed right after the runner's 2nd or 3rd model answer (armed at a clock time it could meet
    # the runner's start-up listing, and a kill then is rightly `not_exercised`); it opens at the task's next
    # store request and lasts 4 s, and the kill comes 0.1-0.6 s into it: a margin of 3.4 s for a loaded host
    result, d = run_wave(runner="durable", tasks=3, concurrency=3, faults=["ST1+PK1"], seed=13,
                         fault_timing={"ST1": {"after_model_calls": [2, 3], "window_s": [4.0, 4.0]}},
                         workload={"steps": 8, "think_ms": 200}, deadline_s=90)
    receipts = orjson.loads((d / "faults.json").read_bytes())
    assert sorted(r["fault_id"] for r in receipts) == ["PK1"] * 3 + ["ST1"] * 3
    for r in receipts:
        assert r["status"] == "applied", r
        if r["fault_id"] == "PK1":
            assert "s into the" in r["detail"] and "outage" in r["detail"], r["detail"]
    bad = {g["task_id"]: g["signature"] or g["verdict"] for g in result["tasks"] if g["verdict"] != "pass"}
    assert not bad, bad
    assert "ST1@model_call+PK1@during" in (d / "SUMMARY.md").read_text()


def test_clock_timed_faults_say_what_they_hit(run_wave):
    """The clock triggers themselves (PK1 `at_s` from the runner's start, ST1 armed at `at_s` after launch): where
    in the run they land is the clock's, so only their receipts are asserted: applied, or not_applied with the
    reason; a kill that landed is graded on what it hit (pass, or not_exercised when it came before the runner's
    first durable act), never `fail`."""
    result, d = run_wave(runner="durable", tasks=2, concurrency=2, faults=["PK1", "ST1"], seed=3,
                         fault_timing={"PK1": {"at_s": [0.2, 1.0]}, "ST1": {"at_s": [0.2, 1.0]}},
                         workload={"steps": 6, "think_ms": 100}, deadline_s=90)
    plan = orjson.loads((d / "plan.json").read_bytes())
    assert sorted(f["trigger"] for t in plan["tasks"] for f in t["faults"]) == ["time", "time"]
    for r in orjson.loads((d / "faults.json").read_bytes()):
        if r["status"] == "not_applied":
            assert any(w in r["detail"] for w in ("before the planned time", "never opened", "before the kill landed",
                                                  "no running sandbox")), r
        else:
            assert r["status"] == "applied" and r["fired_at"], r
    for g in result["tasks"]:
        assert g["verdict"] in ("pass", "not_applied"), (g["task_id"], g["signature"], g["checks"])
        assert g["checks"]["resume_equivalent"]["verdict"] == "pass", g["checks"]["resume_equivalent"]
