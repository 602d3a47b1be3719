"""Grading on synthetic histories, including the detection the negative controls rely on."""
from cluster.grade import FAIL, NOT_APPLIED, PASS, UNKNOWN, TaskHistory, grade_task, merge
from fleet import workloads
from fleet.workloads.base import tree_digest
from tests.unit.test_workload import apply_script

WL = workloads.get("patch-repo")
SEED, STEPS = 7, 8
TASK = {"task_id": "t000", "seed": SEED, "runner": "x", "workload": "patch-repo", "steps": STEPS,
        "faults": [{"fault_id": "PK1", "instance": "t000-PK1"}]}
KILLED_AT = 100.0
EVENTS = [{"event": "attempt_start", "attempt": 1, "wall": 90.0},
          {"event": "attempt_end", "attempt": 1, "exit_code": -9, "ended_at": KILLED_AT},
          {"event": "attempt_start", "attempt": 2, "wall": 101.0},
          {"event": "attempt_end", "attempt": 2, "exit_code": 0, "ended_at": 120.0},
          {"event": "task_end", "state": "done"}]
RECEIPT = [{"task_id": "t000", "instance": "t000-PK1", "status": "applied", "detail": "ok"}]
EFFECTS = [{"t": 91.0 + step, "effect_id": eid, "step": step, "deduped": False, "attempt": 1}
           for eid, step in WL.effect_steps(SEED, STEPS).items()]


def call(step, t, attempt, delivered=True):
    return {"step": step, "t": t, "t_done": t + 0.1, "attempt": attempt, "tokens": 10, "delivered": delivered}


def one_pass():
    return [call(s, 90.5 + s, 1) for s in range(STEPS + 1)]


def hist(artifact=None, calls=None, effects=None, writes=None, events=EVENTS, receipts=RECEIPT, ref=None):
    art = apply_script(SEED, STEPS) if artifact is None else artifact
    return TaskHistory(task=TASK, events=events, receipts=receipts, calls=one_pass() if calls is None else calls,
                       effects=EFFECTS if effects is None else effects, writes=writes or [], requests=writes or [],
                       artifact=art,
                       reference=ref or {"digest": tree_digest(apply_script(SEED, STEPS))})


def test_merge_order():
    assert merge([PASS, NOT_APPLIED]) == NOT_APPLIED
    assert merge([PASS, NOT_APPLIED, UNKNOWN]) == UNKNOWN
    assert merge([UNKNOWN, FAIL, PASS]) == FAIL
    assert merge([]) == PASS


def test_reference_artifact_passes():
    g = grade_task(hist())
    assert g["verdict"] == PASS, g["checks"]


def test_double_apply_in_the_workspace_is_caught():
    step = next(s.step for s in WL.script(SEED, STEPS) if s.kind == "workspace" and s.step > 0)
    g = grade_task(hist(artifact=apply_script(SEED, STEPS, twice=(step,))))
    assert g["checks"]["no_double_apply"]["verdict"] == FAIL
    assert g["checks"]["no_double_apply"]["applied_twice"] == [step]
    assert g["checks"]["resume_equivalent"]["verdict"] == FAIL
    assert g["verdict"] == FAIL and "no_double_apply" in g["signature"]


def test_double_external_effect_is_caught_and_a_deduped_retry_is_not():
    e = EFFECTS[0]
    g = grade_task(hist(effects=EFFECTS + [dict(e, t=e["t"] + 20, attempt=2)]))
    assert g["checks"]["no_double_apply"]["verdict"] == FAIL
    assert g["checks"]["no_double_apply"]["effects_applied_twice"] == [e["effect_id"]]
    g = grade_task(hist(effects=EFFECTS + [dict(e, t=e["t"] + 20, attempt=2, deduped=True)]))
    assert g["checks"]["no_double_apply"]["verdict"] == PASS


def test_the_answer_in_flight_at_the_kill_is_forgiven():
    calls = [call(s, 90.5 + s, 1) for s in range(4)] + [call(s, 102 + s, 2) for s in range(3, STEPS + 1)]
    g = grade_task(hist(calls=calls))
    c = g["checks"]["no_model_recall"]
    assert c["verdict"] == PASS and c["forgiven_in_flight"] == 1 and c["wasted_calls"] == 1


def test_a_reask_after_a_recorded_step_fails_even_with_no_answer_in_flight():
    # attempt 1 asked steps 0..3 and was killed while idle (no call in flight); attempt 2 re-asks 2 and 3
    calls = [call(s, 90.5 + s, 1) for s in range(4)] + [call(s, 102 + s, 2) for s in range(2, STEPS + 1)]
    g = grade_task(hist(calls=calls))
    c = g["checks"]["no_model_recall"]
    assert c["verdict"] == FAIL and c["model_recalls"] == 1 and "moved on to step 3" in c["detail"]


