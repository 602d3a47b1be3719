"""Checks of how the attempts ran: liveness (no silence that the host's load does not explain), no process
outliving an exit 0, the attempt budget, and every planned fault applied and exercised."""
from __future__ import annotations

from cluster import results
from cluster.grade.history import TaskHistory
from cluster.grade.verdicts import FAIL, NOT_APPLIED, OVERLOAD_PER_CORE, PASS, UNKNOWN, merge
from cluster.grade.facts import Facts, kills_attempt, takes_node


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
        # what the attempt did, each as the span the harness took to answer it: a model call from its arrival to
        # its answer (the endpoint thinking), a store request for as long as the proxy held it (a throttle, a
        # hold); waiting on the harness is not the runner's silence
        busy = sorted([(c["t"], c.get("t_done") or c["t"]) for c in h.calls if c.get("attempt") == a["attempt"]]
                      + [(e["t"], e["t"]) for e in h.effects or [] if e.get("attempt") == a["attempt"]]
                      + [results.request_span(r) for r in h.requests if facts.mine(r, a["attempt"], t0, t1)]
                      + [(t0, t0), (t1, t1)])
        covered = t0
        for x, y in busy:
            x, y = max(x, t0), min(max(x, y), t1)
            if x > t1:
                break
            if x - covered > worst[0]:
                worst = (x - covered, a["attempt"], covered, x)
            covered = max(covered, y)
    return worst, gap


def host_overload(h: TaskHistory, t0: float, t1: float, node: str | None) -> tuple[float, int] | None:
    """(mean runnable tasks, cores) on a node's host from t0 to t1 when that was an overload, else None (rows with
    no node are the one machine's: every node's)."""
    load = [x for x in h.host_load if t0 <= x["t"] <= t1 and x.get("node") in (None, node)]
    if not load:
        return None
    cores = load[0].get("cores") or 1
    mean = sum(x["running"] for x in load) / len(load)
    return (mean, cores) if mean >= OVERLOAD_PER_CORE * cores else None


def _starved(h: TaskHistory, worst: tuple, bound: float) -> dict | None:
    """A runner starved of CPU looks like a hung one: when the host had far more runnable tasks than cores through
    the silence (the harness ran too many sandboxes at once), it cannot be told apart (unknown)."""
    node = (next((st for st in h.events if st.get("event") == "attempt_start" and st.get("attempt") == worst[1]),
                 {}) or {}).get("node")
    got = host_overload(h, worst[2], worst[3], node)
    if got is None:
        return None
    mean, cores = got
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
        ended = next((a.get("killed_by") for a in facts.attempts if a.get("attempt") == worst[1]
                      and str(a.get("killed_by") or "").startswith("silent")), None)
        how = f"; ended by the harness ({ended}), so the next attempt had its chance" if ended else ""
        return _starved(h, worst, bound) or {
            "verdict": FAIL, "longest_silence_s": round(worst[0], 2),
            "detail": f"attempt {worst[1]} went {worst[0]:.1f} s with no model call, effect or store request "
                      f"(bound {bound:g} s): hung{how}"}
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
    """The task finished within `max_attempts` attempts."""
    attempts, end = facts.attempts, facts.end
    budget = int(h.limits.get("max_attempts") or 0)
    used = len(attempts)
    if end is not None and end.get("state") != "done" and budget and used >= budget:
        return {"verdict": FAIL, "detail": f"all {budget} attempts used without finishing ({end.get('why', '')})"}
    return {"verdict": PASS, "detail": f"{used} of {budget or '?'} attempts"}


def _ended(facts: Facts, sid: str) -> float | None:
    """When the attempt in sandbox `sid` ended: the later of its attempt_end's `ended_at` (the sandbox's exit) and
    `wall` (when the driver recorded it, before it started the next attempt); None while it has no end."""
    times = [t for a in facts.attempts if a.get("sandbox") == sid for t in (a.get("ended_at"), a.get("wall"))
             if isinstance(t, (int, float)) and not isinstance(t, bool)]
    return max(times, default=None)


def exercised(h: TaskHistory, facts: Facts, r: dict) -> str | None:
    """Why an applied kill tested something (the killed attempt had done something durable before it:
    a model answer delivered, an effect, a store write answered 2xx in its own span, never the next attempt's),
    or None when it tested nothing."""
    sid = (r.get("target") or {}).get("sandbox_id")
    start, at = facts.starts.get(sid), r.get("fired_at")
    if start is None or at is None or h.calls is None:  # (a kill that names no sandbox: `unshown`, never here)
        return "unknown time, or no readable model call: counted as exercised"
    attempt, t0 = start["attempt"], start["wall"]
    end = _ended(facts, sid)
    t1 = at if end is None else min(at, end)
    if any(c.get("attempt") == attempt and c.get("delivered", True) and c.get("t_done", c["t"]) <= at
           for c in h.calls):
        return "a model answer had been delivered to the killed attempt"
    if any(e.get("attempt") == attempt and e["t"] <= at for e in h.effects or []):
        return "the killed attempt had sent an external effect"
    if any(t0 <= w["t"] <= t1 for w in h.writes or []):
        return "the killed attempt had a store write answered"
    return None


def unshown(facts: Facts, r: dict) -> str | None:
    """Why an applied kill cannot be shown to have interrupted a run of the task: its receipt names no sandbox, or
    one no attempt of the task ran in (None: it names the sandbox of one of the task's attempts)."""
    sid = (r.get("target") or {}).get("sandbox_id")
    if not isinstance(sid, str):
        return "names no sandbox"
    if sid not in facts.starts:
        return f"names sandbox {results.terminal_safe(sid[:60])!r}, in which no attempt of the task ran"
    return None


def fault_applied(h: TaskHistory, facts: Facts) -> dict:
    """Every planned fault's receipt says applied. A kill that landed before its attempt did anything durable (no
    model answer, effect or store write yet) is `not_exercised`: `not_applied`, and the task is left out of the
    resume survival rate. An applied kill whose receipt names no sandbox of the task cannot be shown to have
    interrupted a run: `unknown`, and it too is left out of that rate (`kill_not_shown`). A task whose attempt died
    with another task's lost node (PK3) was interrupted all the same."""
    task, tid = facts.task, facts.tid
    if not task["faults"]:
        return {"verdict": PASS, "detail": "no fault planned"}
    mine = {r["instance"]: r for r in h.receipts if r["task_id"] == tid}
    verdicts, details, idle, not_shown = [], [], [], []
    for f in task["faults"]:
        r = mine.get(f["instance"])
        if r is None:
            verdicts.append(UNKNOWN)
            details.append(f"{f['instance']}: no receipt" + (f" ({h.receipts_damage})" if h.receipts_damage else ""))
            continue
        why = unshown(facts, r) if kills_attempt(r.get("fault_id")) and r["status"] == "applied" else None
        if why is not None:
            not_shown.append(f["instance"])
            verdicts.append(UNKNOWN)
            details.append(f"{f['instance']}: unknown (an applied kill that {why}: it cannot be shown to have "
                           f"interrupted a run, so it is not counted as exercised; {r['detail']})")
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
    return {"verdict": merge(verdicts), "detail": "; ".join(details), "not_exercised": idle,
            **({"kill_not_shown": not_shown} if not_shown else {})}


