"""The checks of a task's grade: one function per check, `(history, facts) -> result`, and the registry that says
which apply to a task.

`Facts` holds what every check derives once from the task's history (its attempts, its end, the key ids each
attempt held, ...). A check returns a dict with `verdict` (pass / fail / unknown / not_applied) and `detail`, plus
its own evidence; `cluster/grade.py` runs each through a check-safe wrapper (a crashed check is `unknown`).
Which checks apply is decided by the task (a reference has no resume or fault check), the workload (multi-file
applies), the wave's inputs (the store audit, per-attempt keys) and the fault catalog's attributes
(`kills_attempt`, `takes_node`, `adds_checks`), never by a fault id.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from cluster import results
from faults import CATALOG

if TYPE_CHECKING:
    from cluster.grade import TaskHistory

from cluster.verdicts import (ERROR_WORDS, FAIL, NOT_APPLIED, OVERLOAD_PER_CORE, PASS, UNKNOWN, WRITE_METHODS,
                              merge)


def _fault(fault_id: str | None):
    return CATALOG.get(fault_id or "")


def kills_attempt(fault_id: str | None) -> bool:
    """One kill of the task's running attempt at a moment of the runner (PK1, PK2, PK5): a kill that landed before
    the attempt did anything durable tested nothing."""
    return bool(getattr(_fault(fault_id), "kills_attempt", False))


def takes_node(fault_id: str | None) -> bool:
    return bool(getattr(_fault(fault_id), "takes_node", False))


def adds_check(fault_id: str | None, check: str) -> bool:
    return check in (getattr(_fault(fault_id), "adds_checks", ()) or ())


def _cause(a: dict) -> str:
    return a.get("cause") or f"exit {a.get('exit_code')}"


@dataclass
class Facts:
    """What every check derives once from a task's history."""

    task: dict
    tid: str
    wl: object
    script: list
    attempts: list[dict]
    end: dict | None
    interrupted: list[dict]
    is_ref: bool
    starts: dict
    by_attempt: dict
    akids: dict[int, set]
    dead_keys: dict
    fault_kills: set

    @classmethod
    def of(cls, h: "TaskHistory") -> "Facts":
        from fleet import workloads

        task = h.task
        tid = task["task_id"]
        wl = workloads.get(task.get("workload", "patch-repo"))
        attempts = [e for e in h.events if e["event"] == "attempt_end"]
        by_attempt = {e["attempt"]: e for e in h.events if e["event"] == "attempt_start"}
        akids: dict[int, set] = {}  # attempt -> every key id it held (CR1 rotates one mid-attempt)
        for e in h.events:
            if e["event"] == "attempt_start" and e.get("akid"):
                akids.setdefault(e["attempt"], set()).add(e["akid"])
            elif e["event"] == "key_rotated":
                att = next((a for a, st in by_attempt.items() if st.get("sandbox") == e.get("sandbox")), None)
                if att is not None:
                    akids.setdefault(att, set()).update({e.get("akid"), e.get("old_akid")})
        return cls(
            task=task, tid=tid, wl=wl, script=wl.script(task["seed"], task["steps"]), attempts=attempts,
            end=next((e for e in h.events if e["event"] == "task_end"), None),
            interrupted=[a for a in attempts if a.get("exit_code") != 0],
            is_ref=task.get("role") == "reference",
            starts={e.get("sandbox"): e for e in h.events if e["event"] == "attempt_start"},
            by_attempt=by_attempt, akids=akids,
            # CR1: a key rotated at the store answers real 403s (no proxy rule tags them); requests signed with it
            # after its rotation are the fault's doing, not a runner's retry loop
            dead_keys={e.get("old_akid"): e["wall"] for e in h.events
                       if e["event"] == "key_rotated" and e.get("old_akid")},
            fault_kills={(r.get("target") or {}).get("sandbox_id") for r in h.receipts
                         if r["task_id"] == tid and r.get("status") == "applied"})

    def rotated_out(self, r: dict) -> bool:
        t = self.dead_keys.get(r.get("akid"))
        return t is not None and r["t"] >= t - 0.5

    def mine(self, r: dict, attempt: int, t0: float, t1: float) -> bool:
        ids = self.akids.get(attempt)
        return r.get("akid") in ids if ids else t0 <= r["t"] <= t1