def test_a_reask_after_the_step_wrote_to_the_store_fails():
    calls = [call(s, 90.5 + s, 1) for s in range(4)] + [call(s, 102 + s, 2) for s in range(3, STEPS + 1)]
    g = grade_task(hist(calls=calls, writes=[{"t": 93.9, "key": "w/t000/journal/0003.json"}]))
    assert g["checks"]["no_model_recall"]["verdict"] == FAIL
    assert "journal/0003" in g["checks"]["no_model_recall"]["detail"]


def test_a_write_the_store_committed_only_after_the_reask_is_forgiven():
    # attempt 1 journaled step 3 just before the kill, but the store answered that PUT only after attempt 2 had
    # looked and asked again (a slow first write): no runner could have seen it
    calls = [call(s, 90.5 + s, 1) for s in range(4)] + [call(s, 102 + s, 2) for s in range(3, STEPS + 1)]
    late = {"t": 93.9, "ms": 8500.0, "key": "w/t000/journal/0003.json"}  # committed at 102.4, asked again at 105
    assert grade_task(hist(calls=calls, writes=[late]))["checks"]["no_model_recall"]["verdict"] == FAIL
    later = dict(late, ms=12000.0)  # committed at 105.9, after the re-ask
    c = grade_task(hist(calls=calls, writes=[later]))["checks"]["no_model_recall"]
    assert c["verdict"] == PASS and c["forgiven_in_flight"] == 1


def test_a_reask_after_the_steps_effect_fails():
    step = min(WL.effect_steps(SEED, STEPS).values())
    calls = [call(s, 90.5 + s, 1) for s in range(step + 1)] + [call(s, 102 + s, 2) for s in range(step, STEPS + 1)]
    g = grade_task(hist(calls=calls))
    assert g["checks"]["no_model_recall"]["verdict"] == FAIL


def test_not_deterministic_is_unknown_never_pass_or_fail():
    other = apply_script(SEED, STEPS)
    other["README.md"] += b"random\n"
    events = [EVENTS[2], dict(EVENTS[3], attempt=2), EVENTS[4]]
    g = grade_task(hist(artifact=other, events=events, receipts=[dict(RECEIPT[0], status="not_applied")]))
    assert g["checks"]["resume_equivalent"]["verdict"] == UNKNOWN
    assert "not deterministic" in g["checks"]["resume_equivalent"]["detail"]


def _damaged():
    """The reference's artifact with one line of src/app.py lost (DF1 left a file short, the hostile find)."""
    art = apply_script(SEED, STEPS)
    path = next(p for p in sorted(art) if p.endswith(".py") and art[p].count(b"\n") > 1)
    lines = art[path].split(b"\n")
    lost = lines.pop(1)
    return dict(art, **{path: b"\n".join(lines)}), path, lost.decode()


DF1 = [{"task_id": "t000", "instance": "t000-DF1", "status": "applied", "detail": "ok"}]
DF1_TASK = dict(TASK, faults=[{"fault_id": "DF1", "instance": "t000-DF1"}])
NOT_KILLED = [EVENTS[2], dict(EVENTS[3], attempt=2), EVENTS[4]]


def _ref(second=None, **extra):
    files = apply_script(SEED, STEPS)
    ref = {"digest": tree_digest(files), "files": files, "task_id": "ref-t000", **extra}
    if second is not None:
        ref.update(second=second, second_id="ref-t000-b")
    return ref


def test_a_task_a_fault_met_but_never_killed_is_not_an_uninterrupted_run():
    """The hostile find: a DF1 task lost `def main(): return 46` and was called `unknown` (not deterministic), since
    a task never killed counted as a second uninterrupted run. With two references that agree: fail, the lines
    named."""
    art, path, lost = _damaged()
    h = hist(artifact=art, events=NOT_KILLED, receipts=DF1, ref=_ref(second=apply_script(SEED, STEPS)))
    h.task = DF1_TASK
    c = grade_task(h)["checks"]["resume_equivalent"]
    assert c["verdict"] == FAIL and c["damaged"] == [path], c
    assert f"{path} lost: {lost.strip()}"[:60] in c["detail"].replace(lost, lost.strip()), c["detail"]
    h.reference = _ref()  # no second run: still a fail (damage is not assumed to be noise), lines named
    c = grade_task(h)["checks"]["resume_equivalent"]
    assert c["verdict"] == FAIL and path in c["detail"] and "no second" in c["detail"]


