"""A task's history as the grader sees it (`TaskHistory`): its events, its attempts' store requests (attributed by
the key that signed them, `attribute`), its model calls and effects, its artifact and its reference; and which
repeated model calls were recalls (`recall_analysis`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cluster import results
from cluster.artifacts import read_artifact
from cluster.grade.inputs import WaveRecord
from cluster.grade.selfref import not_uninterrupted, planned_self
from cluster.grade.verdicts import PASS, WRITE_METHODS


@dataclass
class TaskHistory:
    """Everything stored about one task, as the grader sees it."""

    task: dict
    events: list[dict] = field(default_factory=list)
    receipts: list[dict] = field(default_factory=list)
    receipts_damage: str | None = None  # what is wrong with faults.json (unreadable, receipts left out), named
    calls: list[dict] | None = None
    effects: list[dict] | None = None
    effects_error: str | None = None  # effects.jsonl exists but is damaged: what needs it is unknown, never fail
    writes: list[dict] | None = None  # 2xx store writes under the task's prefix (proxy log)
    artifact: dict[str, bytes] | None = None
    artifact_error: str | None = None  # the capture exists but cannot be read: unknown, never fail
    reference: dict | None = None  # {"digest", "files", "task_id", "second" or "second_why", "self"?} or {"why"}
    harness_fault: dict | None = None  # a part of the harness died during the wave (timeline `harness_fault`)
    foreign_writes: list[dict] | None = None  # its attempts' writes outside its prefix; None = not attributable
    leaked_uploads: list[dict] | None = None  # multipart uploads under its prefix left incomplete; None = no audit
    damaged_by: list[dict] = field(default_factory=list)  # other tasks' applied writes into its prefix
    requests: list[dict] | None = None  # every proxy request of its attempts (by key id) or under its prefix
    log_tails: dict[int, str] = field(default_factory=dict)  # attempt -> last lines of its runner.log
    runner_logs: list | None = None  # its attempts' runner.log paths in attempt order (None: not listed yet)
    limits: dict = field(default_factory=dict)  # max_attempts, liveness_s, retry_loop_n from the plan
    fenced: list[dict] = field(default_factory=list)  # its calls the services refused (revoked attempt keys)
    refused: list[dict] = field(default_factory=list)  # its requests the model could not answer (no dialect fits)
    host_load: list[dict] = field(default_factory=list)  # {"t", "running", "cores"}: runnable tasks on the host
    volatile: list[dict] = field(default_factory=list)  # the config's volatile paths: {"glob", "why"}
    # what the end-of-wave store audit listed under its prefix: {"objects", "bytes"}, or {"why"} it cannot say;
    # None: a history built by hand, with no audit asked for
    store_held: dict | None = None


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


def _recall_reasons(p: dict, c: dict, calls: list[dict], effects: list[dict], writes: list[dict],
                    windows: dict[int, dict]) -> list[str]:
    """Why asking again for `c`'s step is a recall of `p`'s answer (none: the answer was in flight when its attempt
    ended, forgiven)."""
    if not p.get("delivered", True):
        return []
    reasons = []
    if p.get("attempt") == c.get("attempt"):
        reasons.append("the same attempt asked again after the answer was delivered")
    later = [x for x in calls if x.get("attempt") == p.get("attempt") and p["t"] < x["t"] < c["t"] and x is not p]
    if later:
        reasons.append(f"attempt {p.get('attempt')} had already moved on to step {later[0]['step']}")
    fx = [e for e in effects if e.get("step") == c["step"] and e["t"] < c["t"]]
    if fx:
        reasons.append(f"the step's effect {fx[0]['effect_id']} was recorded at {fx[0]['t']:.3f}")
    end = (windows.get(p.get("attempt")) or {}).get("end") or c["t"]
    # a write the attempt sent after the answer and before it ended, that the store had COMMITTED (answered 2xx)
    # before the step was asked again: a resuming runner could have seen it. A write still in flight when the new
    # attempt looked (a slow store) could not have been seen. (a DELETE records nothing: it cannot be where the
    # answer was made durable)
    w = [x for x in writes if p.get("t_done", p["t"]) <= x["t"] <= min(end, c["t"])
         and x["t"] + (x.get("ms") or 0) / 1000 <= c["t"] and x.get("method") != "DELETE"]
    if w:
        reasons.append(f"attempt {p.get('attempt')} wrote {w[0]['key']} to the store after the answer")
    if (windows.get(p.get("attempt")) or {}).get("exit_code") == 0:
        reasons.append(f"attempt {p.get('attempt')} exited 0")
    return reasons


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
            reasons = _recall_reasons(p, c, calls, effects, writes, windows)
            entry = {"step": c["step"], "t": c["t"], "attempt": c.get("attempt"), "tokens": c.get("tokens", 0),
                     "previous_attempt": p.get("attempt")}
            (recalls if reasons else forgiven).append({**entry, "why": "; ".join(reasons) or
                                                       "the previous answer was in flight when its attempt ended"})
        prev.append(c)
    return {"recalls": recalls, "forgiven": forgiven}


def _read_artifact_safe(adir: Path):
    try:
        got = read_artifact(adir)
    except Exception as exc:  # noqa: BLE001 - a damaged capture is unreadable, not a runner's fault
        return None, f"unreadable: {exc}"
    return (got[0], None) if got else (None, "no artifact captured")


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
            # a DeleteObjects (a bucket-level POST) is a write of the keys its body names, as the proxy logged them
            names = r.get("keys") if r.get("method") == "POST" and not r.get("key") and isinstance(
                r.get("keys"), list) and r["keys"] and all(isinstance(k, str) for k in r["keys"]) else [r.get("key")]
            outside = [k for k in names if not (r.get("bucket") == bucket and (k or "").startswith(own))]
            if not outside:
                continue
            rec = {"t": r["t"], "method": r["method"], "key": outside[0], "status": r.get("status"), "by": tid_w}
            foreign.setdefault(tid_w, []).append(rec)
            for k in outside:
                parts = (k or "").split("/")
                if 200 <= (r.get("status") or 0) < 300 and len(parts) > 2 and parts[0] == wave_id:
                    damaged.setdefault(parts[1], []).append(dict(rec, key=k))
    return Attribution(owner, foreign, damaged, cut_keys)


def _under_task(key, wave_id: str) -> str | None:
    """The task whose prefix `<wave>/<task>/` the key is under (None: no task's)."""
    parts = key.split("/", 2) if isinstance(key, str) else ()
    return parts[1] if len(parts) == 3 and parts[0] == wave_id else None


def _proxy_by_task(w: WaveRecord, at: Attribution) -> tuple[dict, dict]:
    """(task -> its requests, task -> its writes), from one pass over the proxy's log, kept on the record for this
    attribution (per task, a scan of the whole log made grading quadratic: 137 of 226 s at 4,000 tasks)."""
    got = w._by_task.get("proxy")
    if got is not None and got[0] is at:
        return got[1], got[2]
    requests: dict[str, list] = {}
    writes: dict[str, list] = {}
    wave_id = w.plan["wave_id"]
    for r in w.proxy or []:
        under = _under_task(r.get("key") or "", wave_id)
        signer = at.owner.get(r.get("akid"))
        for t in {signer, under} - {None}:
            requests.setdefault(t, []).append(r)
        if (under is not None and r.get("method") in WRITE_METHODS and 200 <= (r.get("status") or 0) < 300
                and r.get("key") not in at.cut_keys):
            writes.setdefault(under, []).append(r)
    w._by_task["proxy"] = (at, requests, writes)
    return requests, writes


def _requests_of(w: WaveRecord, at: Attribution, tid: str) -> list[dict] | None:
    """Every proxy request of the task's attempts (by the key id that signed it) or under its prefix."""
    return None if w.proxy is None else list(_proxy_by_task(w, at)[0].get(tid, ()))


def _writes_of(w: WaveRecord, at: Attribution, tid: str) -> list[dict] | None:
    """2xx store writes under the task's prefix (a PUT that ST6 cut is not a record a resume could read)."""
    return None if w.proxy is None else list(_proxy_by_task(w, at)[1].get(tid, ()))


def receipts_damage(w: WaveRecord) -> str | None:
    """What is wrong with the wave's faults.json, as a planned fault with no receipt names it (None: nothing)."""
    if results.FAULTS in w.inp.unreadable:
        return f"{results.FAULTS} is unreadable: {w.inp.unreadable[results.FAULTS]}"
    left = w.inp.skipped.get(results.FAULTS)
    if left:
        return (f"{results.FAULTS} has {w.inp.skipped_count.get(results.FAULTS, len(left))} receipt(s) of another "
                f"shape, left out: {'; '.join(left[:3])}")
    return None


def store_held(w: WaveRecord, tid: str) -> dict:
    """What the store audit listed under the task's prefix ({"objects", "bytes"}), {"why"} it cannot say, or
    {"predates"}: an audit from before per-task totals were kept."""
    if w.audit is None:
        why = w.inp.unreadable.get(results.STORE_AUDIT)
        return {"why": f"{results.STORE_AUDIT}: {why}" if why else f"there is no {results.STORE_AUDIT}"}
    totals = w.audit.get("task_totals")
    if not isinstance(totals, dict):
        # an audit the harness wrote before it kept them (results graded again later): the backstop cannot run, and
        # the check keeps its rule of then (the proxy's refusals), saying so
        return {"predates": f"{results.STORE_AUDIT} has no `task_totals` (an audit from before they were kept)"}
    t = totals.get(tid)
    if not (isinstance(t, dict) and all(isinstance(t.get(k), int) and not isinstance(t.get(k), bool)
                                        and t[k] >= 0 for k in ("objects", "bytes"))):
        return {"why": f"{results.STORE_AUDIT}'s task_totals has no objects and bytes for {tid}"}
    return {"objects": t["objects"], "bytes": t["bytes"]}


def task_history(w: WaveRecord, at: Attribution, task: dict) -> TaskHistory:
    tid = task["task_id"]
    prefix = f"{w.plan['wave_id']}/{tid}/"
    cfg = w.plan.get("config") or {}
    limits = {"max_attempts": cfg.get("max_attempts"), "liveness_s": cfg.get("liveness_s"),
              "retry_loop_n": cfg.get("retry_loop_n"),
              "store_quota": (cfg.get("store") or {}).get("quota_objects") if isinstance(cfg.get("store"), dict)
              else None,
              "store_quota_mb": (cfg.get("store") or {}).get("quota_mb") if isinstance(cfg.get("store"), dict)
              else None}
    art, why = _read_artifact_safe(w.out.artifact(tid))
    leaked = None if w.audit is None else [u for u in w.audit.get("incomplete_uploads") or []
                                           if u["key"].startswith(prefix)]
    return TaskHistory(
        requests=_requests_of(w, at, tid), log_tails=w.out.runner_log_tails(tid, logs=w.runner_logs(tid)),
        runner_logs=w.runner_logs(tid),
        limits=limits,
        store_held=store_held(w, tid),
        volatile=[v for v in cfg.get("volatile") or [] if isinstance(v, dict)],
        fenced=w.of_task("fenced", tid), host_load=w.host_load,
        task=task, events=w.of_task("timeline", tid), receipts=w.receipts,
        receipts_damage=receipts_damage(w),
        calls=None if w.calls is None else [c for c in w.of_task("calls", tid) if c.get("kind") != "refused"],
        refused=[c for c in w.of_task("calls", tid) or [] if c.get("kind") == "refused"],
        effects=w.of_task("effects", tid), writes=_writes_of(w, at, tid),
        effects_error=w.inp.unreadable.get(results.EFFECTS) if w.effects is None else None,
        artifact=art, artifact_error=None if art is not None or why.startswith("no artifact") else why,
        harness_fault=w.hfault, foreign_writes=at.foreign.get(tid, []) if at.owner else None,
        leaked_uploads=leaked, damaged_by=at.damaged.get(tid, []))


def reference_for(w: WaveRecord, task: dict, ref_verdict: dict, own: TaskHistory | None = None) -> dict:
    """What the task's artifact is compared with: its reference run's files and digest, or why there is none; and
    the files of a second uninterrupted run of the seed when the wave ran one (`second`), or why not
    (`second_why`). A task planned as its own reference (`cluster/grade/selfref.py`) whose reference did not run is
    compared with itself (`self`) when it is an uninterrupted run (`own`: its history)."""
    from fleet.workloads.base import tree_digest

    rtid = (task.get("reference") or {}).get("task_id")
    if planned_self(task) and rtid not in ref_verdict:  # no reference ran: the task is one, or it has none
        events, art = (own.events, own.artifact) if own is not None else ([], None)
        why = not_uninterrupted(task, events, w.receipts, w.hfault, own.receipts_damage if own else None)
        misfit = sorted(name for name, n in w.inp.skipped_count.items() if n)
        if why is None and misfit:  # a record left out for its shape could be the one that says it was interrupted
            why = f"records of {', '.join(misfit)} were left out for their shape"
        if why is not None:
            return {"why": f"no fault was planned, so no reference ran beside it, but it is no uninterrupted run "
                           f"({why}), and no reference of its seed ran after it"}
        if art is None:
            return {"why": "no fault was planned and no reference ran beside it, and its own artifact is unreadable"}
        return {"self": True, "digest": tree_digest(art), "files": art, "task_id": task["task_id"],
                "second_why": "its own reference (uninterrupted, no fault planned)"}
    rart, why = _read_artifact_safe(w.out.artifact(rtid)) if rtid else (None, "no reference planned")
    rg = ref_verdict.get(rtid)
    if rg is not None and rg["checks"]["completed"]["verdict"] != PASS:
        return {"why": f"the reference run {rtid} did not complete: {rg['checks']['completed']['detail']}"}
    if rart is None:
        return {"why": f"reference {rtid}: {why}"}
    out = {"digest": tree_digest(rart), "files": rart, "task_id": rtid}
    second = (task.get("reference") or {}).get("second")
    if not isinstance(second, dict) or not isinstance(second.get("task_id"), str):
        out["second_why"] = "no second uninterrupted run of this seed was run"
        return out
    sg = ref_verdict.get(second["task_id"])  # (none when it came from the reference cache)
    sart, why2 = _read_artifact_safe(w.out.artifact(second["task_id"]))
    if sg is not None and sg["checks"]["completed"]["verdict"] != PASS:
        out["second_why"] = f"the second uninterrupted run {second['task_id']} did not complete"
    elif sart is None:
        out["second_why"] = f"second run {second['task_id']}: {why2}"
    else:
        out["second"], out["second_id"] = sart, second["task_id"]
    return out