def _ended_with_an_artifact(h: TaskHistory, facts: Facts) -> dict | None:
    """None when the task ended done with a whole, readable artifact; else `completed`'s answer."""
    attempts, end = facts.attempts, facts.end
    if end is None:
        return {"verdict": UNKNOWN, "detail": "no task_end in the timeline"}
    start_error = next((a["start_error"] for a in attempts if a.get("start_error")), None)
    if start_error:
        return {"verdict": FAIL, "detail": start_error}
    if end["state"] != "done":
        return {"verdict": FAIL, "detail": f"state={end['state']} ({end.get('why', '')})"}
    last = attempts[-1] if attempts else {}
    if h.artifact_error:
        return {"verdict": UNKNOWN, "detail": f"the captured artifact is unreadable: {h.artifact_error}"}
    if h.artifact is None:
        why = (last.get("artifact") or {}).get("why", "no artifact was captured")
        return {"verdict": FAIL, "detail": f"the runner exited 0 but {why}"}
    capped = (last.get("artifact") or {}).get("capped")
    if capped:  # the workspace was past a cap of the read-back (depth, files, bytes): not what a task leaves
        return {"verdict": FAIL, "detail": f"the runner exited 0 but {'; '.join(capped)}"}
    return None


def _every_step_done(h: TaskHistory, facts: Facts) -> dict | None:
    """None when every workspace step's marker and every effect of the script is there."""
    task, wl, script = facts.task, facts.wl, facts.script
    counts = wl.step_counts(h.artifact)
    multi = wl.done_steps(task["seed"], task["steps"], h.artifact) if hasattr(wl, "done_steps") else set()
    missing = [s.step for s in script if s.kind == "workspace" and s.step not in counts
               and not (s.files and s.step in multi)]
    # an effect counts when it was applied, or deduplicated against ITSELF (a key reused for another
    # effect swallows that effect: the service answered with the first one's receipt)
    applied_fx = {e["effect_id"] for e in (h.effects or [])
                  if not e.get("deduped") or e.get("same_effect_as_key")}
    swallowed = sorted({e["effect_id"] for e in (h.effects or []) if e.get("deduped")
                        and not e.get("same_effect_as_key")} - applied_fx)
    missing_fx = [s.step for s in script if s.kind == "effect" and s.arguments["effect_id"] not in applied_fx]
    if not (missing or missing_fx):
        return None
    extra = (f"; effects {swallowed} were swallowed by an Idempotency-Key reused from another effect"
             if swallowed else "")
    return {"verdict": FAIL, "missing_steps": missing, "missing_effects": missing_fx,
            "detail": f"the runner exited 0 without doing every step: workspace steps missing {missing}, "
                      f"effects missing for steps {missing_fx}{extra}"}


def _work_came_from_the_model(h: TaskHistory, facts: Facts) -> dict | None:
    """None when every step's answer was delivered to the task before its effect."""
    if h.calls is None:
        return {"verdict": UNKNOWN, "detail": "no readable model call log to check the steps came from the model"}
    given = {}
    for c in h.calls:
        if c.get("delivered", True) and c["step"] not in given:
            given[c["step"]] = c.get("t_done", c["t"])
    unasked = [s.step for s in facts.script if s.kind in ("workspace", "effect") and s.step not in given]
    early = sorted({e["step"] for e in (h.effects or []) if e.get("step") is not None
                    and (e["step"] not in given or e["t"] < given[e["step"]] - 0.05)})
    if not (unasked or early):
        return None
    return {"verdict": FAIL, "steps_never_answered": unasked, "effects_before_their_answer": early,
            "detail": f"the work did not come from the model: steps {unasked} were never answered to this "
                      f"task, effects of steps {early} came before their answer"}


def completed(h: TaskHistory, facts: Facts) -> dict:
    """The task ended done, its whole artifact has every step's marker and every effect is applied, and the work
    came from the model (each step answered to this task before its effect)."""
    for part in (_ended_with_an_artifact, _every_step_done, _work_came_from_the_model):
        got = part(h, facts)
        if got is not None:
            return got
    return {"verdict": PASS, "detail": "exited 0; every step was answered by the model and its change and "
                                       "effect are there"}


def resume_equivalent(h: TaskHistory, facts: Facts) -> dict:
    interrupted = facts.interrupted
    if h.artifact_error:
        return {"verdict": UNKNOWN, "detail": f"the captured artifact is unreadable: {h.artifact_error}"}
    if h.artifact is None:
        return {"verdict": FAIL, "detail": "no artifact was captured"}
    ref = h.reference or {}
    if "digest" not in ref:
        return {"verdict": UNKNOWN, "detail": f"no reference to compare with: {ref.get('why', 'none')}"}
    from fleet.workloads.base import tree_digest

    got = tree_digest(h.artifact)
    uninterrupted = set(ref.get("uninterrupted_digests", ())) | {ref["digest"]}
    if not interrupted:
        uninterrupted.add(got)
    if len(uninterrupted) > 1:
        return {"verdict": UNKNOWN, "expected": ref["digest"], "got": got,
                "detail": "the runner is not deterministic under a fixed model: two uninterrupted runs of "
                          "this seed left different artifacts"}
    same = got == ref["digest"]
    return {"verdict": PASS if same else FAIL, "expected": ref["digest"], "got": got,
            "detail": "same artifact as an uninterrupted run" if same else
            "artifact differs from an uninterrupted run of the same runner and seed"}


