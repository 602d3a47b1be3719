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
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from cluster import checks as checks_mod
from cluster import results
from cluster.artifacts import read_artifact
from cluster.evidence import redact, write_evidence  # noqa: F401 (redact: old imports)
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


def run_checks(h: TaskHistory, facts) -> dict[str, dict]:
    """Every check that applies, each through the check-safe wrapper (a task with no end: all unknown)."""
    checks: dict[str, dict] = {}
    for c in checks_mod.applicable(h, facts):
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
    """Every check that applies to the task (cluster/checks.py's registry), each through the check-safe wrapper,
    then what a harness fault or another task's damage makes of them, and the task's figures."""
    facts = checks_mod.Facts.of(h)
    task, tid, attempts, end, interrupted = facts.task, facts.tid, facts.attempts, facts.end, facts.interrupted
    checks = run_checks(h, facts)
    touched = excuse(h, end, checks)
    verdict = merge(c["verdict"] for c in checks.values())
    figures = task_figures(h, attempts, end)
    signature = "+".join(sorted(k for k, c in checks.items() if c["verdict"] == FAIL)) or None
    recall = checks["no_model_recall"]
    return {"task_id": tid, "role": task.get("role", "task"), "seed": task["seed"], "runner": task["runner"],
            "workload": task.get("workload"), "faults": [f["fault_id"] for f in task["faults"]],
            "triggers": [_trigger(f) for f in task["faults"]],
            "verdict": verdict, "signature": signature, "attempts": len(attempts),
            "harness_fault": h.harness_fault["part"] if touched else None,
            "interrupted": bool(interrupted), "ended": end is not None, "model_recalls": recall.get("model_recalls"),
            "not_exercised": (checks.get("fault_applied") or {}).get("not_exercised") or [],
            "attempt_causes": [a.get("cause") or f"exit {a.get('exit_code')}" for a in attempts],
            "wasted_calls": recall.get("wasted_calls"), "wasted_tokens": recall.get("wasted_tokens"),
            "reference_key": (task.get("reference") or {}).get("key"), "resume_s": figures["resume_s"],
            "wall_s": figures["wall_s"], "store_write_ms_per_step": figures["store_write_ms_per_step"],
            "checks": checks}


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


@dataclass
class WaveRecord:
    """What a wave stored, read once: the plan and the timeline (its spine), the receipts, the services' and the
    proxy's logs (None: missing or unreadable), the sweeps' and the store audit's reports."""

    d: Path
    inp: Inputs
    plan: dict
    timeline: list[dict]
    receipts: list[dict]
    calls: list[dict] | None
    effects: list[dict] | None
    proxy: list[dict] | None
    sweep: dict | None
    audit: dict | None
    sweeper: dict | None
    fenced: list[dict]
    host_load: list[dict]
    hfault: dict | None

    @property
    def out(self) -> results.ResultsDir:
        return results.ResultsDir(self.d)


def _json_or_none(inp: Inputs, name: str, default=...):
    try:
        return inp.json(name) if default is ... else inp.json(name, default)
    except Unreadable:
        return None


def read_wave(d: Path) -> WaveRecord:
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
    sweep, audit = _json_or_none(inp, results.SANDBOX_SWEEP), _json_or_none(inp, results.STORE_AUDIT)
    sweeper = _json_or_none(inp, results.SWEEPER, None)  # the sweep actor's report (none: a wave before it existed)
    hfault = next((e for e in timeline if e["event"] == "harness_fault"), None)
    return WaveRecord(d, inp, plan, timeline, receipts, calls, effects, proxy, sweep, audit, sweeper,
                      inp.lines_or_none(results.FENCED) or [], inp.lines_or_none(results.HOST_LOAD) or [], hfault)


def _harness_errors(w: WaveRecord) -> list[str]:
    errors = [e["error"] for e in w.timeline if e["event"] == "harness_error"]
    if w.hfault is not None and not any(err.startswith("harness fault:") for err in errors):
        f = w.hfault
        errors.insert(0, f"harness fault: {f['part']}: {f['why']}. {f.get('hint', '')}")
    return errors


@dataclass
class Attribution:
    """Every store request signed by an attempt's own key belongs to that attempt's task."""

    owner: dict  # key id -> task id
    foreign: dict  # task id -> its writes outside its own prefix
    damaged: dict  # task id -> other tasks' applied writes into its prefix
    cut_keys: set  # keys whose PUT an injected ST6 cut


