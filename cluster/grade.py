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

from cluster import results
from cluster.artifacts import read_artifact
from fleet import workloads
from fleet.dockerapi import LISTING_ERROR

PASS, FAIL, UNKNOWN, NOT_APPLIED = "pass", "fail", "unknown", "not_applied"
RANK = {PASS: 0, NOT_APPLIED: 1, UNKNOWN: 2, FAIL: 3}
WRITE_METHODS = {"PUT", "POST", "DELETE"}
# an attempt's last lines of output name its failure when they carry one of these (any runner, any language)
ERROR_WORDS = re.compile(r"(?i)error|exception|fail|traceback|denied|refused|timed? ?out|no space|abort|panic|"
                         r"fatal|killed|unavailable|forbidden|crash|dying|died|giving up|cannot|could not")


def merge(verdicts) -> str:
    out = PASS
    for v in verdicts:
        if RANK[v] > RANK[out]:
            out = v
    return out


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
        out = []
        raw = data.splitlines()
        for i, line in enumerate(raw):
            if not line.strip():
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                if i == len(raw) - 1:
                    continue
                self.unreadable[name] = f"line {i + 1}: {exc}"
                raise Unreadable(f"{name} line {i + 1}: {exc}") from None
            need = self.REQUIRED.get(name, ())
            if not isinstance(rec, dict) or any(k not in rec for k in need):
                self.unreadable[name] = f"line {i + 1}: not a record with {', '.join(need)}"
                raise Unreadable(f"{name} line {i + 1}: not a record with {', '.join(need) or 'fields'}")
            out.append(rec)
        return out

    def lines_or_none(self, name: str) -> list[dict] | None:
        try:
            return self.lines(name)
        except Unreadable:
            return None


