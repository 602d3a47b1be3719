"""Checks of the task's store traffic: an exit the store explains, retry hygiene (no loop, no storm), no write
outside its prefix, no leaked upload, a fenced zombie's writes refused, and the per-task store quota kept."""
from __future__ import annotations

from cluster import results
from cluster.grade.history import TaskHistory
from cluster.grade.verdicts import ERROR_WORDS, FAIL, NOT_APPLIED, PASS, UNKNOWN, WRITE_METHODS
from cluster.grade.facts import Facts, adds_check, attempt_cause


# a store answer that can end an attempt: refused (403: a dead or rotated key), the store failing (5xx), or no
# answer at all (a reset, a cut, a held request: status None); a 404 is how a journal says "nothing yet", a 409 or
# 412 a lost race a runner handles
def _can_end_an_attempt(r: dict) -> bool:
    s = r.get("status")
    return s is None or s == 403 or s >= 500


DIAGNOSABLE_NEAR_S = 15.0  # an answer explains an attempt's exit when it came in its last 15 s (retries included)


def _store_cause(errs: list[dict], facts: Facts) -> str:
    """The store answers that explain an attempt's exit, in words: how many, which statuses, and how many of them
    were signed with a key rotated away (CR1)."""
    codes = sorted({str(r.get("status") or "no answer") for r in errs})
    dead = sum(1 for r in errs if facts.rotated_out(r))
    return (f"{len(errs)} store answer(s) {'/'.join(codes)} in its last {DIAGNOSABLE_NEAR_S:.0f} s"
            + (f", {dead} of them to requests signed with its key rotated away (CR1)" if dead else ""))


def diagnosable(h: TaskHistory, facts: Facts) -> dict:
    """Every failed attempt has a specific cause: a fault, a signal, OOM, ENOSPC, a start error, a store
    answer that can end an attempt (403, 5xx, no answer) in its last seconds, or an error line of its own."""
    interrupted, by_attempt = facts.interrupted, facts.by_attempt
    mine = facts.mine
    silent, causes = [], []
    for a in interrupted:
        cause, code = attempt_cause(a), a.get("exit_code")
        if not cause.startswith("exit ") or a.get("start_error") or (code is not None and not 0 <= code <= 128):
            causes.append(cause)
            continue  # killed by a fault or the harness, a signal, OOM, workspace full, pids, start error
        start = by_attempt.get(a["attempt"]) or {}
        end_t = a.get("ended_at") or a.get("wall") or 0
        errs = [r for r in h.requests or [] if _can_end_an_attempt(r) and r["t"] >= end_t - DIAGNOSABLE_NEAR_S
                and mine(r, a["attempt"], start.get("wall", 0), end_t)]
        said = ERROR_WORDS.search(h.log_tails.get(a["attempt"]) or "")
        if errs:  # the store's answers first: they are what the harness saw, not what the runner says of itself
            causes.append(f"{cause} after {_store_cause(errs, facts)}")
        elif said:
            causes.append(cause)
        else:
            silent.append(a["attempt"])
    if silent:
        return {"verdict": FAIL, "silent_attempts": silent,
                "detail": f"attempt(s) {silent} failed with only an exit code: no fault, no signal, no OOM, no "
                          "ENOSPC, no store answer that could end it (403, 5xx, a reset) in its last "
                          f"{DIAGNOSABLE_NEAR_S:.0f} s, no line of output saying why"}
    return {"verdict": PASS, "detail": f"every failed attempt ({len(interrupted)}) has a cause: " +
            ("; ".join(sorted(set(causes))[:4]) or "none failed")}


# CR1: once its new key was published, an attempt that re-resolves its credentials after a refusal signs with it
# within a retry or two (durable: a backoff of at most 0.5 s). Requests with the old key that arrive later than
# REREAD_S after the publication, at least STALE_KEY_N of them refused and none with the new key to the attempt's
# end, are a runner that read its key once.
REREAD_S = 1.0
STALE_KEY_N = 3