def attribute(w: WaveRecord) -> Attribution:
    wave_id = w.plan["wave_id"]
    # keys whose PUT an injected ST6 cut: the store may hold an empty object there whatever was written
    # later, so no write to them counts as a record a resuming runner could have read
    cut_keys = {r.get("key") for r in w.proxy or [] if r.get("cut")}
    owner = {e["akid"]: e["task"] for e in w.timeline if e["event"] in ("attempt_start", "key_rotated")
             and e.get("akid")}
    ready = next((e for e in w.timeline if e["event"] == "parts_ready"), {})
    bucket = (w.audit or {}).get("bucket") or ready.get("bucket") or results.bucket_name(wave_id)
    foreign: dict[str, list] = {}
    damaged: dict[str, list] = {}
    if owner and w.proxy is not None:
        for r in w.proxy:
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
    return Attribution(owner, foreign, damaged, cut_keys)


def _of_task(recs: list[dict] | None, tid: str) -> list[dict] | None:
    return None if recs is None else [r for r in recs if r["task"] == tid]


def _requests_of(w: WaveRecord, at: Attribution, tid: str, prefix: str) -> list[dict] | None:
    """Every proxy request of the task's attempts (by the key id that signed it) or under its prefix."""
    if w.proxy is None:
        return None
    return [r for r in w.proxy if at.owner.get(r.get("akid")) == tid or (r.get("key") or "").startswith(prefix)]


def _writes_of(w: WaveRecord, at: Attribution, prefix: str) -> list[dict] | None:
    """2xx store writes under the task's prefix (a PUT that ST6 cut is not a record a resume could read)."""
    if w.proxy is None:
        return None
    return [r for r in w.proxy if r.get("key", "").startswith(prefix) and r.get("method") in WRITE_METHODS
            and 200 <= (r.get("status") or 0) < 300 and r.get("key") not in at.cut_keys]


def task_history(w: WaveRecord, at: Attribution, task: dict) -> TaskHistory:
    tid = task["task_id"]
    prefix = f"{w.plan['wave_id']}/{tid}/"
    cfg = w.plan.get("config") or {}
    limits = {"max_attempts": cfg.get("max_attempts"), "liveness_s": cfg.get("liveness_s"),
              "retry_loop_n": cfg.get("retry_loop_n")}
    art, why = _read_artifact_safe(w.out.artifact(tid))
    leaked = None if w.audit is None else [u for u in w.audit.get("incomplete_uploads") or []
                                           if u["key"].startswith(prefix)]
    return TaskHistory(
        requests=_requests_of(w, at, tid, prefix), log_tails=_log_tails(w.d, tid), limits=limits,
        fenced=[f for f in w.fenced if f.get("task") == tid], host_load=w.host_load,
        task=task, events=[e for e in w.timeline if e.get("task") == tid], receipts=w.receipts,
        calls=_of_task(w.calls, tid), effects=_of_task(w.effects, tid), writes=_writes_of(w, at, prefix),
        artifact=art, artifact_error=None if art is not None or why.startswith("no artifact") else why,
        harness_fault=w.hfault, foreign_writes=at.foreign.get(tid, []) if at.owner else None,
        leaked_uploads=leaked, damaged_by=at.damaged.get(tid, []))


def _reference_of(w: WaveRecord, task: dict, ref_verdict: dict) -> dict:
    """What the task's artifact is compared with: its reference run's digest, or why there is none."""
    from fleet.workloads.base import tree_digest

    rtid = (task.get("reference") or {}).get("task_id")
    rart, why = _read_artifact_safe(w.out.artifact(rtid)) if rtid else (None, "no reference planned")
    rg = ref_verdict.get(rtid)
    if rg is not None and rg["checks"]["completed"]["verdict"] != PASS:
        return {"why": f"the reference run {rtid} did not complete: {rg['checks']['completed']['detail']}"}
    if rart is None:
        return {"why": f"reference {rtid}: {why}"}
    return {"digest": tree_digest(rart)}


def grade_tasks(w: WaveRecord, at: Attribution) -> tuple[list[dict], list[dict], dict[str, TaskHistory]]:
    """The references first (each task is compared with its own), then the tasks."""
    hist_of: dict[str, TaskHistory] = {}
    ref_grades = []
    for t in {t["task_id"]: t for t in w.plan.get("references", [])}.values():
        hist_of[t["task_id"]] = task_history(w, at, t)
        ref_grades.append(grade_task(hist_of[t["task_id"]]))
    ref_verdict = {g["task_id"]: g for g in ref_grades}
    grades = []
    for task in w.plan["tasks"]:
        h = task_history(w, at, task)
        h.reference = _reference_of(w, task, ref_verdict)
        hist_of[task["task_id"]] = h
        grades.append(grade_task(h))
    return grades, ref_grades, hist_of


