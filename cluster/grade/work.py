"""Checks of the work itself: the task completed, its artifact equals an uninterrupted run's, nothing was applied
twice, no recorded step was asked of the model again, no multi-file apply is torn."""
from __future__ import annotations

from cluster.grade.diff import changed, describe, drop_volatile, printable
from cluster.grade.history import TaskHistory, recall_analysis
from cluster.grade.selfref import SELF_DETAIL
from cluster.grade.verdicts import FAIL, PASS, UNKNOWN
from cluster.grade.facts import Facts


# What the harness's capture leaves out for its own sake, not for a cap the runner went past (`read_tree`,
# fleet/sandbox/): a name no JSON record, report or artifact can hold as it is. The checks judge what was captured; the
# skip is named in the grade (`left_out`), never a failure of the runner's and never silent.
HARNESS_SKIPS = ("a file name that is not UTF-8",)


def harness_skips(attempt: dict) -> tuple[list[str], list[str]]:
    """(the capture's caps the runner went past, the names the harness itself left out) of an attempt's capture."""
    art = attempt.get("artifact") if isinstance(attempt.get("artifact"), dict) else {}
    capped = [str(c) for c in art.get("capped") or []]
    caps = [c for c in capped if not any(s in c for s in HARNESS_SKIPS)]
    names = [printable(str(n), 120) for n in art.get("skipped") or []] if len(caps) < len(capped) else []
    return caps, names


def skip_note(names: list[str]) -> str:
    return (f"; the capture left out {len(names)} file(s) whose name is not UTF-8 (no record can hold it as it is),"
            f" named escaped: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}") if names else ""


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
    capped, _ = harness_skips(last)
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
    if missing_fx and not missing and h.effects_error:  # the log that would show them cannot be read
        return {"verdict": UNKNOWN, "missing_effects": missing_fx,
                "detail": f"every workspace step is there, but effects.jsonl is unreadable ({h.effects_error}), so "
                          f"whether the effects of steps {missing_fx} were applied cannot be told"}
    extra = (f"; effects {swallowed} were swallowed by an Idempotency-Key reused from another effect"
             if swallowed else "")
    noticed = facts.noticed[-1:] if facts.noticed and facts.noticed[-1] is facts.attempts[-1] else []
    extra += "".join(f"; it exited 0 while being stopped ({a.get('killed_by')}): exit 0 says the task is done, "
                     "exit non-zero to be resumed" for a in noticed)
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
    refused, answered = h.refused, [c for c in h.calls or [] if c.get("kind") in ("tool", "final")]
    for part in (_ended_with_an_artifact, _every_step_done, _work_came_from_the_model):
        got = part(h, facts)
        if got is not None:
            if refused and not answered:  # the model endpoint could not speak the agent's dialect
                got = dict(got, detail=f"the agent never ran a step: {refused[0].get('refused', '?')} ("
                                       f"{got['detail']})")
            mismatch = next((c["dialect_mismatch"] for c in h.calls or [] if c.get("dialect_mismatch")), None)
            if mismatch:
                got = dict(got, dialect_mismatch=mismatch)
            return got
    left = harness_skips(facts.attempts[-1] if facts.attempts else {})[1]
    return {"verdict": PASS, **({"left_out": left[:20]} if left else {}),
            "detail": "exited 0; every step was answered by the model and its change and effect are there"
                      + skip_note(left)}


