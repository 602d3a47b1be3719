"""One task's grade: every check of the registry that applies, each through the check-safe wrapper (a crashed check
is `unknown`), what another task's damage or a harness fault excuses, and the task's figures."""
from __future__ import annotations

import traceback

from cluster.grade import checks as registry
from cluster.grade.facts import Facts, attempt_cause
from cluster.grade.history import TaskHistory
from cluster.grade.runs import host_overload
from cluster.grade.verdicts import FAIL, UNKNOWN, merge


def _check(fn) -> dict:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a crashed check is unknown
        return {"verdict": UNKNOWN, "detail": f"check crashed: {type(exc).__name__}: {exc}",
                "trace": traceback.format_exc(limit=3)}


def run_checks(h: TaskHistory, facts) -> dict[str, dict]:
    """Every check that applies, each through the check-safe wrapper (a task with no end: all unknown)."""
    checks: dict[str, dict] = {}
    for c in registry.applicable(h, facts):
        if facts.end is None:
            checks[c.name] = {"verdict": UNKNOWN, "detail": "the task has no task_end in the timeline "
                                                            "(it did not run to an end)"}
        else:
            checks[c.name] = _check(lambda c=c: c.fn(h, facts))
    return checks


def excuse(h: TaskHistory, end: dict | None, checks: dict[str, dict]) -> bool:
    """What another task's damage or the harness's own death made fail is not this runner's failure (unknown).
    Returns whether a harness fault touched the task."""
    if h.damaged_by:  # another task wrote into this one's prefix: what failed is not this runner's doing
        d0 = h.damaged_by[0]
        for c in checks.values():
            if c["verdict"] == FAIL:
                c["verdict"] = UNKNOWN
                c["detail"] = f"damaged by task {d0['by']} ({d0['method']} {d0['key']}); {c['detail']}"
    hf = h.harness_fault
    touched = hf is not None and (end is None or end.get("wall", 0.0) >= hf["since_wall"])
    if touched:  # what the harness's own death may have caused is never the runner's failure
        for c in checks.values():
            if c["verdict"] == FAIL or end is None:
                c["verdict"] = UNKNOWN if c["verdict"] == FAIL else c["verdict"]
                c["detail"] = f"harness fault ({hf['part']}: {hf['why']}) while this task ran; {c['detail']}"
    return touched


def excuse_overload(h: TaskHistory, facts: Facts, checks: dict[str, dict]) -> dict | None:
    """An attempt the harness ended (silent past liveness_s, or at the deadline) while its host was overloaded:
    starved and hung cannot be told apart there, so what failed is `unknown`, naming the load, never the runner's
    fail. Returns what it found ({"attempt", "why", "mean", "cores"}), or None."""
    for a in facts.attempts:
        how = str(a.get("killed_by") or "")
        if not (how.startswith("silent") or how == "deadline"):
            continue
        start = facts.by_attempt.get(a["attempt"]) or {}
        t0, t1 = start.get("wall"), a.get("ended_at") or a.get("wall")
        if t0 is None or t1 is None:
            continue
        if how.startswith("silent"):  # the silence that ended it: the last liveness_s before the kill
            t0 = max(t0, t1 - float(h.limits.get("liveness_s") or 30.0))
        got = host_overload(h, t0, t1, start.get("node") or a.get("node"))
        if got is None:
            continue
        mean, cores = got
        why = (f"the harness ended attempt {a['attempt']} ({how}) while its host was overloaded ({mean:.0f} "
               f"runnable tasks on {cores} cores on average): starved or hung, it cannot be told; run fewer at once")
        for c in checks.values():
            if c["verdict"] == FAIL:
                c["verdict"] = UNKNOWN
                c["detail"] = f"{why}; {c['detail']}"
        return {"attempt": a["attempt"], "why": why, "mean": round(mean, 1), "cores": cores}
    return None


def task_figures(h: TaskHistory, attempts: list[dict], end: dict | None) -> dict:
    """Time to resume (an attempt's end -> the next attempt's first model request), wall time from the first
    attempt's start to the task's end, store write time per step."""
    resume_s = []
    for a in attempts:
        if a.get("exit_code") == 0 or not (a.get("ended_at") or a.get("wall")):
            continue
        nxt = [c["t"] for c in h.calls or [] if c.get("attempt") == a["attempt"] + 1]
        if nxt:
            resume_s.append(round(min(nxt) - (a.get("ended_at") or a["wall"]), 3))
    first = min((e["wall"] for e in h.events if e["event"] == "attempt_start"), default=None)
    wall_s = round(end["wall"] - first, 3) if end is not None and first is not None and "wall" in end else None
    commit_ms = round(sum(w.get("ms") or 0 for w in h.writes or []) / max(1, h.task["steps"]), 2) \
        if h.writes is not None else None
    return {"resume_s": resume_s, "wall_s": wall_s, "store_write_ms_per_step": commit_ms}


def _trigger(f: dict) -> str:
    return f.get("trigger", "time") + (f":{f['params']['variant']}" if f.get("trigger") == "store_write" else "")


def grade_task(h: TaskHistory) -> dict:
    """Every check that applies to the task (the registry, grade/checks.py), each through the check-safe wrapper,
    then what a harness fault or another task's damage makes of them, and the task's figures."""
    facts = Facts.of(h)
    task, tid, attempts, end = facts.task, facts.tid, facts.attempts, facts.end
    checks = run_checks(h, facts)
    touched = excuse(h, end, checks)
    overloaded = excuse_overload(h, facts, checks)
    verdict = merge(c["verdict"] for c in checks.values())
    figures = task_figures(h, attempts, end)
    signature = "+".join(sorted(k for k, c in checks.items() if c["verdict"] == FAIL)) or None
    recall = checks["no_model_recall"]
    # kills not shown to interrupt a run (only when there is one: a grade stored before it existed re-grades the same)
    unshown = (checks.get("fault_applied") or {}).get("kill_not_shown")
    return {"task_id": tid, "role": task.get("role", "task"), "seed": task["seed"], "runner": task["runner"],
            "workload": task.get("workload"), "faults": [f["fault_id"] for f in task["faults"]],
            "triggers": [_trigger(f) for f in task["faults"]],
            "verdict": verdict, "signature": signature, "attempts": len(attempts),
            "harness_fault": h.harness_fault["part"] if touched else None,
            "interrupted": facts.was_interrupted,  # (a notice answered by an exit 0 interrupted it too)
            "ended": end is not None, "model_recalls": recall.get("model_recalls"),
            "not_exercised": (checks.get("fault_applied") or {}).get("not_exercised") or [],
            "attempt_causes": [attempt_cause(a) for a in attempts],
            "wasted_calls": recall.get("wasted_calls"), "wasted_tokens": recall.get("wasted_tokens"),
            "reference_key": (task.get("reference") or {}).get("key"), "resume_s": figures["resume_s"],
            "wall_s": figures["wall_s"], "store_write_ms_per_step": figures["store_write_ms_per_step"],
            "checks": checks, **({"overloaded": overloaded} if overloaded else {}),
            **({"kill_not_shown": unshown} if unshown else {})}

