"""A wave's grade, as numbered steps: read what it stored, attribute the store's requests, grade the references and
then the tasks, write the grades and evidence, and the wave's own checks (leaks, positive control, store audit,
harness); and the exit code."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import orjson

from cluster import results
from cluster.grade.evidence import redact, redact_grades, write_evidence
from cluster.grade.history import Attribution, TaskHistory, attribute, reference_for, task_history
from cluster.grade.inputs import WaveRecord, read_wave
from cluster.grade.task import grade_task
from cluster.grade.verdicts import FAIL, PASS, UNKNOWN, merge
from fleet.dockerapi import LISTING_ERROR


def _once_each(reaps: list[dict]) -> list[dict]:
    """One entry per sandbox (a sandbox whose escaped processes took two passes to reap is one leak)."""
    out: dict[str, dict] = {}
    for r in reaps:
        out.setdefault(r.get("sandbox_id"), r)
    return list(out.values())


def _harness_errors(w: WaveRecord) -> list[str]:
    errors = [e["error"] for e in w.timeline if e["event"] == "harness_error"]
    if w.hfault is not None and not any(err.startswith("harness fault:") for err in errors):
        f = w.hfault
        errors.insert(0, f"harness fault: {f['part']}: {f['why']}. {f.get('hint', '')}")
    return errors


def ungraded(task: dict, why: str) -> dict:
    """The grade of a task the grader could not grade (its history could not be built): `unknown`, naming why."""
    return {"task_id": task.get("task_id"), "role": task.get("role", "task"), "seed": task.get("seed"),
            "runner": task.get("runner"), "workload": task.get("workload"),
            "faults": [f.get("fault_id") for f in task.get("faults") or [] if isinstance(f, dict)],
            "triggers": [], "verdict": UNKNOWN, "signature": None, "attempts": 0, "harness_fault": None,
            "interrupted": False, "ended": False, "model_recalls": None, "not_exercised": [],
            "attempt_causes": [], "wasted_calls": None, "wasted_tokens": None,
            "reference_key": (task.get("reference") or {}).get("key"), "resume_s": [], "wall_s": None,
            "store_write_ms_per_step": None,
            "checks": {"graded": {"verdict": UNKNOWN, "detail": f"the grader could not grade this task: {why}"}}}


def _graded(w: WaveRecord, at: Attribution, task: dict, ref_verdict: dict | None,
            hist_of: dict[str, TaskHistory]) -> dict:
    """One task's grade; a history the grader cannot build (a record it did not foresee) is `unknown`, named,
    never a crash that leaves the wave with no grade at all."""
    try:
        h = task_history(w, at, task)
        if ref_verdict is not None:
            h.reference = reference_for(w, task, ref_verdict, h)
        hist_of[task["task_id"]] = h
        return grade_task(h)
    except Exception as exc:  # noqa: BLE001 - the wave is always graded
        hist_of[task["task_id"]] = TaskHistory(task=task)
        return ungraded(task, f"{type(exc).__name__}: {exc}")


def grade_tasks(w: WaveRecord, at: Attribution) -> tuple[list[dict], list[dict], dict[str, TaskHistory]]:
    """The references first (each task is compared with its own), then the tasks."""
    hist_of: dict[str, TaskHistory] = {}
    ref_grades = [_graded(w, at, t, None, hist_of)
                  for t in {t["task_id"]: t for t in w.plan.get("references", [])}.values()]
    ref_verdict = {g["task_id"]: g for g in ref_grades}
    grades = [_graded(w, at, task, ref_verdict, hist_of) for task in w.plan["tasks"]]
    return grades, ref_grades, hist_of


def write_grades(w: WaveRecord, grades: list[dict], hist_of: dict, secrets: tuple) -> None:
    """`<task>.grade.json` with the digests of every input it was graded from; evidence for any not passed."""
    for g in grades:
        g["inputs"] = {"digests": dict(sorted(w.inp.digests.items())), "unreadable": dict(w.inp.unreadable)}
        if w.inp.skipped:  # records left out for their shape (only then: a grade keeps its stored form)
            g["inputs"]["skipped"] = skipped_of(w)
        art = w.out.artifact_manifest(g["task_id"])
        if os.path.lexists(art):  # read as a regular file only: a FIFO there hung `grade` (a review's H2)
            try:
                g["inputs"]["digests"][art.relative_to(w.d).as_posix()] = hashlib.sha256(
                    results.regular_bytes(art)).hexdigest()
            except (OSError, ValueError) as exc:
                g["inputs"]["unreadable"][art.relative_to(w.d).as_posix()] = str(exc)
        if g["verdict"] != PASS:
            write_evidence(w.d, g, hist_of[g["task_id"]], tuple(secrets))
        results.write_stored(w.out.grade(g["task_id"]), orjson.dumps(g, option=orjson.OPT_INDENT_2))


def skipped_of(w: WaveRecord) -> dict:
    """The records the grader left out, by file: how many and the first few, with why (a field of another type)."""
    return {name: {"count": w.inp.skipped_count.get(name, len(first)), "first": first}
            for name, first in sorted(w.inp.skipped.items())}


def runner_own_failure(w: WaveRecord, g: dict) -> list[str] | None:
    """A failed reference that is the runner's own doing, with no fault and nothing of the harness in its way: every
    attempt ended by the runner's own exit, or killed for a silence `liveness` found a hang (no other kill, no start
    or host error), and every check it did not pass
    failed (none unknown), or `completed` failed (a runner that never finishes leaves no artifact, so checks of the
    artifact are unknown because of it). Then its failures are the runner's defect, shown by the fault-free run
    itself (a leaked upload, a write outside its prefix, an exit before its steps were done), not a baseline the
    harness broke. Returns `check: detail` per failure, or None."""
    ends = [e for e in w.timeline if e["event"] == "attempt_end" and e.get("task") == g["task_id"]]
    # an attempt the harness ended for its silence is the runner's own doing when `liveness` calls it a hang (the
    # host was not overloaded: a starved attempt is `unknown` there, and stays a broken control)
    hung = g["checks"].get("liveness", {}).get("verdict") == FAIL
    by_itself = bool(ends) and all(((e.get("exit_code") is not None and not e.get("killed_by"))
                                    or (hung and str(e.get("killed_by") or "").startswith("silent")))
                                   and not e.get("error") and not e.get("start_error") for e in ends)
    bad = {k: c for k, c in g["checks"].items() if c["verdict"] != PASS}
    unfinished = bad.get("completed", {}).get("verdict") == FAIL
    if not by_itself or not bad or (not unfinished and any(c["verdict"] != FAIL for c in bad.values())):
        return None
    return [f"{k}: {c['detail']}" for k, c in bad.items() if c["verdict"] == FAIL]


def _clip(text: str, n: int) -> str:
    """At most n characters, cut at a word with an ellipsis (a reason cut mid-word reads as another word)."""
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " ..."


def last_words(h: TaskHistory | None) -> str | None:
    """The last line of output of a task's last attempt (its runner.log, already redacted by value; redacted by
    shape again here), so a failure quotes what the runner said about it: `can't open file`, `command not found`."""
    tails = (h.log_tails if h is not None else None) or {}
    lines = [x.strip() for x in (tails[max(tails)] if tails else "").splitlines() if x.strip()]
    return redact(lines[-1])[:200] if lines else None


def runner_failures(w: WaveRecord, ref_grades: list[dict], hist_of: dict | None = None) -> list[str]:
    """What the runner fails with no fault at all (its references): a wave verdict `fail` (exit 1) with these reasons,
    never a harness error (a CI that retries exit-2 waves as flakes would never fail such a runner). Each quotes the
    reference's last line of output, or says it printed none."""
    out = []
    for g in ref_grades:
        own = runner_own_failure(w, g) if g["verdict"] != PASS else None
        if own:
            said = last_words((hist_of or {}).get(g["task_id"]))
            out.append(f"the fault-free reference run {g['task_id']} of this runner fails on its own: "
                       f"{_clip('; '.join(own), 400)}; its last line of output: "
                       + (repr(said) if said else "none (it printed nothing)"))
    return out