def resume_equivalent(h: TaskHistory, facts: Facts) -> dict:
    """The artifact equals an uninterrupted run's of the same runner and seed, leaving out the paths the user
    declared volatile. Where it differs, a second uninterrupted run of the seed (run by the wave on demand) tells
    the runner's own non-determinism (the two runs differ there too: `unknown`) from damage (they agree: `fail`,
    naming the lines). A task with no fault planned that ran once, untouched, is that uninterrupted run itself
    (`reference: self`, cluster/grade/selfref.py): the same, trivially."""
    from fleet.workloads.base import tree_digest

    if h.artifact_error:
        return {"verdict": UNKNOWN, "detail": f"the captured artifact is unreadable: {h.artifact_error}"}
    if h.artifact is None:
        return {"verdict": FAIL, "detail": "no artifact was captured"}
    ref = h.reference or {}
    if "digest" not in ref:
        return {"verdict": UNKNOWN, "detail": f"no reference to compare with: {ref.get('why', 'none')}"}
    if ref.get("self"):  # the task is the uninterrupted run of its seed (cluster/grade/selfref.py)
        got = tree_digest(h.artifact)
        return {"verdict": PASS, "expected": got, "got": got, "reference": "self",
                "detail": f"{SELF_DETAIL}: this task is the uninterrupted run of its seed, so no second one ran "
                          "beside it"}
    rules = h.volatile
    got_files, left_out = drop_volatile(h.artifact, rules)
    want_files, left_out_ref = drop_volatile(ref.get("files") or {}, rules)
    left_out.update(left_out_ref)
    got, want = tree_digest(got_files), tree_digest(want_files) if "files" in ref else ref["digest"]
    base = {"expected": want, "got": got}
    if left_out:
        base["volatile"] = {printable(p, 200): printable(str(why), 200) for p, why in sorted(left_out.items())[:20]}
    note = (f" (left out as volatile: {', '.join(printable(p, 80) for p in sorted(left_out)[:5])}"
            f"{' ...' if len(left_out) > 5 else ''})") if left_out else ""
    left = harness_skips(facts.attempts[-1] if facts.attempts else {})[1]
    if got == want:
        if left:
            base["left_out"] = left[:20]
            note += skip_note(left).replace("; the capture", "; not compared: the capture", 1)
        return {"verdict": PASS, **base, "detail": "same artifact as an uninterrupted run" + note}
    diff = changed(got_files, want_files)
    lines = describe(got_files, want_files, diff)
    base.update(differs=[printable(p, 200) for p in diff[:20]], lines=lines)
    met = any(r.get("task_id") == facts.tid and r.get("status") == "applied" for r in h.receipts)
    if not facts.interrupted and not met:
        # a task no fault touched is itself an uninterrupted run: two of them differ (a task a fault met but did
        # not kill, DF1 or a storage fault, is not: its difference may be the fault's damage)
        return {"verdict": UNKNOWN, **base,
                "detail": "the runner is not deterministic under a fixed model: two uninterrupted runs of this seed "
                          f"left different artifacts ({'; '.join(lines[:3])}){note}"}
    second = ref.get("second")
    if second is not None:
        second_files, _ = drop_volatile(second, rules)
        noisy = set(changed(want_files, second_files))
        damage = [p for p in diff if p not in noisy]
        base["not_deterministic"] = [printable(p, 200) for p in sorted(noisy)[:20]]
        if not damage:
            return {"verdict": UNKNOWN, **base,
                    "detail": f"the runner is not deterministic under a fixed model: two uninterrupted runs of this "
                              f"seed ({ref.get('task_id')}, {ref.get('second_id')}) differ in "
                              f"{', '.join(printable(p, 80) for p in sorted(noisy)[:5])}, and this task differs only "
                              "there; if such a path is expected to differ on every run, declare it in the config's "
                              f"`volatile` (a glob and why){note}"}
        dmg = describe(got_files, want_files, damage)
        return {"verdict": FAIL, **base, "damaged": [printable(p, 200) for p in damage[:20]],
                "detail": f"artifact differs from two uninterrupted runs of the same runner and seed that agree "
                          f"there: {'; '.join(dmg[:4])}{note}"}
    return {"verdict": FAIL, **base,
            "detail": f"artifact differs from an uninterrupted run of the same runner and seed: "
                      f"{'; '.join(lines[:4])} ({ref.get('second_why', 'no second run')}){note}"}


def no_double_apply(h: TaskHistory, facts: Facts) -> dict:
    """No step's marker twice in the artifact, and no external effect applied twice in the effects log (a repeated
    Idempotency-Key is a deduplicated retry, not a second apply)."""
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
    """Asking the model again for a step whose result had been recorded is a recall. Only the answer in flight at an
    interruption is forgiven: not delivered, or delivered to an attempt that then ended with no later model call,
    no effect of that step and no store write."""
    if h.calls is None:
        return {"verdict": UNKNOWN, "detail": "no readable model call log"}
    if h.writes is None:
        return {"verdict": UNKNOWN, "detail": "no readable proxy request log"}

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


def _torn_steps(h: TaskHistory, facts: Facts) -> list[dict]:
    """Each multi-file step of the script whose files are neither all applied nor all not applied."""
    task, wl, torn = facts.task, facts.wl, []
    for s in facts.script:
        if not s.files:
            continue
        per = wl.applied_files(task["seed"], task["steps"], s.step, h.artifact)
        if len({v for v in per.values()}) > 1 or None in per.values():
            torn.append({"step": s.step, "tool": s.tool,
                         "applied": sorted(p for p, v in per.items() if v),
                         "not_applied": sorted(p for p, v in per.items() if v is False),
                         "neither": sorted(p for p, v in per.items() if v is None)})
    return torn


def no_torn_apply(h: TaskHistory, facts: Facts) -> dict:
    """Every multi-file apply is all there or not there at all, and the workload's tests agree."""
    task, wl = facts.task, facts.wl
    if h.artifact_error:
        return {"verdict": UNKNOWN, "detail": f"the captured artifact is unreadable: {h.artifact_error}"}
    if h.artifact is None:
        return {"verdict": UNKNOWN, "detail": "no artifact to inspect"}
    torn = _torn_steps(h, facts)
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