def credentials_reresolved(h: TaskHistory, facts: Facts) -> dict:
    """CR1: a runner re-resolves its credentials after a refusal, as the contract asks: once the new key was
    published, the attempt's requests are signed with it. A run of refusals of the rotated-away key, after the
    publication and to the attempt's end, is a runner that never re-resolves (it caches its key): a named failure
    even when a later attempt, with a fresh key, finishes the task."""
    found, bad, idle = [], [], []
    for r in h.receipts:
        if (r["task_id"] != facts.tid or not adds_check(r.get("fault_id"), "credentials_reresolved")
                or r.get("status") != "applied"):
            continue
        tgt = r.get("target") or {}
        old, new, sid, rotated = tgt.get("old_akid"), tgt.get("new_akid"), tgt.get("sandbox_id"), r.get("fired_at")
        start = facts.starts.get(sid)
        if not old or not new or rotated is None or start is None:
            return {"verdict": UNKNOWN, "detail": f"{r['instance']}: its receipt names no key, attempt or rotation "
                                                  "time"}
        if h.requests is None:
            return {"verdict": UNKNOWN, "detail": "no readable proxy log: the keys' requests cannot be followed"}
        # (a receipt written before `published_at` was kept: the planned delay after the rotation)
        pub = tgt["published_at"] if "published_at" in tgt else rotated + float(tgt.get("delay_s") or 0)
        if pub is None:
            idle.append(f"{r['instance']}: the attempt ended before the new key was published (nothing to "
                        "re-resolve to)")
            continue
        end = next((a for a in facts.attempts if a.get("sandbox") == sid), {})
        t1 = end.get("ended_at") or end.get("wall") or float("inf")
        rows = sorted((q for q in h.requests if q.get("akid") in (old, new) and rotated <= q["t"] <= t1 + 1.0),
                      key=lambda q: q["t"])
        with_new = [q for q in rows if q.get("akid") == new and q["t"] >= pub]
        stale = [q for q in rows if q.get("akid") == old and q["t"] > pub + REREAD_S
                 and (q.get("status") or 0) in (401, 403)]
        found.append(r["instance"])
        if with_new:
            found[-1] += f" (first request with the new key {with_new[0]['t'] - pub:.2f} s after it was published)"
        elif len(stale) >= STALE_KEY_N and rows and rows[-1].get("akid") == old:
            span = stale[-1]["t"] - pub
            bad.append(f"attempt {start.get('attempt')} sent {len(stale)} request(s) signed with its rotated-away key "
                       f"{old[:8]}... after the new key was published (over {span:.1f} s, to the end of the "
                       f"attempt), each refused ({'/'.join(sorted({str(q.get('status')) for q in stale}))}), and "
                       "none with the new key")
    if bad:
        return {"verdict": FAIL, "detail": "a runner that never re-resolves its credentials, as the contract asks "
                                           "it to (it read its key once): " + "; ".join(bad)}
    if not found:
        return {"verdict": NOT_APPLIED, "detail": "; ".join(idle) or "no key of this task was rotated (CR1): "
                                                                     "re-resolution not exercised"}
    return {"verdict": PASS, "detail": f"{', '.join(found)}: no request signed with the rotated-away key kept "
                                       "going after the new key was published" + (f"; {'; '.join(idle)}" if idle
                                                                                  else "")}


def retry_loop(h: TaskHistory, facts: Facts) -> dict:
    """The same failure more than N times in a row: attempts ending alike (faults excluded), or one
    request answered with the same error over and over outside any fault window."""
    interrupted, fault_kills = facts.interrupted, facts.fault_kills
    rotated_out = facts.rotated_out
    n = int(h.limits.get("retry_loop_n") or 3)
    run, worst, prev = 0, (0, ""), None
    for a in interrupted:
        c = attempt_cause(a)
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



def no_foreign_writes(h: TaskHistory, facts: Facts) -> dict:
    """Every S3 request is attributed to the attempt whose key signed it: a write outside the task's own prefix fails
    the writer, even when the store refused it (a task whose prefix another task wrote into is `unknown`, not
    `fail`)."""
    fw = h.foreign_writes or []
    if not fw:
        return {"verdict": PASS, "detail": "every write of its attempts stayed under its own prefix"}
    landed = [w for w in fw if 200 <= (w["status"] or 0) < 300]
    w = fw[0]
    return {"verdict": FAIL, "writes": fw[:20],
            "detail": f"{len(fw)} write(s) outside its own prefix ({len(landed)} applied, {len(fw) - len(landed)} "
                      f"refused by the store); first: {w['method']} {w['key']} -> {w['status']}"}


def no_leaked_upload(h: TaskHistory, facts: Facts) -> dict:
    """No multipart upload the task started under its prefix was left incomplete (neither completed nor aborted), from
    the store audit."""
    ups = h.leaked_uploads or []
    if not ups:
        return {"verdict": PASS, "detail": "no multipart upload of this task was left incomplete"}
    return {"verdict": FAIL, "uploads": ups[:20],
            "detail": f"{len(ups)} multipart upload(s) started under its prefix and never completed or aborted; "
                      f"first: {ups[0]['key']} (upload {ups[0]['upload_id'][:16]})"}


def _after(recs: list[dict] | None, att: int, t0: float) -> list[dict]:
    """The records of attempt `att` from `t0` on."""
    return [r for r in recs or [] if r.get("attempt") == att and r["t"] >= t0]