def _control_errors(w: WaveRecord, ref_grades: list[dict]) -> list[str]:
    """The positive control (every reference passes, in a wave with faults) and that something could start. A
    reference that fails on the runner's own (`runner_own_failure`) is the runner's failure, not a broken
    control."""
    out = []
    bad_refs = [g for g in ref_grades if g["verdict"] != PASS and runner_own_failure(w, g) is None]
    # (after a harness fault the references' own results are the fault's doing: that error is already named; a
    # wave that never got its parts up, such as a cluster that refused the driver, ran no reference at all)
    ran = any(e["event"] in ("parts_ready", "attempt_end") for e in w.timeline)
    if bad_refs and ran and any(t["faults"] for t in w.plan["tasks"]) and w.hfault is None:
        g0 = bad_refs[0]
        why = next((f"{k}: {c['detail']}" for k, c in g0["checks"].items() if c["verdict"] != PASS), g0["verdict"])
        out.append(
            f"positive control {len(ref_grades) - len(bad_refs)}/{len(ref_grades)} (must be 1.0): the uninterrupted, "
            f"fault-free run {g0['task_id']} of this runner is {g0['verdict']} ({why[:300]}); with no clean baseline "
            "the wave cannot tell what its faults did")
    starts = [e for e in w.timeline if e["event"] == "attempt_end"]
    if starts and all(e.get("start_error") for e in starts):
        out.append(f"no task could start: {starts[0]['start_error']}")
    return out