def test_two_references_that_differ_where_the_task_differs_are_unknown():
    stamped = dict(apply_script(SEED, STEPS), BUILD_INFO=b"built at 1\n")
    ref = _ref(second=dict(apply_script(SEED, STEPS), BUILD_INFO=b"built at 2\n"))
    ref["files"] = dict(ref["files"], BUILD_INFO=b"built at 0\n")
    ref["digest"] = tree_digest(ref["files"])
    c = grade_task(hist(artifact=stamped, ref=ref))["checks"]["resume_equivalent"]
    assert c["verdict"] == UNKNOWN and "not deterministic" in c["detail"] and "BUILD_INFO" in c["detail"], c
    assert "volatile" in c["detail"]
    # the same runner that also damaged another file: a fail naming only the damage
    art, path, _ = _damaged()
    c = grade_task(hist(artifact=dict(art, BUILD_INFO=b"x\n"), ref=ref))["checks"]["resume_equivalent"]
    assert c["verdict"] == FAIL and c["damaged"] == [path] and c["not_deterministic"] == ["BUILD_INFO"], c


def test_a_declared_volatile_path_is_left_out_and_shown():
    stamped = dict(apply_script(SEED, STEPS), BUILD_INFO=b"built at 1\n")
    h = hist(artifact=stamped, ref=_ref())
    h.volatile = [{"glob": "BUILD_*", "why": "a build stamp"}]
    c = grade_task(h)["checks"]["resume_equivalent"]
    assert c["verdict"] == PASS and c["volatile"] == {"BUILD_INFO": "a build stamp"} and "BUILD_INFO" in c["detail"]
    h.volatile = [{"glob": "*.md", "why": "docs"}]
    assert grade_task(h)["checks"]["resume_equivalent"]["verdict"] == FAIL


def test_a_diff_line_is_escaped():
    from cluster.grade.diff import describe

    got = {"a": b"ok\n\x1b]52;c;SGVsbG8=\x07\n"}
    out = describe(got, {"a": b"ok\n"}, ["a"])
    assert "\x1b" not in "".join(out) and "\\x1b" in "".join(out)


def test_exit_0_without_the_steps_fails_completed():
    g = grade_task(hist(artifact={p: t.encode() for p, t in WL.fixture(SEED).items()}))
    assert g["checks"]["completed"]["verdict"] == FAIL and "without doing every step" in \
        g["checks"]["completed"]["detail"]


def test_fault_not_applied_is_not_a_pass():
    g = grade_task(hist(receipts=[dict(RECEIPT[0], status="not_applied")]))
    assert g["verdict"] == NOT_APPLIED
    g = grade_task(hist(receipts=[]))
    assert g["verdict"] == UNKNOWN  # no receipt at all


def test_missing_reference_is_unknown():
    g = grade_task(hist(ref={"why": "the reference run did not complete"}))
    assert g["checks"]["resume_equivalent"]["verdict"] == UNKNOWN


def test_missing_artifact_and_missing_history():
    h = hist()
    h.artifact = None
    g = grade_task(h)
    assert g["checks"]["completed"]["verdict"] == FAIL
    g = grade_task(hist(events=[]))
    assert g["verdict"] == UNKNOWN


def test_a_crashing_check_is_unknown():
    g = grade_task(hist(calls=[{"step": "x"}, {"step": "x"}]))
    assert g["checks"]["no_model_recall"]["verdict"] == UNKNOWN
    assert g["verdict"] == UNKNOWN


def test_an_unreadable_artifact_is_unknown_never_fail():
    h = hist()
    h.artifact, h.artifact_error = None, "files/README.md: content does not match its recorded sha256"
    g = grade_task(h)
    assert g["checks"]["completed"]["verdict"] == UNKNOWN
    assert g["checks"]["resume_equivalent"]["verdict"] == UNKNOWN
    assert g["verdict"] == UNKNOWN


def test_work_that_did_not_come_from_the_model_fails_completed():
    """A runner that computes the steps itself (never asks the model) must not pass."""
    g = grade_task(hist(calls=[call(STEPS, 90.5, 1)]))  # only the final call
    c = g["checks"]["completed"]
    assert c["verdict"] == FAIL and c["steps_never_answered"] and "did not come from the model" in c["detail"]


def test_an_idempotency_key_reused_for_another_effect_swallows_it():
    first, second = EFFECTS[0], EFFECTS[1]
    swallowed = dict(second, deduped=True, same_effect_as_key=False)
    g = grade_task(hist(effects=[first, swallowed]))
    c = g["checks"]["completed"]
    assert c["verdict"] == FAIL and second["step"] in c["missing_effects"] and "swallowed" in c["detail"]