def no_double_apply(h: TaskHistory, facts: Facts) -> dict:
    wl = facts.wl
    twice, fx_twice = [], []
    if h.artifact is not None:
        counts = wl.step_counts(h.artifact)
        twice = sorted(s for s, n in counts.items() if n > 1)
    if h.effects is None:
        return {"verdict": UNKNOWN, "detail": "no readable effects log"}
    applied: dict[str, list] = {}
    for e in h.effects:
        if not e.get("deduped"):
            applied.setdefault(e["effect_id"], []).append(e)
    fx_twice = sorted(eid for eid, recs in applied.items() if len(recs) > 1)
    deduped = sum(1 for e in h.effects if e.get("deduped"))
    if h.artifact is None and not fx_twice:
        return {"verdict": UNKNOWN, "detail": "no artifact to inspect; no effect applied twice",
                "effects_applied_twice": []}
    bad = twice or fx_twice
    parts = []
    if twice:
        parts.append(f"steps applied more than once in the workspace: {twice}")
    if fx_twice:
        steps = sorted({applied[e][0].get("step") for e in fx_twice}, key=lambda x: (x is None, x))
        parts.append(f"external effects applied more than once: {fx_twice} (steps {steps})")
    return {"verdict": FAIL if bad else PASS, "applied_twice": twice, "effects_applied_twice": fx_twice,
            "deduplicated_retries": deduped,
            "detail": "; ".join(parts) or f"every step and effect applied once ({deduped} deduplicated retries)"}


def no_model_recall(h: TaskHistory, facts: Facts) -> dict:
    if h.calls is None:
        return {"verdict": UNKNOWN, "detail": "no readable model call log"}
    if h.writes is None:
        return {"verdict": UNKNOWN, "detail": "no readable proxy request log"}
    from cluster.grade import recall_analysis  # lazily: grade.py imports this module

    a = recall_analysis(h.calls, h.effects or [], h.writes or [], h.events)
    wasted = a["recalls"] + a["forgiven"]
    out = {"model_recalls": len(a["recalls"]), "forgiven_in_flight": len(a["forgiven"]),
           "wasted_calls": len(wasted), "wasted_tokens": sum(w["tokens"] for w in wasted),
           "calls": len(h.calls), "recalls": a["recalls"][:20]}
    if a["recalls"]:
        r = a["recalls"][0]
        return {"verdict": FAIL, **out, "detail": f"{len(a['recalls'])} recall(s) of recorded steps; first: step "
                                                 f"{r['step']} asked again by attempt {r['attempt']}: {r['why']}"}
    return {"verdict": PASS, **out, "detail": f"no recorded step asked again; {len(a['forgiven'])} in-flight "
                                             "answer(s) lost to interruptions"}