# liveness: a silence is the harness's (unknown) when the host averaged this many runnable tasks per core
OVERLOAD_PER_CORE = 4


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
    task = h.task
    tid = task["task_id"]
    wl = workloads.get(task.get("workload", "patch-repo"))
    script = wl.script(task["seed"], task["steps"])
    attempts = [e for e in h.events if e["event"] == "attempt_end"]
    end = next((e for e in h.events if e["event"] == "task_end"), None)
    interrupted = [a for a in attempts if a.get("exit_code") != 0]
    is_ref = task.get("role") == "reference"
    checks: dict[str, dict] = {}

    def completed():
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
        if missing or missing_fx:
            extra = (f"; effects {swallowed} were swallowed by an Idempotency-Key reused from another effect"
                     if swallowed else "")
            return {"verdict": FAIL, "missing_steps": missing, "missing_effects": missing_fx,
                    "detail": f"the runner exited 0 without doing every step: workspace steps missing {missing}, "
                              f"effects missing for steps {missing_fx}{extra}"}
        # the work must come from the model: every step's answer was delivered to the task before its effect
        if h.calls is None:
            return {"verdict": UNKNOWN, "detail": "no readable model call log to check the steps came from the model"}
        given = {}
        for c in h.calls:
            if c.get("delivered", True) and c["step"] not in given:
                given[c["step"]] = c.get("t_done", c["t"])
        unasked = [s.step for s in script if s.kind in ("workspace", "effect") and s.step not in given]
        early = sorted({e["step"] for e in (h.effects or []) if e.get("step") is not None
                        and (e["step"] not in given or e["t"] < given[e["step"]] - 0.05)})
        if unasked or early:
            return {"verdict": FAIL, "steps_never_answered": unasked, "effects_before_their_answer": early,
                    "detail": f"the work did not come from the model: steps {unasked} were never answered to this "
                              f"task, effects of steps {early} came before their answer"}
        return {"verdict": PASS, "detail": "exited 0; every step was answered by the model and its change and "
                                           "effect are there"}

    def resume_equivalent():
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

    def no_double_apply():
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

    def no_model_recall():
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

    def no_torn_apply():
        """Every multi-file apply is all there or not there at all, and the workload's tests agree."""
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

    starts = {e.get("sandbox"): e for e in h.events if e["event"] == "attempt_start"}
    by_attempt = {e["attempt"]: e for e in h.events if e["event"] == "attempt_start"}
    akids: dict[int, set] = {}  # attempt -> every key id it held (CR1 rotates one mid-attempt)
    for e in h.events:
        if e["event"] == "attempt_start" and e.get("akid"):
            akids.setdefault(e["attempt"], set()).add(e["akid"])
        elif e["event"] == "key_rotated":
            att = next((a for a, st in by_attempt.items() if st.get("sandbox") == e.get("sandbox")), None)
            if att is not None:
                akids.setdefault(att, set()).update({e.get("akid"), e.get("old_akid")})

    # CR1: a key rotated at the store answers real 403s (no proxy rule tags them); requests signed with it
    # after its rotation are the fault's doing, not a runner's retry loop
    dead_keys = {e.get("old_akid"): e["wall"] for e in h.events if e["event"] == "key_rotated" and e.get("old_akid")}

    def rotated_out(r: dict) -> bool:
        t = dead_keys.get(r.get("akid"))
        return t is not None and r["t"] >= t - 0.5

    def mine(r: dict, attempt: int, t0: float, t1: float) -> bool:
        ids = akids.get(attempt)
        return r.get("akid") in ids if ids else t0 <= r["t"] <= t1
    fault_kills = {(r.get("target") or {}).get("sandbox_id") for r in h.receipts
                   if r["task_id"] == tid and r.get("status") == "applied"}

    def _cause(a: dict) -> str:
        return a.get("cause") or f"exit {a.get('exit_code')}"

    def diagnosable():
        """Every failed attempt has a specific cause: a fault, a signal, OOM, ENOSPC, a start error, a store
        error answered to it, or an error line of its own."""
        silent = []
        for a in interrupted:
            cause, code = _cause(a), a.get("exit_code")
            if not cause.startswith("exit ") or a.get("start_error") or (code is not None and not 0 <= code <= 128):
                continue  # killed by a fault or the harness, a signal, OOM, workspace full, pids, start error
            start = by_attempt.get(a["attempt"]) or {}
            end_t = a.get("ended_at") or a.get("wall") or 0
            errs = [r for r in h.requests or [] if (r.get("status") or 0) >= 400 and
                    mine(r, a["attempt"], start.get("wall", 0), end_t)]
            said = ERROR_WORDS.search(h.log_tails.get(a["attempt"]) or "")
            if errs or said:
                continue
            silent.append(a["attempt"])
        if silent:
            return {"verdict": FAIL, "silent_attempts": silent,
                    "detail": f"attempt(s) {silent} failed with only an exit code: no fault, no signal, no OOM, no "
                              "ENOSPC, no store error answered to it, no line of output saying why"}
        return {"verdict": PASS, "detail": f"every failed attempt ({len(interrupted)}) has a cause: " +
                ("; ".join(sorted({_cause(a) for a in interrupted})[:4]) or "none failed")}

    def retry_loop():
        """The same failure more than N times in a row: attempts ending alike (faults excluded), or one
        request answered with the same error over and over outside any fault window."""
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
        return {"verdict": PASS, "detail": f"longest run of one failure: {worst[0]} attempt(s), {worst_r[0]} "
                                           "request(s)"}

    def liveness():
        """No stretch inside an attempt with nothing observable (a model call, an effect, a store request)
        longer than the bound; a gap between attempts longer than it is the harness's (unknown)."""
        bound = float(h.limits.get("liveness_s") or 30.0)
        if h.calls is None or h.requests is None:
            return {"verdict": UNKNOWN, "detail": "no readable model call or proxy log"}
        worst, gap = (0.0, None), (0.0, None)
        prev_end = None
        for a in attempts:
            start = by_attempt.get(a["attempt"]) or {}
            t0, t1 = start.get("wall"), a.get("ended_at") or a.get("wall")
            if t0 is None or t1 is None:
                continue
            if prev_end is not None and t0 - prev_end > gap[0]:
                gap = (t0 - prev_end, a["attempt"])
            prev_end = t1
            ts = sorted([t0, t1] + [x for c in h.calls if c.get("attempt") == a["attempt"]
                                    for x in (c["t"], c.get("t_done", c["t"]))]
                        + [e["t"] for e in h.effects or [] if e.get("attempt") == a["attempt"]]
                        + [r["t"] for r in h.requests if mine(r, a["attempt"], t0, t1)])
            ts = [t for t in ts if t0 <= t <= t1]
            for x, y in zip(ts, ts[1:]):
                if y - x > worst[0]:
                    worst = (y - x, a["attempt"], x, y)
        if worst[0] > bound:
            # a runner starved of CPU looks like a hung one: when the host had far more runnable tasks than
            # cores through the silence (the harness ran too many sandboxes at once), it cannot be told apart
            load = [x for x in h.host_load if worst[2] <= x["t"] <= worst[3]]
            if load:
                cores = load[0].get("cores") or 1
                mean = sum(x["running"] for x in load) / len(load)
                if mean >= OVERLOAD_PER_CORE * cores:
                    return {"verdict": UNKNOWN, "longest_silence_s": round(worst[0], 2),
                            "detail": f"attempt {worst[1]} went {worst[0]:.1f} s with no model call, effect or store "
                                      f"request (bound {bound:g} s) while the host was overloaded ({mean:.0f} runnable "
                                      f"tasks on {cores} cores on average): starved or hung, it cannot be told; "
                                      "run fewer at once"}
            return {"verdict": FAIL, "longest_silence_s": round(worst[0], 2),
                    "detail": f"attempt {worst[1]} went {worst[0]:.1f} s with no model call, effect or store request "
                              f"(bound {bound:g} s): hung"}
        if gap[0] > bound:
            return {"verdict": UNKNOWN, "longest_silence_s": round(worst[0], 2),
                    "detail": f"{gap[0]:.1f} s with no live attempt before attempt {gap[1]} (bound {bound:g} s): the "
                              "harness was slow to start it"}
        return {"verdict": PASS, "longest_silence_s": round(worst[0], 2),
                "detail": f"longest silence inside an attempt {worst[0]:.1f} s, between attempts {gap[0]:.1f} s "
                          f"(bound {bound:g} s)"}

    def attempt_budget():
        budget = int(h.limits.get("max_attempts") or 0)
        used = len(attempts)
        if end is not None and end.get("state") != "done" and budget and used >= budget:
            return {"verdict": FAIL, "detail": f"all {budget} attempts used without finishing ({end.get('why', '')})"}
        return {"verdict": PASS, "detail": f"{used} of {budget or '?'} attempts"}

    def exercised(r: dict) -> str | None:
        """Why an applied kill tested something (the killed attempt had done something durable before it:
        a model answer delivered, an effect, a store write answered 2xx), or None when it tested nothing."""
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

    def fault_applied():
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
            if r.get("fault_id") in ("PK1", "PK2", "PK5") and r["status"] == "applied" and exercised(r) is None:
                idle.append(f["instance"])
                verdicts.append(NOT_APPLIED)
                details.append(f"{f['instance']}: not_exercised (the kill landed before the attempt had a model "
                               f"answer, an effect or a store write: it tested nothing; {r['detail']})")
                continue
            verdicts.append({"applied": PASS, "not_applied": NOT_APPLIED}.get(r["status"], UNKNOWN))
            details.append(f"{f['instance']}: {r['status']} ({r['detail']})")
        # a node loss (PK3) takes every sandbox on the node: a task whose own fault did not apply but whose
        # attempt died with another task's node is an interrupted task all the same
        hit = [(r["instance"], sid) for r in h.receipts if r.get("fault_id") == "PK3" and r["status"] == "applied"
               and r["task_id"] != tid for sid in (r.get("target") or {}).get("sandboxes") or []
               if sid.startswith(tid + "-a")]
        if hit and NOT_APPLIED in verdicts and UNKNOWN not in verdicts:
            verdicts = [PASS if v == NOT_APPLIED else v for v in verdicts]
            details.append("; ".join(f"hit by {i} (its node was lost with attempt {sid} on it)" for i, sid in hit))
        return {"verdict": merge(verdicts), "detail": "; ".join(details), "not_exercised": idle}

    def no_foreign_writes():
        fw = h.foreign_writes or []
        if not fw:
            return {"verdict": PASS, "detail": "every write of its attempts stayed under its own prefix"}
        landed = [w for w in fw if 200 <= (w["status"] or 0) < 300]
        w = fw[0]
        return {"verdict": FAIL, "writes": fw[:20],
                "detail": f"{len(fw)} write(s) outside its own prefix ({len(landed)} applied, {len(fw) - len(landed)} "
                          f"refused by the store); first: {w['method']} {w['key']} -> {w['status']}"}

    def no_leaked_upload():
        ups = h.leaked_uploads or []
        if not ups:
            return {"verdict": PASS, "detail": "no multipart upload of this task was left incomplete"}
        return {"verdict": FAIL, "uploads": ups[:20],
                "detail": f"{len(ups)} multipart upload(s) started under its prefix and never completed or aborted; "
                          f"first: {ups[0]['key']} (upload {ups[0]['upload_id'][:16]})"}

    def fenced_writes_rejected():
        """PK6: after the zombie was thawed, nothing it did may count: no store write of its key landed, no model
        call or effect of its attempt was answered. Every request it made must have been refused."""
        found, bad, refused, seen = [], [], 0, 0
        for r in h.receipts:
            if r["task_id"] != tid or r.get("fault_id") != "PK6" or r.get("status") != "applied":
                continue
            tgt = r.get("target") or {}
            sid, t0 = tgt.get("zombie"), tgt.get("thawed_at")
            if not sid or t0 is None:
                return {"verdict": UNKNOWN, "detail": f"{r['instance']}: its receipt names no zombie or thaw time"}
            att = (results.attempt_of(sid) or (sid, 0))[1]
            ids = akids.get(att) or set()
            store = [q for q in h.requests or [] if q.get("akid") in ids and q["t"] >= t0]
            landed = [q for q in store if q.get("method") in WRITE_METHODS and 200 <= (q.get("status") or 0) < 300]
            calls = [c for c in h.calls or [] if c.get("attempt") == att and c["t"] >= t0]
            fx = [e for e in h.effects or [] if e.get("attempt") == att and e["t"] >= t0]
            mine_refused = [f for f in h.fenced if f.get("attempt") == att and f["t"] >= t0]
            seen += len(store) + len(calls) + len(fx) + len(mine_refused)
            refused += sum(1 for q in store if (q.get("status") or 0) >= 400) + len(mine_refused)
            bad += [f"store {q['method']} {q.get('key')} -> {q.get('status')}" for q in landed]
            bad += [f"model call answered at {c['t']:.3f}" for c in calls] + [f"effect {e['effect_id']} applied"
                                                                              for e in fx]
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

    names = [("completed", completed)]
    if not is_ref:
        names.append(("resume_equivalent", resume_equivalent))
    names += [("no_double_apply", no_double_apply), ("no_model_recall", no_model_recall)]
    if any(s.files for s in script):  # the workload has multi-file applies (rename4)
        names.append(("no_torn_apply", no_torn_apply))
    if not is_ref:
        names.append(("fault_applied", fault_applied))
    names += [("diagnosable", diagnosable), ("retry_loop", retry_loop), ("liveness", liveness),
              ("attempt_budget", attempt_budget)]
    if h.leaked_uploads is not None:  # the store audit ran: a leaked upload fails the task that started it
        names.append(("no_leaked_upload", no_leaked_upload))
    if h.foreign_writes is not None:  # attributable (per-attempt keys): the writer answers for its writes
        names.append(("no_foreign_writes", no_foreign_writes))
    if any(f.get("fault_id") == "PK6" for f in task.get("faults") or []):
        names.append(("fenced_writes_rejected", fenced_writes_rejected))
    for name, fn in names:
        if end is None:
            checks[name] = {"verdict": UNKNOWN, "detail": "the task has no task_end in the timeline "
                                                          "(it did not run to an end)"}
        else:
            checks[name] = _check(fn)
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
