"""Grading: reads only what a wave stored under `results/<wave>/` and gives every task
a verdict. Checks have three outcomes plus `not_applied`; a check that crashes is
`unknown`, never `pass`. Merge order: fail > unknown > not_applied > pass.

Checks per task:
- completed: the last attempt exited 0 and the artifact manifest is in the store.
- resume_equivalent: the artifact's fingerprint (computed here, never taken from
  the runner) equals the reference of an uninterrupted run of the same seed.
- no_double_apply: no step's marker appears more than once in the artifact.
- no_model_recall: extra model calls (calls beyond one per step) are at most the
  number of interrupted attempts (a kill may lose the one answer in flight; a
  runner that re-asks for recorded steps exceeds that).
- fault_applied: every planned fault's receipt says applied.
"""
from __future__ import annotations

import traceback
from pathlib import Path

import orjson

from fleet import workload

PASS, FAIL, UNKNOWN, NOT_APPLIED = "pass", "fail", "unknown", "not_applied"
RANK = {PASS: 0, NOT_APPLIED: 1, UNKNOWN: 2, FAIL: 3}


def merge(verdicts) -> str:
    out = PASS
    for v in verdicts:
        if RANK[v] > RANK[out]:
            out = v
    return out


def _load(path: Path, default=None):
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return default


def _lines(path: Path) -> list[dict]:
    try:
        return [orjson.loads(l) for l in path.read_bytes().splitlines() if l.strip()]
    except FileNotFoundError:
        return []


def read_artifact(adir: Path) -> dict[str, str] | None:
    manifest = _load(adir / "artifact.manifest.json")
    if manifest is None:
        return None
    files = {}
    for path in manifest["files"]:
        p = adir / "artifact" / path
        files[path] = p.read_text() if p.exists() else ""
    return files


def _check(fn, *args) -> dict:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - a crashed check is unknown
        return {"verdict": UNKNOWN, "detail": f"check crashed: {type(exc).__name__}: {exc}",
                "trace": traceback.format_exc(limit=3)}


def grade_task(task: dict, events: list[dict], receipts: list[dict], calls: dict | None,
               artifact: dict[str, str] | None) -> dict:
    tid = task["task_id"]
    attempts = [e for e in events if e["event"] == "attempt_end"]
    end = next((e for e in events if e["event"] == "task_end"), None)
    interrupted = [a for a in attempts if a.get("exit_code") != 0]
    checks: dict[str, dict] = {}

    def completed():
        if end is None:
            return {"verdict": UNKNOWN, "detail": "no task_end in the timeline"}
        ok = end["state"] == "done" and artifact is not None
        detail = f"state={end['state']} ({end.get('why', '')}); manifest {'found' if artifact is not None else 'missing'}"
        return {"verdict": PASS if ok else FAIL, "detail": detail}

    def resume_equivalent():
        if artifact is None:
            return {"verdict": FAIL, "detail": "no artifact in the store"}
        ref = workload.fingerprint(workload.reference(task["seed"], task["steps"]))
        got = workload.fingerprint(artifact)
        return {"verdict": PASS if got == ref else FAIL, "expected": ref, "got": got,
                "detail": "same artifact as an uninterrupted run" if got == ref else "artifact diverges from the reference"}

    def no_double_apply():
        if artifact is None:
            return {"verdict": UNKNOWN, "detail": "no artifact to inspect"}
        counts = workload.step_counts(artifact)
        twice = sorted(s for s, n in counts.items() if n > 1)
        missing = sorted(set(range(task["steps"])) - set(counts))
        return {"verdict": FAIL if twice else PASS, "applied_twice": twice, "missing_steps": missing,
                "detail": f"steps applied more than once: {twice}" if twice else "every step applied at most once"}

    def no_model_recall():
        if calls is None:
            return {"verdict": UNKNOWN, "detail": "no model call record for the task"}
        steps = calls.get("steps", {})
        recalls = sum(n - 1 for n in steps.values() if n > 1)
        extra_tokens = 0
        seen: set = set()
        for c in calls.get("log", []):
            if c["step"] in seen:
                extra_tokens += c["tokens"]
            seen.add(c["step"])
        allowed = len(interrupted)
        ok = recalls <= allowed
        return {"verdict": PASS if ok else FAIL, "model_recalls": recalls, "allowed": allowed,
                "extra_tokens": extra_tokens, "calls": calls.get("calls", 0),
                "detail": f"{recalls} extra model call(s), {allowed} allowed (one per interrupted attempt)"}

    def fault_applied():
        if not task["faults"]:
            return {"verdict": PASS, "detail": "no fault planned"}
        mine = {r["instance"]: r for r in receipts if r["task_id"] == tid}
        verdicts = []
        details = []
        for f in task["faults"]:
            r = mine.get(f["instance"])
            if r is None:
                verdicts.append(UNKNOWN)
                details.append(f"{f['instance']}: no receipt")
                continue
            verdicts.append({"applied": PASS, "not_applied": NOT_APPLIED}.get(r["status"], UNKNOWN))
            details.append(f"{f['instance']}: {r['status']} ({r['detail']})")
        return {"verdict": merge(verdicts), "detail": "; ".join(details)}

    if end is None:
        # The task never reached an end (e.g. the harness failed first): nothing can be judged.
        why = {"verdict": UNKNOWN, "detail": "the task has no task_end in the timeline (it did not run to an end)"}
        for name in ("completed", "resume_equivalent", "no_double_apply", "no_model_recall", "fault_applied"):
            checks[name] = dict(why)
    for name, fn in () if end is None else (("completed", completed), ("resume_equivalent", resume_equivalent),
                     ("no_double_apply", no_double_apply), ("no_model_recall", no_model_recall),
                     ("fault_applied", fault_applied)):
        checks[name] = _check(fn)
    verdict = merge(c["verdict"] for c in checks.values())
    signature = "+".join(sorted(k for k, c in checks.items() if c["verdict"] == FAIL)) or None
    return {"task_id": tid, "seed": task["seed"], "runner": task["runner"],
            "faults": [f["fault_id"] for f in task["faults"]], "verdict": verdict, "signature": signature,
            "attempts": len(attempts), "interrupted": bool(interrupted),
            "model_recalls": checks["no_model_recall"].get("model_recalls"),
            "extra_tokens": checks["no_model_recall"].get("extra_tokens"), "checks": checks}