def no_torn_apply(h: TaskHistory, facts: Facts) -> dict:
    """Every multi-file apply is all there or not there at all, and the workload's tests agree."""
    task, wl, script = facts.task, facts.wl, facts.script
    if h.artifact_error:
        return {"verdict": UNKNOWN, "detail": f"the captured artifact is unreadable: {h.artifact_error}"}
    if h.artifact is None:
        return {"verdict": UNKNOWN, "detail": "no artifact to inspect"}
    torn = []
    for s in script:
        if not s.files:
            continue
        per = wl.applied_files(task["seed"], task["steps"], s.step, h.artifact)
        if len({v for v in per.values()}) > 1 or None in per.values():
            torn.append({"step": s.step, "tool": s.tool,
                         "applied": sorted(p for p, v in per.items() if v),
                         "not_applied": sorted(p for p, v in per.items() if v is False),
                         "neither": sorted(p for p, v in per.items() if v is None)})
    tests = {k: {"passed": ok, "why": why} for k, (ok, why) in wl.tests(task["seed"], h.artifact).items()} \
        if hasattr(wl, "tests") else {}
    failing = sorted(k for k, t in tests.items() if not t["passed"])
    if torn:
        t = torn[0]
        return {"verdict": FAIL, "torn": torn, "tests": tests,
                "detail": f"step {t['step']} ({t['tool']}) is torn: applied to {t['applied']}, not to "
                          f"{t['not_applied'] + t['neither']}; tests: " +
                          ", ".join(f"{k} {'passes' if v['passed'] else 'FAILS (' + v['why'] + ')'}"
                                    for k, v in sorted(tests.items()))}
    exp = wl.expected_files(task["seed"], task["steps"]) if hasattr(wl, "expected_files") else {}
    differ = sorted(p for p in exp if h.artifact.get(p) != exp[p])
    if differ:  # code the script never asked for: names alone no longer tell what the tests do
        return {"verdict": UNKNOWN, "torn": [], "tests": tests, "differ": differ,
                "detail": f"every multi-file apply is whole, but {differ} differ from what the script's steps "
                          "produce, so the static reading of the tests cannot vouch for them"}
    if failing:
        return {"verdict": FAIL, "torn": [], "tests": tests,
                "detail": f"every multi-file apply is whole but the tests fail: "
                          f"{failing[0]}: {tests[failing[0]]['why']}"}
    return {"verdict": PASS, "torn": [], "tests": tests,
            "detail": "every multi-file apply is all there" + (f"; tests pass ({', '.join(sorted(tests))})"
                                                              if tests else "")}


# a store answer that can end an attempt: refused (403: a dead or rotated key), the store failing (5xx), or no
# answer at all (a reset, a cut, a held request: status None); a 404 is how a journal says "nothing yet", a 409 or
# 412 a lost race a runner handles
def _can_end_an_attempt(r: dict) -> bool:
    s = r.get("status")
    return s is None or s == 403 or s >= 500


DIAGNOSABLE_NEAR_S = 15.0  # an answer explains an attempt's exit when it came in its last 15 s (retries included)


def diagnosable(h: TaskHistory, facts: Facts) -> dict:
    """Every failed attempt has a specific cause: a fault, a signal, OOM, ENOSPC, a start error, a store
    answer that can end an attempt (403, 5xx, no answer) in its last seconds, or an error line of its own."""
    interrupted, by_attempt = facts.interrupted, facts.by_attempt
    mine = facts.mine
    silent = []
    for a in interrupted:
        cause, code = _cause(a), a.get("exit_code")
        if not cause.startswith("exit ") or a.get("start_error") or (code is not None and not 0 <= code <= 128):
            continue  # killed by a fault or the harness, a signal, OOM, workspace full, pids, start error
        start = by_attempt.get(a["attempt"]) or {}
        end_t = a.get("ended_at") or a.get("wall") or 0
        errs = [r for r in h.requests or [] if _can_end_an_attempt(r) and r["t"] >= end_t - DIAGNOSABLE_NEAR_S
                and mine(r, a["attempt"], start.get("wall", 0), end_t)]
        said = ERROR_WORDS.search(h.log_tails.get(a["attempt"]) or "")
        if errs or said:
            continue
        silent.append(a["attempt"])
    if silent:
        return {"verdict": FAIL, "silent_attempts": silent,
                "detail": f"attempt(s) {silent} failed with only an exit code: no fault, no signal, no OOM, no "
                          "ENOSPC, no store answer that could end it (403, 5xx, a reset) in its last "
                          f"{DIAGNOSABLE_NEAR_S:.0f} s, no line of output saying why"}
    return {"verdict": PASS, "detail": f"every failed attempt ({len(interrupted)}) has a cause: " +
            ("; ".join(sorted({_cause(a) for a in interrupted})[:4]) or "none failed")}


def retry_loop(h: TaskHistory, facts: Facts) -> dict:
    """The same failure more than N times in a row: attempts ending alike (faults excluded), or one
    request answered with the same error over and over outside any fault window."""
    interrupted, fault_kills = facts.interrupted, facts.fault_kills
    rotated_out = facts.rotated_out
    n = int(h.limits.get("retry_loop_n") or 3)
    run, worst, prev = 0, (0, ""), None
    for a in interrupted:
        c = _cause(a)
        if a.get("sandbox") in fault_kills or c.startswith("killed:"):
            run, prev = 0, None
            continue
        run = run + 1 if c == prev else 1
        prev = c
        worst = max(worst, (run, c))
    if worst[0] > n:
        return {"verdict": FAIL, "detail": f"{worst[0]} attempts in a row ended the same way ({worst[1]}): a "
                                           f"crash loop (more than {n})"}
    m = int(h.limits.get("retry_requests_n") or 50)
    run, worst_r, prev = 0, (0, ""), None
    for r in sorted(h.requests or [], key=lambda r: r["t"]):
        sig = (r.get("method"), r.get("key"), r.get("status")) if (r.get("status") or 0) >= 400 \
            and not r.get("fault") and not rotated_out(r) else None
        run = run + 1 if sig is not None and sig == prev else (1 if sig else 0)
        prev = sig
        if sig:
            worst_r = max(worst_r, (run, f"{sig[0]} {sig[1]} -> {sig[2]}"))
    if worst_r[0] > m:
        return {"verdict": FAIL, "detail": f"the same store request failed {worst_r[0]} times in a row with no "
                                           f"fault injected ({worst_r[1]}): a retry loop (more than {m})"}
    storm = _retry_storm(h, facts)
    if storm is not None:
        return storm
    return {"verdict": PASS, "detail": f"longest run of one failure: {worst[0]} attempt(s), {worst_r[0]} "
                                       "request(s)"}