def write_grades(w: WaveRecord, grades: list[dict], hist_of: dict, secrets: tuple) -> None:
    """`<task>.grade.json` with the digests of every input it was graded from; evidence for any not passed."""
    for g in grades:
        g["inputs"] = {"digests": dict(sorted(w.inp.digests.items())), "unreadable": dict(w.inp.unreadable)}
        art = w.out.artifact_manifest(g["task_id"])
        if art.exists():
            g["inputs"]["digests"][art.relative_to(w.d).as_posix()] = hashlib.sha256(art.read_bytes()).hexdigest()
        if g["verdict"] != PASS:
            write_evidence(w.d, g, hist_of[g["task_id"]], tuple(secrets))
        w.out.grade(g["task_id"]).write_bytes(orjson.dumps(g, option=orjson.OPT_INDENT_2))


def runner_own_failure(w: WaveRecord, g: dict) -> list[str] | None:
    """A failed reference that is the runner's own doing, with no fault and nothing of the harness in its way: every
    attempt ended by the runner's own exit (not killed, no start or host error) and every check it did not pass
    failed (none unknown), or `completed` failed (a runner that never finishes leaves no artifact, so checks of the
    artifact are unknown because of it). Then its failures are the runner's defect, shown by the fault-free run
    itself (a leaked upload, a write outside its prefix, an exit before its steps were done), not a baseline the
    harness broke. Returns `check: detail` per failure, or None."""
    ends = [e for e in w.timeline if e["event"] == "attempt_end" and e.get("task") == g["task_id"]]
    by_itself = bool(ends) and all(e.get("exit_code") is not None and not e.get("killed_by") and not e.get("error")
                                   and not e.get("start_error") for e in ends)
    bad = {k: c for k, c in g["checks"].items() if c["verdict"] != PASS}
    unfinished = bad.get("completed", {}).get("verdict") == FAIL
    if not by_itself or not bad or (not unfinished and any(c["verdict"] != FAIL for c in bad.values())):
        return None
    return [f"{k}: {c['detail']}" for k, c in bad.items() if c["verdict"] == FAIL]


def runner_failures(w: WaveRecord, ref_grades: list[dict]) -> list[str]:
    """What the runner fails with no fault at all (its references): a wave verdict `fail` (exit 1) with these reasons,
    never a harness error (a CI that retries exit-2 waves as flakes would never fail such a runner)."""
    out = []
    for g in ref_grades:
        own = runner_own_failure(w, g) if g["verdict"] != PASS else None
        if own:
            out.append(f"the fault-free reference run {g['task_id']} of this runner fails on its own: "
                       f"{'; '.join(own)[:400]}")
    return out


def _control_errors(w: WaveRecord, ref_grades: list[dict]) -> list[str]:
    """The positive control (every reference passes, in a wave with faults) and that something could start. A
    reference that fails on the runner's own (`runner_own_failure`) is the runner's failure, not a broken
    control."""
    out = []
    bad_refs = [g for g in ref_grades if g["verdict"] != PASS and runner_own_failure(w, g) is None]
    # (after a harness fault the references' own results are the fault's doing: that error is already named)
    if bad_refs and any(t["faults"] for t in w.plan["tasks"]) and w.hfault is None:
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
    looked = (sweep is not None and not sweep.get("problems")) and (sweeper is None or not (
        sweeper.get("unavailable") or any(e.startswith(LISTING_ERROR) for e in sweeper.get("errors") or [])))
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
    write_grades(w, grades + ref_grades, hist_of, secrets)
    harness_errors += _control_errors(w, ref_grades)
    leaks = leaks_of(w)
    wave_checks = wave_checks_of(w, leaks, ref_grades, harness_errors)
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
            "runner_failures": runner_failures(w, ref_grades), "plan": w.plan,
            "inputs": {"digests": w.inp.digests, "unreadable": w.inp.unreadable},
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


def exit_code(result: dict) -> int:
    """0 all passed, 1 a verdict failed, 2 unknown / not applied / harness error."""
    if result.get("harness_errors") or result.get("harness_error"):
        return 2
    return {PASS: 0, FAIL: 1}.get(result["verdict"], 2)