def test_a_kill_before_the_attempt_did_anything_durable_is_not_exercised():
    events = [dict(e, sandbox=f"t000-a{e['attempt']}") if e.get("attempt") else e for e in EVENTS]
    # attempt 1 started at 90.0; its first answer is delivered at 90.6: a kill at 90.3 tested nothing
    early = [{"task_id": "t000", "instance": "t000-PK1", "fault_id": "PK1", "status": "applied", "detail": "kill",
              "target": {"sandbox_id": "t000-a1"}, "fired_at": 90.3}]
    g = grade_task(hist(events=events, receipts=early))
    c = g["checks"]["fault_applied"]
    assert c["verdict"] == NOT_APPLIED and "not_exercised" in c["detail"] and g["not_exercised"] == ["t000-PK1"]
    late = [dict(early[0], fired_at=92.0)]  # after answers were delivered to attempt 1
    g = grade_task(hist(events=events, receipts=late))
    assert g["checks"]["fault_applied"]["verdict"] == PASS and g["not_exercised"] == []


def test_a_write_outside_its_prefix_fails_the_writer_and_a_damaged_victim_is_unknown():
    h = hist()
    h.foreign_writes = [{"t": 95.0, "method": "PUT", "key": "w/t001/journal/0000.json", "status": 403, "by": "t000"}]
    g = grade_task(h)
    c = g["checks"]["no_foreign_writes"]
    assert c["verdict"] == FAIL and "1 refused" in c["detail"] and "no_foreign_writes" in g["signature"]
    clean = hist()
    clean.foreign_writes = []
    assert grade_task(clean)["checks"]["no_foreign_writes"]["verdict"] == PASS
    assert "no_foreign_writes" not in grade_task(hist())["checks"]  # not attributable: no such check
    victim = hist(artifact={})  # its artifact was destroyed...
    victim.damaged_by = [{"t": 95.0, "method": "PUT", "key": "w/t000/x", "status": 200, "by": "t001"}]
    g = grade_task(victim)  # ...by another task's applied write: not this runner's failure
    assert g["verdict"] == UNKNOWN and "damaged by task t001" in g["checks"]["completed"]["detail"]


# ---------------------------------------------------------------- universal checks
def _attempts(causes: list[tuple[int, str | None]], start=90.0, each=5.0) -> list[dict]:
    """attempt_start/attempt_end events for attempts ending with (exit_code, cause); the last exits 0."""
    ev, t = [], start
    for i, (code, cause) in enumerate(causes + [(0, "exit 0")], 1):
        ev.append({"event": "attempt_start", "attempt": i, "wall": t, "sandbox": f"s{i}"})
        ev.append({"event": "attempt_end", "attempt": i, "exit_code": code, "ended_at": t + each, "cause": cause,
                   "sandbox": f"s{i}"})
        t += each + 0.5
    return ev + [{"event": "task_end", "state": "done", "wall": t}]


def _calls_over(events) -> list[dict]:
    """One model call per second through every attempt (a live runner)."""
    out = []
    for e in events:
        if e["event"] == "attempt_start":
            end = next(x["ended_at"] for x in events if x["event"] == "attempt_end" and x["attempt"] == e["attempt"])
            t = e["wall"]
            while t < end:
                out.append(call(0, t, e["attempt"]))
                t += 1.0
    return out


def test_a_silent_failed_attempt_is_not_diagnosable_and_one_that_says_why_is():
    ev = _attempts([(1, "exit 1")])
    g = grade_task(hist(events=ev, calls=_calls_over(ev) + one_pass(), receipts=[]))
    assert g["checks"]["diagnosable"]["verdict"] == FAIL and g["checks"]["diagnosable"]["silent_attempts"] == [1]
    h = hist(events=ev, calls=_calls_over(ev) + one_pass(), receipts=[])
    h.log_tails = {1: "runner failed: ClientError: AccessDenied"}
    assert grade_task(h)["checks"]["diagnosable"]["verdict"] == PASS
    h = hist(events=ev, calls=_calls_over(ev) + one_pass(), receipts=[],
             writes=[{"t": 92.0, "method": "PUT", "key": "k", "status": 503}])
    assert grade_task(h)["checks"]["diagnosable"]["verdict"] == PASS  # a store error answered to it
    # a 404 (the first read of a journal record that is not there yet) or a 409 explains no exit; nor does a 503
    # long before the exit; a reset (no answer) near the exit does
    for rows, verdict in (([{"t": 94.0, "method": "GET", "key": "j/1", "status": 404},
                            {"t": 94.5, "method": "PUT", "key": "k", "status": 409}], FAIL),
                          ([{"t": 60.0, "method": "PUT", "key": "k", "status": 503}], FAIL),
                          ([{"t": 94.0, "method": "PUT", "key": "k", "status": None, "aborted": True}], PASS),
                          ([{"t": 94.0, "method": "GET", "key": "k", "status": 403}], PASS)):
        h = hist(events=ev, calls=_calls_over(ev) + one_pass(), receipts=[], writes=rows)
        assert grade_task(h)["checks"]["diagnosable"]["verdict"] == verdict, rows
    for cause in ("killed: PK1 (SIGKILL)", "OOM kill: the memory limit (512 MiB) was reached"):
        g = grade_task(hist(events=_attempts([(1, cause)]), receipts=[]))
        assert g["checks"]["diagnosable"]["verdict"] == PASS, cause