def leaks_of(w: WaveRecord) -> dict:
    sweep, sweeper, audit = w.sweep, w.sweeper, w.audit
    return {"sandboxes": (sweep or {}).get("leaked", []) if sweep is not None else None,
            # the sweep actor's: alive with no lease for longer than its settle window (then reaped), or still
            # there at its last pass
            "sandboxes_sweeper": None if sweeper is None else _once_each(
                [dict(r, by="sweep actor") for r in sweeper.get("reaped") or []] +
                [dict(r, by="sweep actor (left at the end)") for r in sweeper.get("left_at_end") or []]),
            "incomplete_uploads": (audit or {}).get("incomplete_uploads") if audit is not None else None}


def wave_checks_of(w: WaveRecord, leaks: dict, ref_grades: list[dict], harness_errors: list[str]) -> dict:
    # a look that could not be whole proves nothing absent: the hosts' sweep with problems (a host that did not
    # answer, a cancel that timed out), a sweep actor that did not report or could not list the containers
    sweep, sweeper, audit = w.sweep, w.sweeper, w.audit
    # (or a sandbox node whose own scan did not answer at the sweep actor's last pass: nothing is known of it)
    # (containers not listed leave it open only for a wave that makes containers: a process-backend wave's sandboxes
    # are cgroups, processes and mounts, all looked at, and a stopped engine beside it hides none of them)
    cfg = w.plan.get("config") if isinstance(w.plan.get("config"), dict) else {}
    docker = not isinstance(cfg.get("sandbox"), dict) or cfg["sandbox"].get("backend") != "process"
    # (no sweep actor report is a wave from before it existed; one that is there but unreadable proves nothing)
    looked = (sweep is not None and not sweep.get("problems")) and results.SWEEPER not in w.inp.unreadable and (
        sweeper is None or not (sweeper.get("unavailable") or sweeper.get("unanswered_nodes") or (
            docker and any(e.startswith(LISTING_ERROR) for e in sweeper.get("errors") or []))))
    return {
        # after a harness fault, sandboxes its lost part left are the harness's, not a leak to judge
        "no_leaked_sandbox": (UNKNOWN if w.hfault is not None else FAIL) if (leaks["sandboxes"] or
                                                                            leaks["sandboxes_sweeper"]) else (
            PASS if looked else UNKNOWN),
        "no_leaked_upload": PASS if leaks["incomplete_uploads"] == [] else (
            UNKNOWN if leaks["incomplete_uploads"] is None else FAIL),
        "positive_control": merge(g["verdict"] for g in ref_grades),
        # the store audit: objects that differ from what their writer sent, short reads, keys outside tasks
        "store_audit": UNKNOWN if audit is None else (
            FAIL if [f for f in audit.get("findings") or [] if f["signature"] != "incomplete_multipart_upload"]
            else PASS),
        "harness": FAIL if harness_errors else PASS,
    }