# A retry storm: within one attempt, at least STORM_N identical failing store requests in a row (fault windows
# included: a fault is what starts one) at more than STORM_PER_S a second with three gaps in four under
# STORM_GAP_MS, i.e. retried with no backoff. durable under ST1 sends 10-14 in a row at most at about 10/s; a
# runner that retried at once sent 59-910 at up to 317/s with median gaps of 2-5 ms. The gaps matter as well as
# the rate: the proxy can log more requests than the runner made calls (a boto3 call answered 503 mid-body was
# logged about twice), so a runner sleeping 60 ms between calls showed 21/s, but most of its gaps were 63 ms.
STORM_N = 20
STORM_PER_S = 20.0
STORM_GAP_MS = 20.0


def _retry_storm(h: TaskHistory, facts: Facts) -> dict | None:
    worst = None  # (n, per_s, span_s, median gap ms, what, attempt)
    for a in facts.attempts:
        start = facts.by_attempt.get(a["attempt"]) or {}
        t0, t1 = start.get("wall", 0), a.get("ended_at") or a.get("wall") or float("inf")
        rows = sorted((r for r in h.requests or [] if facts.mine(r, a["attempt"], t0, t1)), key=lambda r: r["t"])
        run, prev = [], None
        for r in rows + [None]:
            st = None if r is None else r.get("status")
            sig = None if r is None or (st is not None and st < 400) else (r.get("method"), r.get("key"), st)
            if sig is not None and sig == prev:
                run.append(r["t"])
                continue
            if len(run) >= STORM_N:
                span = run[-1] - run[0]
                per_s = (len(run) - 1) / span if span > 0 else float("inf")
                gaps = sorted(b - x for x, b in zip(run, run[1:]))
                gap_ms, p75_ms = gaps[len(gaps) // 2] * 1000, gaps[(3 * len(gaps)) // 4] * 1000
                if per_s > STORM_PER_S and p75_ms < STORM_GAP_MS and (worst is None or len(run) > worst[0]):
                    worst = (len(run), per_s, span, gap_ms, f"{prev[0]} {prev[1]} -> {prev[2] or 'no answer'}",
                             a["attempt"])
            run, prev = ([r["t"]] if sig is not None else []), sig
    if worst is None:
        return None
    n, per_s, span, gap_ms, what, attempt = worst
    return {"verdict": FAIL, "storm": {"requests": n, "per_s": round(per_s, 1), "span_s": round(span, 3),
                                       "median_gap_ms": round(gap_ms, 1), "request": what, "attempt": attempt},
            "detail": f"a retry storm: attempt {attempt} sent the same failing request {n} times in a row in "
                      f"{span:.2f} s ({per_s:.0f}/s, median gap {gap_ms:.1f} ms; {what}): retried with no backoff "
                      f"(at least {STORM_N} at more than {STORM_PER_S:g}/s, three gaps in four under "
                      f"{STORM_GAP_MS:g} ms)"}


def _silences(h: TaskHistory, facts: Facts) -> tuple[tuple, tuple]:
    """(the longest stretch inside an attempt with nothing observable: (s, attempt, from, to)), and the longest gap
    between one attempt's end and the next one's start: (s, attempt))."""
    worst, gap = (0.0, None), (0.0, None)
    prev_end = None
    for a in facts.attempts:
        start = facts.by_attempt.get(a["attempt"]) or {}
        t0, t1 = start.get("wall"), a.get("ended_at") or a.get("wall")
        if t0 is None or t1 is None:
            continue
        if prev_end is not None and t0 - prev_end > gap[0]:
            gap = (t0 - prev_end, a["attempt"])
        prev_end = t1
        ts = sorted([t0, t1] + [x for c in h.calls if c.get("attempt") == a["attempt"]
                                for x in (c["t"], c.get("t_done", c["t"]))]
                    + [e["t"] for e in h.effects or [] if e.get("attempt") == a["attempt"]]
                    + [r["t"] for r in h.requests if facts.mine(r, a["attempt"], t0, t1)])
        ts = [t for t in ts if t0 <= t <= t1]
        for x, y in zip(ts, ts[1:]):
            if y - x > worst[0]:
                worst = (y - x, a["attempt"], x, y)
    return worst, gap


def _starved(h: TaskHistory, worst: tuple, bound: float) -> dict | None:
    """A runner starved of CPU looks like a hung one: when the host had far more runnable tasks than cores through
    the silence (the harness ran too many sandboxes at once), it cannot be told apart (unknown)."""
    load = [x for x in h.host_load if worst[2] <= x["t"] <= worst[3]]
    if not load:
        return None
    cores = load[0].get("cores") or 1
    mean = sum(x["running"] for x in load) / len(load)
    if mean < OVERLOAD_PER_CORE * cores:
        return None
    return {"verdict": UNKNOWN, "longest_silence_s": round(worst[0], 2),
            "detail": f"attempt {worst[1]} went {worst[0]:.1f} s with no model call, effect or store "
                      f"request (bound {bound:g} s) while the host was overloaded ({mean:.0f} runnable "
                      f"tasks on {cores} cores on average): starved or hung, it cannot be told; "
                      "run fewer at once"}


def liveness(h: TaskHistory, facts: Facts) -> dict:
    """No stretch inside an attempt with nothing observable (a model call, an effect, a store request)
    longer than the bound; a gap between attempts longer than it is the harness's (unknown)."""
    bound = float(h.limits.get("liveness_s") or 30.0)
    if h.calls is None or h.requests is None:
        return {"verdict": UNKNOWN, "detail": "no readable model call or proxy log"}
    worst, gap = _silences(h, facts)
    if worst[0] > bound:
        return _starved(h, worst, bound) or {
            "verdict": FAIL, "longest_silence_s": round(worst[0], 2),
            "detail": f"attempt {worst[1]} went {worst[0]:.1f} s with no model call, effect or store request "
                      f"(bound {bound:g} s): hung"}
    if gap[0] > bound:
        return {"verdict": UNKNOWN, "longest_silence_s": round(worst[0], 2),
                "detail": f"{gap[0]:.1f} s with no live attempt before attempt {gap[1]} (bound {bound:g} s): the "
                          "harness was slow to start it"}
    return {"verdict": PASS, "longest_silence_s": round(worst[0], 2),
            "detail": f"longest silence inside an attempt {worst[0]:.1f} s, between attempts {gap[0]:.1f} s "
                      f"(bound {bound:g} s)"}


def no_outliving_process(h: TaskHistory, facts: Facts) -> dict:
    """No process the runner started is still running when it exits 0 (a daemon going on writing and calling the
    model after the work is reported done). The host lists them, by its own /proc, at each attempt's end; after
    an exit that is not 0 they are reported, not failed."""
    looked = [a for a in facts.attempts if a.get("outlived") is not None]
    left = [(a["attempt"], a.get("exit_code"), a["outlived"]) for a in looked if a["outlived"]]
    bad = [(n, procs) for n, code, procs in left if code == 0]
    names = sorted({p.get("name", "?") for _, _, procs in left for p in procs})
    figures = {"outlived": [{"attempt": n, "exit_code": code, "processes": procs} for n, code, procs in left]}
    if bad:
        n, procs = bad[0]
        return {"verdict": FAIL, **figures,
                "detail": f"attempt {n} exited 0 while {len(procs)} process(es) it started still ran "
                          f"({', '.join(sorted({p.get('name', '?') for p in procs})[:5])}): work reported done "
                          "while something of it went on; they were killed with the sandbox"}
    return {"verdict": PASS, **figures,
            "detail": f"no process outlived an exit 0 ({len(looked)} attempt(s) looked at)" +
                      (f"; after a failed exit {sum(len(p) for _, _, p in left)} process(es) were killed with the "
                       f"sandbox ({', '.join(names[:5])})" if left else "")}


def attempt_budget(h: TaskHistory, facts: Facts) -> dict:
    attempts, end = facts.attempts, facts.end
    budget = int(h.limits.get("max_attempts") or 0)
    used = len(attempts)
    if end is not None and end.get("state") != "done" and budget and used >= budget:
        return {"verdict": FAIL, "detail": f"all {budget} attempts used without finishing ({end.get('why', '')})"}
    return {"verdict": PASS, "detail": f"{used} of {budget or '?'} attempts"}


def exercised(h: TaskHistory, facts: Facts, r: dict) -> str | None:
    """Why an applied kill tested something (the killed attempt had done something durable before it:
    a model answer delivered, an effect, a store write answered 2xx), or None when it tested nothing."""
    starts = facts.starts
    sid = (r.get("target") or {}).get("sandbox_id")
    start, at = starts.get(sid), r.get("fired_at")
    if start is None or at is None or h.calls is None:
        return "unknown attempt or time: counted as exercised"
    attempt, t0 = start["attempt"], start["wall"]
    if any(c.get("attempt") == attempt and c.get("delivered", True) and c.get("t_done", c["t"]) <= at
           for c in h.calls):
        return "a model answer had been delivered to the killed attempt"
    if any(e.get("attempt") == attempt and e["t"] <= at for e in h.effects or []):
        return "the killed attempt had sent an external effect"
    if any(t0 <= w["t"] <= at for w in h.writes or []):
        return "the killed attempt had a store write answered"
    return None


def fault_applied(h: TaskHistory, facts: Facts) -> dict:
    task, tid = facts.task, facts.tid
    if not task["faults"]:
        return {"verdict": PASS, "detail": "no fault planned"}
    mine = {r["instance"]: r for r in h.receipts if r["task_id"] == tid}
    verdicts, details, idle = [], [], []
    for f in task["faults"]:
        r = mine.get(f["instance"])
        if r is None:
            verdicts.append(UNKNOWN)
            details.append(f"{f['instance']}: no receipt")
            continue
        if kills_attempt(r.get("fault_id")) and r["status"] == "applied" and exercised(h, facts, r) is None:
            idle.append(f["instance"])
            verdicts.append(NOT_APPLIED)
            details.append(f"{f['instance']}: not_exercised (the kill landed before the attempt had a model "
                           f"answer, an effect or a store write: it tested nothing; {r['detail']})")
            continue
        verdicts.append({"applied": PASS, "not_applied": NOT_APPLIED}.get(r["status"], UNKNOWN))
        details.append(f"{f['instance']}: {r['status']} ({r['detail']})")
    # a node loss (PK3) takes every sandbox on the node: a task whose own fault did not apply but whose
    # attempt died with another task's node is an interrupted task all the same
    hit = [(r["instance"], sid) for r in h.receipts if takes_node(r.get("fault_id")) and r["status"] == "applied"
           and r["task_id"] != tid for sid in (r.get("target") or {}).get("sandboxes") or []
           if sid.startswith(tid + "-a")]
    if hit and NOT_APPLIED in verdicts and UNKNOWN not in verdicts:
        verdicts = [PASS if v == NOT_APPLIED else v for v in verdicts]
        details.append("; ".join(f"hit by {i} (its node was lost with attempt {sid} on it)" for i, sid in hit))
    return {"verdict": merge(verdicts), "detail": "; ".join(details), "not_exercised": idle}


def no_foreign_writes(h: TaskHistory, facts: Facts) -> dict:
    fw = h.foreign_writes or []
    if not fw:
        return {"verdict": PASS, "detail": "every write of its attempts stayed under its own prefix"}
    landed = [w for w in fw if 200 <= (w["status"] or 0) < 300]
    w = fw[0]
    return {"verdict": FAIL, "writes": fw[:20],
            "detail": f"{len(fw)} write(s) outside its own prefix ({len(landed)} applied, {len(fw) - len(landed)} "
                      f"refused by the store); first: {w['method']} {w['key']} -> {w['status']}"}


def no_leaked_upload(h: TaskHistory, facts: Facts) -> dict:
    ups = h.leaked_uploads or []
    if not ups:
        return {"verdict": PASS, "detail": "no multipart upload of this task was left incomplete"}
    return {"verdict": FAIL, "uploads": ups[:20],
            "detail": f"{len(ups)} multipart upload(s) started under its prefix and never completed or aborted; "
                      f"first: {ups[0]['key']} (upload {ups[0]['upload_id'][:16]})"}


def _zombie_activity(h: TaskHistory, facts: Facts, sid: str, t0: float) -> tuple[list[str], int, int]:
    """What the zombie attempt `sid` did from its thaw `t0`: (what took effect, requests seen, refused)."""
    att = (results.attempt_of(sid) or (sid, 0))[1]
    ids = facts.akids.get(att) or set()
    store = [q for q in h.requests or [] if q.get("akid") in ids and q["t"] >= t0]
    landed = [q for q in store if q.get("method") in WRITE_METHODS and 200 <= (q.get("status") or 0) < 300]
    calls = [c for c in h.calls or [] if c.get("attempt") == att and c["t"] >= t0]
    fx = [e for e in h.effects or [] if e.get("attempt") == att and e["t"] >= t0]
    mine_refused = [f for f in h.fenced if f.get("attempt") == att and f["t"] >= t0]
    seen = len(store) + len(calls) + len(fx) + len(mine_refused)
    refused = sum(1 for q in store if (q.get("status") or 0) >= 400) + len(mine_refused)
    bad = [f"store {q['method']} {q.get('key')} -> {q.get('status')}" for q in landed]
    bad += [f"model call answered at {c['t']:.3f}" for c in calls] + [f"effect {e['effect_id']} applied" for e in fx]
    return bad, seen, refused


def fenced_writes_rejected(h: TaskHistory, facts: Facts) -> dict:
    """PK6: after the zombie was thawed, nothing it did may count: no store write of its key landed, no model
    call or effect of its attempt was answered. Every request it made must have been refused."""
    found, bad, refused, seen = [], [], 0, 0
    for r in h.receipts:
        if (r["task_id"] != facts.tid or not adds_check(r.get("fault_id"), "fenced_writes_rejected")
                or r.get("status") != "applied"):
            continue
        tgt = r.get("target") or {}
        sid, t0 = tgt.get("zombie"), tgt.get("thawed_at")
        if not sid or t0 is None:
            return {"verdict": UNKNOWN, "detail": f"{r['instance']}: its receipt names no zombie or thaw time"}
        b, n, k = _zombie_activity(h, facts, sid, t0)
        bad, seen, refused = bad + b, seen + n, refused + k
        found.append(f"{r['instance']} (zombie {sid})")
    if not found:
        return {"verdict": NOT_APPLIED, "detail": "no PK6 of this task froze an attempt: no zombie to follow"}
    if h.requests is None or h.calls is None:
        return {"verdict": UNKNOWN, "detail": "the proxy or model log is missing: the zombie cannot be followed"}
    if bad:
        return {"verdict": FAIL, "landed": bad[:20],
                "detail": f"{len(bad)} thing(s) a fenced zombie did took effect: {'; '.join(bad[:3])}"}
    if not seen:
        return {"verdict": NOT_APPLIED, "detail": f"{', '.join(found)}: the zombie made no request after it was "
                                                  "thawed, so the fencing was not exercised"}
    return {"verdict": PASS, "detail": f"{', '.join(found)}: all {refused} of its request(s) after the thaw were "
                                       "refused (revoked key / stale fence); none took effect"}


@dataclass(frozen=True)
class Check:
    name: str
    fn: Callable[["TaskHistory", Facts], dict]
    applies: Callable[["TaskHistory", Facts], bool]


def _always(h, facts) -> bool:
    return True


def _not_reference(h, facts) -> bool:
    return not facts.is_ref


# in the order a grade lists them
REGISTRY: list[Check] = [
    Check("completed", completed, _always),
    Check("resume_equivalent", resume_equivalent, _not_reference),
    Check("no_double_apply", no_double_apply, _always),
    Check("no_model_recall", no_model_recall, _always),
    Check("no_torn_apply", no_torn_apply, lambda h, f: any(s.files for s in f.script)),  # multi-file applies
    Check("fault_applied", fault_applied, _not_reference),
    Check("diagnosable", diagnosable, _always),
    Check("retry_loop", retry_loop, _always),
    Check("liveness", liveness, _always),
    Check("attempt_budget", attempt_budget, _always),
    # the host looked at what outlived each attempt's runner (the process backend's wrapper)
    Check("no_outliving_process", no_outliving_process,
          lambda h, f: any(a.get("outlived") is not None for a in f.attempts)),
    # the store audit ran: a leaked upload fails the task that started it
    Check("no_leaked_upload", no_leaked_upload, lambda h, f: h.leaked_uploads is not None),
    # attributable (per-attempt keys): the writer answers for its writes
    Check("no_foreign_writes", no_foreign_writes, lambda h, f: h.foreign_writes is not None),
    # a fault that brings a check of its own (PK6: the thawed zombie's writes are refused)
    Check("fenced_writes_rejected", fenced_writes_rejected,
          lambda h, f: any(adds_check(x.get("fault_id"), "fenced_writes_rejected")
                           for x in f.task.get("faults") or [])),
]


def applicable(h: "TaskHistory", facts: Facts) -> list[Check]:
    return [c for c in REGISTRY if c.applies(h, facts)]