def test_the_same_failure_more_than_n_times_in_a_row_is_a_retry_loop():
    ev = _attempts([(1, "exit 1")] * 4)
    h = hist(events=ev, calls=_calls_over(ev) + one_pass(), receipts=[])
    h.limits = {"retry_loop_n": 3}
    assert grade_task(h)["checks"]["retry_loop"]["verdict"] == FAIL
    h.limits = {"retry_loop_n": 4}
    assert grade_task(h)["checks"]["retry_loop"]["verdict"] == PASS
    # kills by the harness are not the runner's loop
    ev = _attempts([(-9, "killed: PK4 crash loop")] * 5)
    h = hist(events=ev, calls=_calls_over(ev) + one_pass(), receipts=[])
    assert grade_task(h)["checks"]["retry_loop"]["verdict"] == PASS
    # one request answered with the same error over and over with no fault injected
    reqs = [{"t": 91 + i * 0.01, "method": "GET", "key": "k", "status": 403} for i in range(60)]
    h = hist(receipts=[], writes=reqs)
    assert grade_task(h)["checks"]["retry_loop"]["verdict"] == FAIL
    # inside a fault window, a failure answered over and over is the fault's, as long as the runner backs off
    backoff = [{"t": 91 + i * 0.2, "method": "GET", "key": "k", "status": 503, "fault": "ST1"} for i in range(40)]
    h = hist(receipts=[], writes=backoff)
    assert grade_task(h)["checks"]["retry_loop"]["verdict"] == PASS