def _zombie_activity(h: TaskHistory, facts: Facts, sid: str, t0: float) -> tuple[list[str], int, int]:
    """What the zombie attempt `sid` did from its thaw `t0`: (what took effect, requests seen, refused)."""
    att = (results.attempt_of(sid) or (sid, 0))[1]
    ids = facts.akids.get(att) or set()
    store = [q for q in h.requests or [] if q.get("akid") in ids and q["t"] >= t0]
    landed = [q for q in store if q.get("method") in WRITE_METHODS and 200 <= (q.get("status") or 0) < 300]
    calls, fx, mine_refused = _after(h.calls, att, t0), _after(h.effects, att, t0), _after(h.fenced, att, t0)
    seen = len(store) + len(calls) + len(fx) + len(mine_refused)
    refused = sum(1 for q in store if (q.get("status") or 0) >= 400) + len(mine_refused)
    bad = [f"store {q['method']} {q.get('key')} -> {q.get('status')}" for q in landed]
    bad += [f"model call answered at {c['t']:.3f}" for c in calls] + [f"effect {e['effect_id']} applied" for e in fx]
    return bad, seen, refused


def fenced_writes_rejected(h: TaskHistory, facts: Facts) -> dict:
    """PK6, NP1: after the zombie was thawed (or its node's link healed), nothing it did may count: no store write
    of its key landed, no model call or effect of its attempt was answered. Every request it made must have been
    refused."""
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
        return {"verdict": NOT_APPLIED,
                "detail": "no fault of this task left a zombie (a PK6 freeze, an NP1 cut): none to follow"}
    if h.requests is None or h.calls is None:
        return {"verdict": UNKNOWN, "detail": "the proxy or model log is missing: the zombie cannot be followed"}
    if bad:
        return {"verdict": FAIL, "landed": bad[:20],
                "detail": f"{len(bad)} thing(s) a fenced zombie did took effect: {'; '.join(bad[:3])}"}
    if not seen:
        return {"verdict": NOT_APPLIED, "detail": f"{', '.join(found)}: the zombie made no request after it was "
                                                  "thawed, so the fencing was not exercised"}
    return {"verdict": PASS,
            "detail": f"{', '.join(found)}: all {refused} of its request(s) after the thaw (or heal) were "
                      "refused (revoked key / stale fence); none took effect"}




def _held_past_quota(h: TaskHistory) -> dict | str | None:
    """The store audit's totals for the task against the configured quota: a FAIL verdict when the store holds
    more than it allows, the reason it cannot be told (a str), or None (within it, or no audit was asked for)."""
    held = h.store_held
    if held is None or "predates" in held:
        return None
    if "why" in held:
        return str(held["why"])
    max_objects, mb = h.limits.get("store_quota"), h.limits.get("store_quota_mb")
    if not isinstance(max_objects, int) or not isinstance(mb, int):
        return f"the plan's store.quota_objects / quota_mb are {max_objects!r} / {mb!r}, not numbers"
    max_bytes = mb << 20
    if held["objects"] <= max_objects and held["bytes"] <= max_bytes:
        return None
    return {"verdict": FAIL, "store_held": held, "max_objects": max_objects, "max_bytes": max_bytes,
            "detail": f"the store audit lists {held['objects']} objects, {held['bytes']} bytes under the task's "
                      f"prefix; its store quota is {max_objects} objects, {max_bytes} bytes ({mb} MiB): the "
                      "runner stored past the quota by a write the proxy did not count"}


def within_store_quota(h: TaskHistory, facts: Facts) -> dict:
    """The per-task store quota (storage/quota.py): a write the proxy refused for it (logged with `quota`) fails
    the task, whatever its artifact: the runner stored more than the wave allows a task, and what it would have
    written past the bound is not in the store. A flood is never a silent pass."""
    # (only the task's own writes: another task's write into this one's prefix, refused for this prefix's quota, is
    # that task's failure, named by its no_foreign_writes, never this one's)
    own = set().union(*facts.akids.values()) if facts.akids else set()
    refused = [q for q in h.requests or [] if isinstance(q.get("quota"), dict) and q.get("akid") in own]
    over = _held_past_quota(h)  # the backstop: what the store holds, whatever the proxy's parse missed
    if isinstance(over, dict):
        return dict(over, refused=len(refused))
    if not refused:
        if over is not None:
            return {"verdict": UNKNOWN, "detail": f"no write of this task was refused by the store quota, but what "
                                                  f"the store holds under its prefix is unknown: {over}"}
        held = h.store_held or {}
        return {"verdict": PASS, "detail": "no write of this task was refused by the store quota" + (
            f"; the store audit lists {held['objects']} objects, {held['bytes']} bytes under its prefix"
            if "objects" in held else f"; what the store holds was not compared: {held['predates']}"
            if "predates" in held else "")}
    first, q = refused[0], refused[0]["quota"]
    return {"verdict": FAIL, "refused": len(refused),
            "requests": [{"t": r.get("t"), "method": r.get("method"), "key": r.get("key"), "status": r.get("status"),
                          "code": r.get("code")} for r in refused[:20]],
            "detail": f"{len(refused)} write(s) refused {first.get('status')} {first.get('code')} by the per-task "
                      f"store quota ({q.get('max_objects')} objects, {q.get('max_bytes')} bytes); at the first it "
                      f"held {q.get('objects')} objects and {q.get('bytes')} bytes; first: {first.get('method')} "
                      f"{first.get('key')}"}
