"""Grading: reads only what a wave stored under `results/<wave>/` and gives every task
a verdict. Checks have three outcomes plus `not_applied`; a check that crashes is
`unknown`, never `pass`. Merge order: fail > unknown > not_applied > pass.

Nothing here imports a runner: the inputs are the artifact the harness captured
from the workspace, the reference (an uninterrupted run of the same runner on the
same seed), the model endpoint's and effects service's logs, the proxy's request
log and the driver's timeline. The workload (the test's world) says which steps
leave a marker in the artifact and which effect belongs to which step.

Checks per task:
- completed: the last attempt exited 0, the harness captured `repo/`, every
  workspace step's marker and every external effect of the script is there.
- resume_equivalent: the artifact's digest equals the reference's. If two
  uninterrupted runs of one seed differ, `unknown` (the runner is not
  deterministic under a fixed model), never pass or fail.
- no_double_apply: no step's marker twice in the artifact, and no effect applied
  twice in the effects log (a repeated Idempotency-Key is a deduplicated retry).
- no_model_recall: asking again for a step whose result had been recorded is a
  recall. Only the answer that was in flight when its attempt ended is forgiven:
  not delivered, or delivered to an attempt that then ended with no later model
  call, no effect of that step and no store write.
- fault_applied: every planned fault's receipt says applied.
"""
from __future__ import annotations

import hashlib
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from cluster import checks as checks_mod
from cluster import results
from cluster.artifacts import read_artifact
from cluster.verdicts import (ERROR_WORDS, FAIL, NOT_APPLIED, OVERLOAD_PER_CORE, PASS, RANK, UNKNOWN,  # noqa: F401
                              WRITE_METHODS, merge)
from fleet.dockerapi import LISTING_ERROR

class Unreadable(Exception):
    """An input file exists but cannot be read or parsed: whatever depends on it is unknown."""