def test_a_retry_storm_fails_retry_loop_inside_a_fault_window_too():
    """The same failing request retried at once: at least 20 in a row at more than 20/s in one attempt, whether a
    fault answered them (an outage is what starts a storm) or not; backoff, a short run or runs split by a success
    pass."""
    storm = [{"t": 91 + i * 0.004, "method": "PUT", "key": "w/t000/j/3", "status": 503, "fault": "ST1"}
             for i in range(59)]
    c = grade_task(hist(receipts=[], writes=storm))["checks"]["retry_loop"]
    assert c["verdict"] == FAIL and c["storm"]["requests"] == 59 and c["storm"]["per_s"] > 200, c
    assert "59 times in a row" in c["detail"] and "no backoff" in c["detail"]
    resets = [dict(r, status=None, aborted=True) for r in storm]  # no answer at all, retried at once
    assert grade_task(hist(receipts=[], writes=resets))["checks"]["retry_loop"]["verdict"] == FAIL
    for rows in ([dict(r, t=91 + i * 0.1) for i, r in enumerate(storm)],  # 10/s: backed off
                 storm[:19],  # too short to tell
                 storm[:15] + [dict(storm[15], status=200)] + storm[16:30],  # a success splits the run
                 # a runner sleeping 60 ms whose calls the proxy logged twice (gaps of 63 ms and 5 ms): 29/s over
                 # the run, but half its gaps are 63 ms: it backs off
                 [dict(r, t=91 + (i // 2) * 0.068 + (i % 2) * 0.005) for i, r in enumerate(storm[:40])]):
        assert grade_task(hist(receipts=[], writes=rows))["checks"]["retry_loop"]["verdict"] == PASS, rows[:2]


def test_a_hung_attempt_fails_liveness():
    ev = _attempts([(-9, "killed: deadline")], each=45.0)
    calls = [call(0, 90.5, 1)] + [c for c in _calls_over(ev) if c["attempt"] == 2]
    h = hist(events=ev, calls=calls + one_pass(), receipts=[])
    live = grade_task(h)["checks"]["liveness"]
    assert live["verdict"] == FAIL and live["longest_silence_s"] > 30, live
    h.limits = {"liveness_s": 60}
    assert grade_task(h)["checks"]["liveness"]["verdict"] == PASS


def test_a_silence_on_an_overloaded_host_is_unknown_not_a_hang():
    """A runner starved of CPU (the host ran far more runnable tasks than cores through its silence) cannot be
    told from a hung one: liveness is unknown. The same silence on a quiet host stays a failure."""
    ev = _attempts([(-9, "killed: deadline")], each=45.0)
    calls = [call(0, 90.5, 1)] + [c for c in _calls_over(ev) if c["attempt"] == 2]
    h = hist(events=ev, calls=calls + one_pass(), receipts=[])
    h.host_load = [{"t": 90.0 + i * 0.5, "running": 40, "cores": 2} for i in range(200)]
    live = grade_task(h)["checks"]["liveness"]
    assert live["verdict"] == UNKNOWN and "overloaded (40 runnable tasks on 2 cores" in live["detail"], live
    h.host_load = [{"t": 90.0 + i * 0.5, "running": 3, "cores": 2} for i in range(200)]
    assert grade_task(h)["checks"]["liveness"]["verdict"] == FAIL
    h.host_load = [{"t": 10.0 + i * 0.5, "running": 40, "cores": 2} for i in range(20)]  # load elsewhere only
    assert grade_task(h)["checks"]["liveness"]["verdict"] == FAIL


def test_running_out_of_attempts_fails_the_budget():
    ev = _attempts([(1, "exit 1")] * 2)[:-2] + [{"event": "task_end", "state": "failed", "wall": 200.0,
                                                  "why": "max_attempts 2 reached"}]
    h = hist(events=ev, receipts=[])
    h.limits = {"max_attempts": 2}
    assert grade_task(h)["checks"]["attempt_budget"]["verdict"] == FAIL


def test_redact_removes_every_key_shape_the_harness_hands_out_and_keeps_digests():
    import secrets

    from cluster.grade import redact

    for _ in range(50):
        model, s3 = "sf-" + secrets.token_urlsafe(24), secrets.token_urlsafe(30)
        text = (f"OPENAI_API_KEY={model}\nAuthorization: Bearer {model}\n{{\"SecretAccessKey\": \"{s3}\"}}\n"
                f"raw {s3} and {model}.\n")
        out = redact(text)
        assert model not in out and s3 not in out, out
    digest = "ab" * 32
    assert redact(f"sha256 {digest} step 3 exit 1") == f"sha256 {digest} step 3 exit 1"


def test_known_secret_values_are_redacted_even_cut_glued_or_repeated():
    import secrets

    from cluster.grade import redact

    model, s3 = "sf-" + secrets.token_urlsafe(24), secrets.token_urlsafe(30)
    text = (f"{model[1:]}\nk{model}{model}\nobject key w/t000/x{s3}\ns3{s3}!\n"
            f"half {s3[:20]}\n")
    out = redact(text, (model, s3))
    for piece in (model[1:], model[4:20], s3, s3[:20], s3[8:30]):
        assert piece not in out, (piece, out)
    assert "object key w/t000/x" in out and "half " in out


def test_encoded_forms_of_an_issued_secret_are_redacted_too():
    import base64
    from urllib.parse import quote

    from cluster.grade.evidence import redact

    key = "sf-" + "Ab3_x9" * 5 + "Zq"
    store = "Qw7-Er8_Ty9" * 3 + "Uio7890"
    for shown in (key, key[::-1], base64.b64encode(key.encode()).decode(), base64.urlsafe_b64encode(
            store.encode()).decode().rstrip("="), store.encode().hex(), store.encode().hex().upper(), quote(store)):
        out = redact(f"env: {shown} end", (key, store))
        assert shown not in out and "<redacted>" in out, (shown, out)
    assert redact("sha256 of step 3 is 9f2c", (key, store)) == "sha256 of step 3 is 9f2c"


def test_raw_runner_logs_lose_the_issued_secrets_and_nothing_else(tmp_path):
    """The grader reads the raw logs after they are redacted: only issued secrets go (by value, in every form),
    never text that merely looks like a key (a 40-character word, `TOKEN_REFRESH: connection_refused`)."""
    import base64

    from cluster import results
    from cluster.grade.evidence import redact_runner_logs

    key = "sf-" + "Ab3_x9" * 5 + "Zq"
    log = tmp_path / results.SANDBOXES / "t000-a1" / results.RUNNER_LOG
    log.parent.mkdir(parents=True)
    kept = (b"TOKEN_REFRESH: connection_refused\napi_key_check: denied\nupload_failed_because_connection_refused\n"
            b"total tokens: 123456\n\xff a byte that is not UTF-8\n")
    log.write_bytes(kept + f"OPENAI_API_KEY={key}\n{base64.b64encode(key.encode()).decode()}\n".encode())
    assert redact_runner_logs(results.ResultsDir(tmp_path), (key,)) == 1
    data = log.read_bytes()
    assert data.startswith(kept) and key.encode() not in data and data.count(b"<redacted>") == 2, data


def test_a_plan_of_the_wrong_shape_is_unreadable_naming_what_is_wrong(tmp_path):
    import shutil
    from pathlib import Path

    import orjson
    import pytest

    from cluster.grade import Unreadable, grade_wave

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "wave-before-results-py"
    d = tmp_path / "w"
    shutil.copytree(fixture, d, symlinks=True)
    (d / "plan.json").write_bytes(b"[1, 2]")
    with pytest.raises(Unreadable, match="plan.json: not a wave plan: a JSON list"):
        grade_wave(d)
    plan = orjson.loads((fixture / "plan.json").read_bytes())
    del plan["tasks"][0]["seed"]
    (d / "plan.json").write_bytes(orjson.dumps(plan))
    with pytest.raises(Unreadable, match=r"tasks\[0\] \(t000\) has no seed"):
        grade_wave(d)


def test_a_sandbox_node_whose_scan_did_not_answer_makes_no_leaked_sandbox_unknown():
    """Nothing seen on a node that could not be looked at proves nothing absent there: unknown, never pass."""
    from types import SimpleNamespace

    from cluster.grade.wave import leaks_of, wave_checks_of

    def checks(sweeper: dict, plan: dict | None = None) -> str:
        w = SimpleNamespace(sweep={"leaked": [], "problems": []}, audit={"incomplete_uploads": []}, hfault=None,
                            plan=plan or {}, sweeper=dict({"reaped": [], "left_at_end": [], "errors": []}, **sweeper),
                            inp=SimpleNamespace(unreadable={}))
        return wave_checks_of(w, leaks_of(w), [], [])["no_leaked_sandbox"]

    assert checks({"nodes_scanned": ["node-1", "node-2"], "unanswered_nodes": {}}) == "pass"
    assert checks({"nodes_scanned": ["node-1", "node-2"], "unanswered_nodes": {"node-2": "ActorDiedError"}}) == \
        "unknown"
    # containers not listed (a stopped docker engine beside the wave) leave a docker wave open, and a wave of unknown
    # backend too; a process-backend wave makes no container, so its look is whole
    unlisted = {"errors": ["docker engine: containers at unix:///x were not listed (ConnectionRefusedError)"]}
    assert checks(unlisted, {"config": {"sandbox": {"backend": "docker"}}}) == "unknown"
    assert checks(unlisted, {"config": "garbage"}) == "unknown"
    assert checks(unlisted, {"config": {"sandbox": {"backend": "process"}}}) == "pass"


def test_a_silent_attempt_is_judged_by_its_own_nodes_load():
    """On nodes that are other machines each node's load is its own: a silence on node-1 while node-2 was
    overloaded is not starvation; rows with no node (one machine's) count for every node."""
    from types import SimpleNamespace

    from cluster.grade.runs import _starved

    events = [{"event": "attempt_start", "attempt": 1, "node": "node-1"}]
    worst = (40.0, 1, 100.0, 140.0)
    busy = [{"t": 100.0 + i, "running": 50, "cores": 2, "node": "node-2"} for i in range(40)]
    idle = [{"t": 100.0 + i, "running": 0, "cores": 2, "node": "node-1"} for i in range(40)]
    assert _starved(SimpleNamespace(host_load=busy + idle, events=events), worst, 30.0) is None
    hot = [dict(x, node="node-1") for x in busy]
    assert _starved(SimpleNamespace(host_load=hot, events=events), worst, 30.0)["verdict"] == "unknown"
    machine = [{k: v for k, v in x.items() if k != "node"} for x in busy]
    assert _starved(SimpleNamespace(host_load=machine, events=events), worst, 30.0)["verdict"] == "unknown"


def test_waiting_on_the_harness_is_not_silence():
    """Regression (a hostile user's find): a model call the endpoint took 39 s to answer, or a store request the
    proxy held (a throttle) as long, is the harness's time, not the runner's silence; the same span with no call
    in flight is a hang."""
    ev = _attempts([], each=45.0)  # one attempt, 90 -> 135
    slow = dict(call(0, 90.5, 1), t_done=130.0)
    h = hist(events=ev, calls=[slow, call(1, 131.0, 1)], receipts=[])
    assert grade_task(h)["checks"]["liveness"]["verdict"] == PASS, grade_task(h)["checks"]["liveness"]
    held = {"t": 90.6, "ms": 39000.0, "method": "PUT", "bucket": "b", "key": "k", "status": 200}
    h = hist(events=ev, calls=[call(0, 90.5, 1), call(1, 131.0, 1)], writes=[held], receipts=[])
    assert grade_task(h)["checks"]["liveness"]["verdict"] == PASS, grade_task(h)["checks"]["liveness"]
    h = hist(events=ev, calls=[call(0, 90.5, 1), call(1, 131.0, 1)], receipts=[])
    live = grade_task(h)["checks"]["liveness"]
    assert live["verdict"] == FAIL and live["longest_silence_s"] > 30, live


def test_an_attempt_the_harness_ended_on_an_overloaded_host_is_unknown_not_fail():
    """An attempt ended for its silence (or at the deadline) while its host ran far more runnable tasks than cores:
    what failed is `unknown`, the load named; on a quiet host the same history fails."""
    events = [{"event": "attempt_start", "attempt": 1, "wall": 90.0, "node": "node-0"},
              {"event": "attempt_end", "attempt": 1, "exit_code": -9, "ended_at": 100.0, "killed_by": "silent 3s"},
              {"event": "task_end", "state": "failed"}]
    quiet = [{"t": 90.0 + i, "running": 1, "cores": 2} for i in range(10)]
    busy = [{"t": 90.0 + i, "running": 40, "cores": 2} for i in range(10)]
    h = hist(events=events, calls=[call(s, 90.5 + s, 1) for s in range(2)], effects=[])
    h.host_load = quiet
    g = grade_task(h)
    assert g["verdict"] == FAIL and "overloaded" not in g
    h.host_load = busy
    g = grade_task(h)
    assert g["verdict"] == UNKNOWN and g["overloaded"]["attempt"] == 1 and g["overloaded"]["mean"] == 40
    assert "overloaded (40 runnable tasks on 2 cores" in g["checks"]["completed"]["detail"]


def test_a_diff_of_long_files_names_the_lines():
    """A hostile review's find: difflib's matching took 21 s on two 2,000-line files whose every line differs; the
    diff now counts lines (linear), and 20,000 such lines are still compared and named."""
    from cluster.grade.diff import describe

    a = {"f": "\n".join(f"line {i} a" for i in range(20000)).encode()}
    b = {"f": "\n".join(f"line {i} b" for i in range(20000)).encode()}
    out = describe(a, b, ["f"])
    assert "f lost: line 0 b" in out[0] and "(and 19994 more)" in out[0]


def test_a_delete_objects_is_attributed_by_the_keys_it_names():
    """A hostile review: boto3's delete_objects in the runner's own prefix (a bucket-level POST, key "") failed
    `no_foreign_writes` for the task and its reference. The proxy logs the keys it names: own keys are no foreign
    write, another task's are (and damage that task); a POST with no keys logged stays a foreign write."""
    from types import SimpleNamespace

    from cluster.grade.history import attribute

    def rec(keys, status=200):
        return {"t": 1.0, "method": "POST", "bucket": "b", "key": "", "akid": "K0", "status": status,
                **({"keys": keys} if keys is not None else {})}

    def of(*recs):
        w = SimpleNamespace(plan={"wave_id": "w"}, proxy=list(recs), audit={"bucket": "b"},
                            timeline=[{"event": "attempt_start", "akid": "K0", "task": "t000"}])
        return attribute(w)

    at = of(rec(["w/t000/a", "w/t000/b"]))
    assert not at.foreign and not at.damaged
    at = of(rec(["w/t000/a", "w/t001/x"]))
    assert [r["key"] for r in at.foreign["t000"]] == ["w/t001/x"] and list(at.damaged) == ["t001"]
    at = of(rec(None))  # an old wave's log, or one through the relay: not attributable by key
    assert list(at.foreign) == ["t000"]


def test_a_quota_refusal_counts_only_against_the_task_that_sent_it():
    """A hostile review: t000 wrote into t001's prefix, was refused by t001's quota, and t001 failed
    `within_store_quota` for it. Only writes signed by the task's own keys count; the other is t000's foreign write."""
    events = [dict(e, akid="OWN") if e["event"] == "attempt_start" else e for e in EVENTS]
    q = {"max_objects": 1, "max_bytes": 1, "objects": 1, "bytes": 1}
    own = {"t": 95.0, "method": "PUT", "key": "w/t000/x", "status": 403, "code": "QuotaExceeded", "akid": "OWN",
           "quota": q}
    h = hist(events=events)
    h.limits = {"store_quota": 1}
    h.requests = [dict(own, akid="NEIGHBOUR")]
    assert grade_task(h)["checks"]["within_store_quota"]["verdict"] == PASS
    h.requests = [own]
    assert grade_task(h)["checks"]["within_store_quota"]["verdict"] == FAIL