def grade_wave(results_dir: str | Path, secrets: tuple = ()) -> dict:
    """Grade every task of a stored wave and write `<task>.grade.json`; returns the wave result."""
    w = read_wave(Path(results_dir))
    harness_errors = _harness_errors(w)
    grades, ref_grades, hist_of = grade_tasks(w, attribute(w))
    redact_grades(grades + ref_grades, secrets)  # (a detail may quote an object's name a runner chose)
    write_grades(w, grades + ref_grades, hist_of, secrets)
    harness_errors += _control_errors(w, ref_grades)
    leaks = leaks_of(w)
    own = [g for g in grades if (g["checks"].get("resume_equivalent") or {}).get("reference") == "self"]
    wave_checks = wave_checks_of(w, leaks, ref_grades + own, harness_errors)  # (a task that was its own reference
    # is an uninterrupted, fault-free run: the positive control holds it too)
    verdict = merge([g["verdict"] for g in grades] + [v if k != "harness" else (UNKNOWN if v == FAIL else PASS)
                                                      for k, v in wave_checks.items()])
    timeline = w.timeline
    interrupted = next((e.get("signal") for e in timeline if e["event"] == "wave_interrupted"), None)
    if any(e["event"] == "wave_stopped_at_once" for e in timeline):
        interrupted = f"{interrupted or 'a signal'}, then stopped at once (nothing was cleaned up in order)"
    return {"wave_id": w.plan["wave_id"], "verdict": verdict, "tasks": grades, "references": ref_grades,
            "interrupted": interrupted, "harness_fault": w.hfault,
            "resumed": [e for e in timeline if e["event"] == "wave_resumed"],
            "wave_checks": wave_checks, "leaks": leaks, "harness_errors": harness_errors,
            "runner_failures": runner_failures(w, ref_grades, hist_of), "plan": w.plan,
            "warnings": [e["warning"] for e in timeline if e["event"] == "fleet_warning"
                         and isinstance(e.get("warning"), str)],
            "inputs": {"digests": w.inp.digests, "unreadable": w.inp.unreadable, "skipped": skipped_of(w)},
            "figures": next((e for e in reversed(timeline) if e["event"] == "wave_end"), {})}


def ungraded_wave(plan: dict, why: str) -> dict:
    """The result of a wave the grader could not grade at all: every task `unknown` and a harness error naming
    why, so the wave still writes SUMMARY.md, verdict.json and index.html (exit 2), never only a traceback."""
    return {"wave_id": plan.get("wave_id"), "verdict": UNKNOWN,
            "tasks": [ungraded(t, why) for t in plan.get("tasks") or [] if isinstance(t, dict)],
            "references": [ungraded(t, why) for t in plan.get("references") or [] if isinstance(t, dict)],
            "interrupted": None, "harness_fault": None, "resumed": [],
            "wave_checks": {"no_leaked_sandbox": UNKNOWN, "no_leaked_upload": UNKNOWN, "positive_control": UNKNOWN,
                            "store_audit": UNKNOWN, "harness": FAIL},
            "leaks": {"sandboxes": None, "sandboxes_sweeper": None, "incomplete_uploads": None},
            "harness_errors": [f"the grader could not grade this wave: {why}"], "runner_failures": [],
            "plan": plan, "inputs": {"digests": {}, "unreadable": {}, "skipped": {}}, "figures": {}}


def exit_code(result: dict) -> int:
    """0 all passed, 1 a verdict failed, 2 unknown / not applied / harness error."""
    if result.get("harness_errors") or result.get("harness_error"):
        return 2
    return {PASS: 0, FAIL: 1}.get(result["verdict"], 2)