class Inputs:
    """Reads the wave's files, and remembers a digest of every input it read (stored with each grade)."""

    def __init__(self, d: Path):
        self.d = d
        self.digests: dict[str, str] = {}
        self.unreadable: dict[str, str] = {}

    def _bytes(self, name: str) -> bytes | None:
        try:
            data = (self.d / name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.unreadable[name] = str(exc)
            raise Unreadable(f"{name}: {exc}") from None
        self.digests[name] = hashlib.sha256(data).hexdigest()
        return data

    def json(self, name: str, default=None):
        data = self._bytes(name)
        if data is None:
            return default
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            self.unreadable[name] = f"not valid JSON: {exc}"
            raise Unreadable(f"{name}: not valid JSON: {exc}") from None

    REQUIRED = {results.TIMELINE: ("event",), results.MODEL_CALLS: ("task", "step", "t"),
                results.EFFECTS: ("task", "effect_id", "t"), results.PROXY_REQUESTS: ("t", "method")}

    def lines(self, name: str) -> list[dict] | None:
        """JSON lines; None when the file is missing. Only a torn last line is tolerated; a line of the
        wrong shape makes the file unreadable (never a traceback, never a silent pass)."""
        data = self._bytes(name)
        if data is None:
            return None
        need = self.REQUIRED.get(name, ())
        try:
            return results.parse_jsonl(data, need)
        except results.JsonlError as exc:
            self.unreadable[name] = str(exc)
            why = exc.why if need or not exc.why.startswith("not a record") else "not a record with fields"
            raise Unreadable(f"{name} line {exc.line}: {why}") from None

    def lines_or_none(self, name: str) -> list[dict] | None:
        try:
            return self.lines(name)
        except Unreadable:
            return None




@dataclass
class TaskHistory:
    """Everything stored about one task, as the grader sees it."""

    task: dict
    events: list[dict] = field(default_factory=list)
    receipts: list[dict] = field(default_factory=list)
    calls: list[dict] | None = None
    effects: list[dict] | None = None
    writes: list[dict] | None = None  # 2xx store writes under the task's prefix (proxy log)
    artifact: dict[str, bytes] | None = None
    artifact_error: str | None = None  # the capture exists but cannot be read: unknown, never fail
    reference: dict | None = None  # {"digest", "uninterrupted_digests": set} or {"why"}
    harness_fault: dict | None = None  # a part of the harness died during the wave (timeline `harness_fault`)
    foreign_writes: list[dict] | None = None  # its attempts' writes outside its prefix; None = not attributable
    leaked_uploads: list[dict] | None = None  # multipart uploads under its prefix left incomplete; None = no audit
    damaged_by: list[dict] = field(default_factory=list)  # other tasks' applied writes into its prefix
    requests: list[dict] | None = None  # every proxy request of its attempts (by key id) or under its prefix
    log_tails: dict[int, str] = field(default_factory=dict)  # attempt -> last lines of its runner.log
    limits: dict = field(default_factory=dict)  # max_attempts, liveness_s, retry_loop_n from the plan
    fenced: list[dict] = field(default_factory=list)  # its calls the services refused (revoked attempt keys)
    host_load: list[dict] = field(default_factory=list)  # {"t", "running", "cores"}: runnable tasks on the host


def _check(fn) -> dict:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a crashed check is unknown
        return {"verdict": UNKNOWN, "detail": f"check crashed: {type(exc).__name__}: {exc}",
                "trace": traceback.format_exc(limit=3)}


def _attempt_windows(events: list[dict]) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for e in events:
        if e["event"] == "attempt_start":
            out.setdefault(e["attempt"], {})["start"] = e.get("wall")
        elif e["event"] == "attempt_end":
            w = out.setdefault(e["attempt"], {})
            w["end"] = e.get("ended_at") or e.get("wall")
            w["exit_code"] = e.get("exit_code")
    return out


def recall_analysis(calls: list[dict], effects: list[dict], writes: list[dict], events: list[dict]) -> dict:
    """Which repeated model calls were recalls of recorded steps, and which were forgiven in-flight answers."""
    windows = _attempt_windows(events)
    calls = sorted(calls, key=lambda c: c["t"])
    by_step: dict[int, list[dict]] = {}
    recalls, forgiven = [], []
    for c in calls:
        prev = by_step.setdefault(c["step"], [])
        if prev:
            p = prev[-1]
            reasons = []
            if p.get("delivered", True):
                if p.get("attempt") == c.get("attempt"):
                    reasons.append("the same attempt asked again after the answer was delivered")
                later = [x for x in calls if x.get("attempt") == p.get("attempt") and p["t"] < x["t"] < c["t"]
                         and x is not p]
                if later:
                    reasons.append(f"attempt {p.get('attempt')} had already moved on to step {later[0]['step']}")
                fx = [e for e in effects if e.get("step") == c["step"] and e["t"] < c["t"]]
                if fx:
                    reasons.append(f"the step's effect {fx[0]['effect_id']} was recorded at {fx[0]['t']:.3f}")
                end = (windows.get(p.get("attempt")) or {}).get("end") or c["t"]
                # a write the attempt sent after the answer and before it ended, that the store had COMMITTED
                # (answered 2xx) before the step was asked again: a resuming runner could have seen it. A write
                # still in flight when the new attempt looked (a slow store) could not have been seen.
                # (a DELETE records nothing: it cannot be where the answer was made durable)
                w = [x for x in writes if p.get("t_done", p["t"]) <= x["t"] <= min(end, c["t"])
                     and x["t"] + (x.get("ms") or 0) / 1000 <= c["t"] and x.get("method") != "DELETE"]
                if w:
                    reasons.append(f"attempt {p.get('attempt')} wrote {w[0]['key']} to the store after the answer")
                if (windows.get(p.get("attempt")) or {}).get("exit_code") == 0:
                    reasons.append(f"attempt {p.get('attempt')} exited 0")
            entry = {"step": c["step"], "t": c["t"], "attempt": c.get("attempt"), "tokens": c.get("tokens", 0),
                     "previous_attempt": p.get("attempt")}
            (recalls if reasons else forgiven).append({**entry, "why": "; ".join(reasons) or
                                                       "the previous answer was in flight when its attempt ended"})
        prev.append(c)
    return {"recalls": recalls, "forgiven": forgiven}


def grade_task(h: TaskHistory) -> dict:
    """Every check that applies to the task (cluster/checks.py's registry), each through the check-safe wrapper,
    then what a harness fault or another task's damage makes of them, and the task's figures."""
    facts = checks_mod.Facts.of(h)
    task, tid, attempts, end, interrupted = facts.task, facts.tid, facts.attempts, facts.end, facts.interrupted
    checks: dict[str, dict] = {}
    for c in checks_mod.applicable(h, facts):
        if end is None:
            checks[c.name] = {"verdict": UNKNOWN, "detail": "the task has no task_end in the timeline "
                                                            "(it did not run to an end)"}
        else:
            checks[c.name] = _check(lambda c=c: c.fn(h, facts))
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
    verdict = merge(c["verdict"] for c in checks.values())
    # metrics: time to resume (an attempt's end -> the next attempt's first model request), store write time
    # per step, wall time from the first attempt's start to the task's end
    resume_s = []
    for a in attempts:
        if a.get("exit_code") == 0 or not (a.get("ended_at") or a.get("wall")):
            continue
        nxt = [c["t"] for c in h.calls or [] if c.get("attempt") == a["attempt"] + 1]
        if nxt:
            resume_s.append(round(min(nxt) - (a.get("ended_at") or a["wall"]), 3))
    first = min((e["wall"] for e in h.events if e["event"] == "attempt_start"), default=None)
    wall_s = round(end["wall"] - first, 3) if end is not None and first is not None and "wall" in end else None
    commit_ms = round(sum(w.get("ms") or 0 for w in h.writes or []) / max(1, task["steps"]), 2) \
        if h.writes is not None else None
    signature = "+".join(sorted(k for k, c in checks.items() if c["verdict"] == FAIL)) or None
    recall = checks["no_model_recall"]
    return {"task_id": tid, "role": task.get("role", "task"), "seed": task["seed"], "runner": task["runner"],
            "workload": task.get("workload"), "faults": [f["fault_id"] for f in task["faults"]],
            "triggers": [f.get("trigger", "time") + (f":{f['params']['variant']}" if f.get("trigger") == "store_write"
                                                     else "") for f in task["faults"]],
            "verdict": verdict, "signature": signature, "attempts": len(attempts),
            "harness_fault": hf["part"] if touched else None,
            "interrupted": bool(interrupted), "ended": end is not None, "model_recalls": recall.get("model_recalls"),
            "not_exercised": (checks.get("fault_applied") or {}).get("not_exercised") or [],
            "attempt_causes": [a.get("cause") or f"exit {a.get('exit_code')}" for a in attempts],
            "wasted_calls": recall.get("wasted_calls"), "wasted_tokens": recall.get("wasted_tokens"),
            "reference_key": (task.get("reference") or {}).get("key"), "resume_s": resume_s, "wall_s": wall_s,
            "store_write_ms_per_step": commit_ms, "checks": checks}


def _read_artifact_safe(adir: Path):
    try:
        got = read_artifact(adir)
    except Exception as exc:  # noqa: BLE001 - a damaged capture is unreadable, not a runner's fault
        return None, f"unreadable: {exc}"
    return (got[0], None) if got else (None, "no artifact captured")


def _once_each(reaps: list[dict]) -> list[dict]:
    """One entry per sandbox (a sandbox whose escaped processes took two passes to reap is one leak)."""
    out: dict[str, dict] = {}
    for r in reaps:
        out.setdefault(r.get("sandbox_id"), r)
    return list(out.values())


def grade_wave(results_dir: str | Path, secrets: tuple = ()) -> dict:
    """Grade every task of a stored wave and write `<task>.grade.json`; returns the wave result."""
    from fleet.workloads.base import tree_digest

    d = Path(results_dir)
    out = results.ResultsDir(d)
    inp = Inputs(d)
    plan = inp.json(results.PLAN)  # the plan and the timeline are the spine: unreadable = no grade (Unreadable)
    if plan is None:
        raise FileNotFoundError(f"{d / results.PLAN} not found: not a wave results directory")
    timeline = inp.lines(results.TIMELINE) or []
    try:
        receipts = inp.json(results.FAULTS, []) or []
    except Unreadable:
        receipts = []  # every planned fault then has no receipt: unknown
    calls = inp.lines_or_none(results.MODEL_CALLS)
    effects = inp.lines_or_none(results.EFFECTS)
    # the driver records how many calls and effects each service logged: a log that lost lines is unreadable
    counts = next((e for e in reversed(timeline) if e["event"] == "service_counts"), None)
    for name, recs, key in ((results.MODEL_CALLS, calls, "model"), (results.EFFECTS, effects, "effects")):
        if counts is None or recs is None:
            continue
        got: dict = {}
        for r in recs:
            got[r["task"]] = got.get(r["task"], 0) + 1
        if got != (counts.get(key) or {}):
            inp.unreadable[name] = "its lines do not add up to the counts the driver recorded (lines lost)"
            if key == "model":
                calls = None
            else:
                effects = None
    proxy = inp.lines_or_none(results.PROXY_REQUESTS)
    have_calls, have_fx = calls is not None, effects is not None
    calls, effects = calls or [], effects or []
    try:
        sweep = inp.json(results.SANDBOX_SWEEP)
    except Unreadable:
        sweep = None
    try:
        audit = inp.json(results.STORE_AUDIT)
    except Unreadable:
        audit = None
    try:
        sweeper = inp.json(results.SWEEPER, None)  # the sweep actor's report (no file: a wave before it existed)
    except Unreadable:
        sweeper = None
    harness_errors = [e["error"] for e in timeline if e["event"] == "harness_error"]
    hfault = next((e for e in timeline if e["event"] == "harness_fault"), None)
    if hfault is not None and not any(err.startswith("harness fault:") for err in harness_errors):
        harness_errors.insert(0, f"harness fault: {hfault['part']}: {hfault['why']}. {hfault.get('hint', '')}")
    wave_id = plan["wave_id"]

    # keys whose PUT an injected ST6 cut: the store may hold an empty object there whatever was written
    # later, so no write to them counts as a record a resuming runner could have read
    cut_keys = {r.get("key") for r in proxy or [] if r.get("cut")}
    # attribution: every request signed by an attempt's own key belongs to that attempt's task
    owner = {e["akid"]: e["task"] for e in timeline if e["event"] in ("attempt_start", "key_rotated")
             and e.get("akid")}
    bucket = (audit or {}).get("bucket") or "sf-" + hashlib.sha256(wave_id.encode()).hexdigest()[:16]
    foreign: dict[str, list] = {}
    damaged: dict[str, list] = {}
    if owner and proxy is not None:
        for r in proxy:
            tid_w = owner.get(r.get("akid"))
            if tid_w is None or r.get("method") not in WRITE_METHODS:
                continue
            own = f"{wave_id}/{tid_w}/"
            if r.get("bucket") == bucket and (r.get("key") or "").startswith(own):
                continue
            rec = {"t": r["t"], "method": r["method"], "key": r.get("key"), "status": r.get("status"), "by": tid_w}
            foreign.setdefault(tid_w, []).append(rec)
            parts = (r.get("key") or "").split("/")
            if 200 <= (r.get("status") or 0) < 300 and len(parts) > 2 and parts[0] == wave_id:
                damaged.setdefault(parts[1], []).append(rec)

    fenced = inp.lines_or_none(results.FENCED) or []
    host_load = inp.lines_or_none(results.HOST_LOAD) or []
    cfg = plan.get("config") or {}
    limits = {"max_attempts": cfg.get("max_attempts"), "liveness_s": cfg.get("liveness_s"),
              "retry_loop_n": cfg.get("retry_loop_n")}

    def history(task: dict) -> TaskHistory:
        tid = task["task_id"]
        prefix = f"{wave_id}/{tid}/"
        art, why = _read_artifact_safe(out.artifact(tid))
        return TaskHistory(
            requests=None if proxy is None else [
                r for r in proxy if owner.get(r.get("akid")) == tid or (r.get("key") or "").startswith(prefix)],
            log_tails=_log_tails(d, tid), limits=limits, fenced=[f for f in fenced if f.get("task") == tid],
            host_load=host_load,
            task=task, events=[e for e in timeline if e.get("task") == tid], receipts=receipts,
            calls=[c for c in calls if c["task"] == tid] if have_calls else None,
            effects=[e for e in effects if e["task"] == tid] if have_fx else None,
            writes=None if proxy is None else [
                r for r in proxy if r.get("key", "").startswith(prefix) and r.get("method") in WRITE_METHODS
                and 200 <= (r.get("status") or 0) < 300 and r.get("key") not in cut_keys],
            artifact=art, artifact_error=None if art is not None or why.startswith("no artifact") else why,
            harness_fault=hfault, foreign_writes=foreign.get(tid, []) if owner else None,
            leaked_uploads=None if audit is None else [u for u in audit.get("incomplete_uploads") or []
                                                       if u["key"].startswith(prefix)],
            damaged_by=damaged.get(tid, []))

    refs = {t["task_id"]: t for t in plan.get("references", [])}
    ref_grades = []
    hist_of: dict[str, TaskHistory] = {}
    for t in refs.values():
        hist_of[t["task_id"]] = history(t)
        g = grade_task(hist_of[t["task_id"]])
        ref_grades.append(g)
    ref_verdict = {g["task_id"]: g for g in ref_grades}
    grades = []
    for task in plan["tasks"]:
        h = history(task)
        r = task.get("reference") or {}
        rtid = r.get("task_id")
        rart, why = _read_artifact_safe(out.artifact(rtid)) if rtid else (None, "no reference planned")
        rg = ref_verdict.get(rtid)
        if rg is not None and rg["checks"]["completed"]["verdict"] != PASS:
            h.reference = {"why": f"the reference run {rtid} did not complete: "
                                  f"{rg['checks']['completed']['detail']}"}
        elif rart is None:
            h.reference = {"why": f"reference {rtid}: {why}"}
        else:
            h.reference = {"digest": tree_digest(rart)}
        hist_of[task["task_id"]] = h
        grades.append(grade_task(h))
    for g in grades + ref_grades:
        g["inputs"] = {"digests": dict(sorted(inp.digests.items())), "unreadable": dict(inp.unreadable)}
        art = out.artifact_manifest(g["task_id"])
        if art.exists():
            g["inputs"]["digests"][art.relative_to(d).as_posix()] = hashlib.sha256(
                art.read_bytes()).hexdigest()
        if g["verdict"] != PASS:
            _write_evidence(d, g, hist_of[g["task_id"]], tuple(secrets))
        out.grade(g["task_id"]).write_bytes(orjson.dumps(g, option=orjson.OPT_INDENT_2))
    bad_refs = [g for g in ref_grades if g["verdict"] != PASS]
    # (after a harness fault the references' own results are the fault's doing: that error is already named)
    if bad_refs and any(t["faults"] for t in plan["tasks"]) and hfault is None:
        g0 = bad_refs[0]
        why = next((f"{k}: {c['detail']}" for k, c in g0["checks"].items() if c["verdict"] != PASS), g0["verdict"])
        harness_errors.append(
            f"positive control {len(ref_grades) - len(bad_refs)}/{len(ref_grades)} (must be 1.0): the uninterrupted, "
            f"fault-free run {g0['task_id']} of this runner is {g0['verdict']} ({why[:300]}); with no clean baseline "
            "the wave cannot tell what its faults did")
    starts = [e for e in timeline if e["event"] == "attempt_end"]
    if starts and all(e.get("start_error") for e in starts):
        harness_errors.append(f"no task could start: {starts[0]['start_error']}")
    leaks = {"sandboxes": (sweep or {}).get("leaked", []) if sweep is not None else None,
             # the sweep actor's: alive with no lease for longer than its settle window (then reaped), or still
             # there at its last pass
             "sandboxes_sweeper": None if sweeper is None else _once_each(
                 [dict(r, by="sweep actor") for r in sweeper.get("reaped") or []] +
                 [dict(r, by="sweep actor (left at the end)") for r in sweeper.get("left_at_end") or []]),
             "incomplete_uploads": (audit or {}).get("incomplete_uploads") if audit is not None else None}
    # a look that could not be whole proves nothing absent: the hosts' sweep with problems (a host that did not
    # answer, a cancel that timed out), a sweep actor that did not report or could not list the containers
    looked = (sweep is not None and not sweep.get("problems")) and (sweeper is None or not (
        sweeper.get("unavailable") or any(e.startswith(LISTING_ERROR) for e in sweeper.get("errors") or [])))
    wave_checks = {
        # after a harness fault, sandboxes its lost part left are the harness's, not a leak to judge
        "no_leaked_sandbox": (UNKNOWN if hfault is not None else FAIL) if (leaks["sandboxes"] or
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
    verdict = merge([g["verdict"] for g in grades] + [v if k != "harness" else (UNKNOWN if v == FAIL else PASS)
                                                      for k, v in wave_checks.items()])
    interrupted = next((e.get("signal") for e in timeline if e["event"] == "wave_interrupted"), None)
    if any(e["event"] == "wave_stopped_at_once" for e in timeline):
        interrupted = f"{interrupted or 'a signal'}, then stopped at once (nothing was cleaned up in order)"
    return {"wave_id": wave_id, "verdict": verdict, "tasks": grades, "references": ref_grades,
            "interrupted": interrupted, "harness_fault": hfault,
            "resumed": [e for e in timeline if e["event"] == "wave_resumed"],
            "wave_checks": wave_checks, "leaks": leaks, "harness_errors": harness_errors, "plan": plan,
            "inputs": {"digests": inp.digests, "unreadable": inp.unreadable},
            "figures": next((e for e in reversed(timeline) if e["event"] == "wave_end"), {})}


def _log_tails(d: Path, tid: str, lines: int = 3) -> dict[int, str]:
    out = {}
    for p in results.ResultsDir(d).runner_logs(tid):
        try:
            n = results.attempt_of(p.parent.name)[1]
            with open(p, "rb") as f:
                f.seek(max(0, p.stat().st_size - 4096))
                out[n] = b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except (ValueError, OSError):
            continue
    return out


# What evidence files must never show: keys and tokens a runner may print (its env, a request it logs).
# Model and effects keys are `sf-` + 32 url-safe characters; store secrets are 40 url-safe characters.
_SECRETS = [
    (re.compile(r"sf-[A-Za-z0-9_-]{32}"), "sf-<redacted>"),  # glued to other text or repeated: still a key
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1<redacted>"),
    (re.compile(r"(?i)\b([A-Z0-9_]*(?:KEY|SECRET|TOKEN|PASSWORD)[A-Z0-9_]*\s*[=:]\s*[\"']?)[^\s\"',;]{6,}"),
     r"\1<redacted>"),
    (re.compile(r"(?i)(\"(?:SecretAccessKey|SessionToken|secret_key|api_key)\"\s*:\s*\")[^\"]+"), r"\1<redacted>"),
    (re.compile(r"(Signature=)[0-9a-f]{64}"), r"\1<redacted>"),
    (re.compile(r"(?<![A-Za-z0-9_-])(?=[A-Za-z0-9_-]{40}(?![A-Za-z0-9_-]))(?![0-9a-f]{40})[A-Za-z0-9_-]{40}"),
     "<redacted:40>"),
]


def redact(text: str, values: list[str] | tuple = ()) -> str:
    """Remove secrets: first every known secret value (the keys the harness issued in this wave), also any
    12-character piece of one (a key cut by a log tail, glued to other text, printed twice); then the shapes
    of the keys the harness hands out (a re-grade no longer knows the values)."""
    if values:
        spans = []
        for v in values:
            if not v or len(v) < 12:
                continue
            for i in range(0, len(v) - 11):
                piece = v[i:i + 12]
                start = text.find(piece)
                while start != -1:
                    spans.append((start, start + 12))
                    start = text.find(piece, start + 1)
        if spans:
            spans.sort()
            merged = [list(spans[0])]
            for a, b in spans[1:]:
                if a <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], b)
                else:
                    merged.append([a, b])
            out, last = [], 0
            for a, b in merged:
                out += [text[last:a], "<redacted>"]
                last = b
            text = "".join(out) + text[last:]
    for pattern, repl in _SECRETS:
        text = pattern.sub(repl, text)
    return text


def _write_evidence(d: Path, g: dict, h: TaskHistory, secrets: tuple = ()) -> None:
    """evidence/<task>/: the grade, the attempts and their causes, the task's store writes, the proxy requests
    and model calls around each fault, the runner's output tail per attempt; secrets redacted."""
    tid = g["task_id"]
    ev = results.ResultsDir(d).evidence(tid)
    ev.mkdir(parents=True, exist_ok=True)

    def put(name: str, data) -> None:
        body = data if isinstance(data, str) else orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
        (ev / name).write_text(redact(body, secrets))

    put(results.EVIDENCE_GRADE, g)
    put(results.EVIDENCE_ATTEMPTS, [e for e in h.events if e["event"] in ("attempt_start", "attempt_end", "task_end")])
    put(results.EVIDENCE_STORE_WRITES, [{k: w.get(k) for k in ("t", "method", "key", "status", "req_bytes", "ms")}
                              for w in (h.writes or [])][:2000])
    fired = sorted(r["fired_at"] for r in h.receipts if r["task_id"] == tid and r.get("fired_at"))

    def near(t: float) -> bool:
        return any(abs(t - f) <= 3.0 for f in fired)
    put(results.EVIDENCE_AROUND_FAULTS, {
        "faults": [r for r in h.receipts if r["task_id"] == tid],
        "proxy_requests": [r for r in h.requests or [] if near(r["t"])][:500],
        "model_calls": [c for c in h.calls or [] if near(c["t"])][:500]})
    out = []
    for p in results.ResultsDir(d).runner_logs(tid):
        try:
            with open(p, "rb") as f:
                start = max(0, p.stat().st_size - 65536)
                f.seek(start)
                tail = f.read().decode(errors="replace").splitlines()
                tail = (tail[1:] if start else tail)[-200:]  # never a line cut in the middle (a cut key)
        except OSError as exc:
            tail = [f"(unreadable: {exc})"]
        out.append(f"==> {p.parent.name} (last {len(tail)} lines)\n" + "\n".join(tail) + "\n")
    put("runner-logs.txt", "".join(out))


def exit_code(result: dict) -> int:
    """0 all passed, 1 a verdict failed, 2 unknown / not applied / harness error."""
    if result.get("harness_errors") or result.get("harness_error"):
        return 2
    return {PASS: 0, FAIL: 1}.get(result["verdict"], 2)