def grade_wave(results_dir: str | Path) -> dict:
    """Grade every task of a stored wave and write `<task>.grade.json`; returns the wave result."""
    d = Path(results_dir)
    plan = _load(d / "plan.json")
    if plan is None:
        raise FileNotFoundError(f"{d}/plan.json not found: not a wave results directory")
    timeline = _lines(d / "timeline.jsonl")
    receipts = _load(d / "faults.json", []) or []
    calls = (_load(d / "model-calls.json", {}) or {}).get("tasks", {})
    sweep = _load(d / "sandbox-sweep.json")
    audit = _load(d / "store-audit.json")
    harness_errors = [e["error"] for e in timeline if e["event"] == "harness_error"]
    grades = []
    for task in plan["tasks"]:
        tid = task["task_id"]
        events = [e for e in timeline if e.get("task") == tid]
        try:
            artifact = read_artifact(d / "artifacts" / tid)
        except Exception:  # noqa: BLE001
            artifact = None
        g = grade_task(task, events, receipts, calls.get(tid, {"calls": 0, "tokens": 0, "steps": {}, "log": []})
                       if d.joinpath("model-calls.json").exists() else None, artifact)
        if g["verdict"] != PASS:
            _write_evidence(d, tid, g)
        (d / f"{tid}.grade.json").write_bytes(orjson.dumps(g, option=orjson.OPT_INDENT_2))
        grades.append(g)
    leaks = {"sandboxes": (sweep or {}).get("leaked", []) if sweep is not None else None,
             "incomplete_uploads": (audit or {}).get("incomplete_uploads") if audit is not None else None}
    wave_checks = {
        "no_leaked_sandbox": PASS if leaks["sandboxes"] == [] else (UNKNOWN if leaks["sandboxes"] is None else FAIL),
        "no_leaked_upload": PASS if leaks["incomplete_uploads"] == [] else (
            UNKNOWN if leaks["incomplete_uploads"] is None else FAIL),
        "harness": FAIL if harness_errors else PASS,
    }
    verdict = merge([g["verdict"] for g in grades] + [v if k != "harness" else (UNKNOWN if v == FAIL else PASS)
                                                      for k, v in wave_checks.items()])
    result = {"wave_id": plan["wave_id"], "verdict": verdict, "tasks": grades, "wave_checks": wave_checks,
              "leaks": leaks, "harness_errors": harness_errors, "plan": plan,
              "figures": next((e for e in reversed(timeline) if e["event"] == "wave_end"), {})}
    return result


def _write_evidence(d: Path, tid: str, g: dict) -> None:
    ev = d / "evidence" / tid
    ev.mkdir(parents=True, exist_ok=True)
    (ev / "grade.json").write_bytes(orjson.dumps(g, option=orjson.OPT_INDENT_2))
    logs = sorted((d / "sandboxes").glob(f"{tid}-a*/runner.log"))
    with open(ev / "runner-logs.txt", "w") as out:
        for p in logs:
            out.write(f"==> {p.parent.name}\n{p.read_text(errors='replace')}\n")


def exit_code(result: dict) -> int:
    """0 all passed, 1 a verdict failed, 2 unknown / not applied / harness error."""
    if result.get("harness_errors") or result.get("harness_error"):
        return 2
    return {PASS: 0, FAIL: 1}.get(result["verdict"], 2)
