"""A fault's receipt as the grader and the reports read it (`faults.json`, written by the driver): a damaged or
hand-edited one is named, never a traceback. A time is a wall clock's (seconds since 1970, before the year 5000): a
receipt that says it fired at 1e300 is damaged, and a kill's `exercised` cannot be judged from it. A receipt that
answers no fault the plan planned is named and left out, never counted as a fault that applied. A receipt written
`applied` that says not when it fired (`fired_at` null or missing) is read as `unknown`, named in its detail: whether
it exercised anything cannot be judged. A receipt that cannot be true (it fired after the wave's end or before its
start, its target is another task's, it was cleared before it fired, a kill fired after the attempt it names ended or
names one that exited 0 with nothing killing it, an applied storage fault names no key prefix or answered no request)
and every receipt of a planned fault that has more than one are `unknown`, the receipt and why named in its detail
(`checked_receipts`): no evidence that a fault applied; a second receipt for one planned fault is named and left out.
The file's name and the record kinds (`misfit`) are cluster/results.py's.
"""
from __future__ import annotations

from pathlib import Path

import orjson

from cluster.results import (DICT, FAULTS, LIST, NONE, NUM, STR, WALL, attempt_of, misfit, regular_bytes, task_prefix,
                             terminal_safe)
from faults import CATALOG

RECEIPT: dict[str, tuple[str, ...]] = {
    "fault_id": (STR,), "instance": (STR,), "task_id": (STR,), "status": (STR,), "target": (DICT, NONE),
    "detail": (STR, NONE), "fired_at": (WALL, NONE), "cleared_at": (WALL, NONE), "evidence": (DICT, NONE)}
CLOCK_SLACK_S = 1.0  # how far two hosts' clocks may differ (a fire time is the sandbox host's, the wave's the driver's)
RECEIPT_TARGET: dict[str, tuple[str, ...]] = {  # what the checks read of a receipt's target
    "sandbox_id": (STR, NONE), "sandboxes": (LIST, NONE), "old_akid": (STR, NONE), "new_akid": (STR, NONE),
    "zombie": (STR, NONE), "published_at": (WALL, NONE), "thawed_at": (WALL, NONE), "delay_s": (NUM, NONE)}


def receipts_of(doc) -> tuple[list[dict], list[str]]:
    """(the receipts of `faults.json`'s parsed JSON that have the shape the harness reads, "record N (instance):
    why" of each left out). ValueError naming what it is when the whole is not a list of receipts."""
    if not isinstance(doc, list):
        raise ValueError(f"a JSON {type(doc).__name__}, not a list of receipts")
    out, left = [], []
    for i, r in enumerate(doc):
        if not isinstance(r, dict):
            left.append(f"record {i + 1}: a JSON {type(r).__name__}, not a receipt")
            continue
        lacks = [k for k in ("fault_id", "instance", "task_id", "status") if k not in r]
        why = (f"no {', '.join(lacks)}" if lacks else misfit(r, RECEIPT)
               or (misfit(r["target"], RECEIPT_TARGET) if isinstance(r.get("target"), dict) else None))
        if why is None and isinstance((r.get("target") or {}).get("sandboxes"), list) and not all(
                isinstance(s, str) for s in r["target"]["sandboxes"]):
            why = "target.sandboxes holds something that is not a sandbox id"
        if why is None:
            out.append(_timed(r))
        else:
            name = r.get("instance") if isinstance(r.get("instance"), str) else None
            left.append(f"record {i + 1}" + (f" ({terminal_safe(name[:60])})" if name else "") + f": {why}")
    return out, left


def _timed(r: dict) -> dict:
    """The receipt as the grader counts it: one written `applied` with no fire time is `unknown` (a copy, its detail
    saying why); every driver-written applied receipt has one, a wave resumed from a timeline that kept none or a
    damaged file does not."""
    if r["status"] != "applied" or r.get("fired_at") is not None:
        return r
    return dict(r, status="unknown", detail="written as applied, but fired_at is null: when it fired is unknown, so "
                "whether it exercised anything cannot be judged" + (f"; {r['detail']}" if r.get("detail") else ""))


def planned_receipts(receipts: list[dict], plan) -> tuple[list[dict], list[str]]:
    """(the receipts that answer a fault the plan planned: same instance, task and fault id; "receipt (instance):
    why" of each that answers none, left out: it is named, never counted as a fault that applied)."""
    planned = {(f.get("instance"), f.get("task_id")): f.get("fault_id")
               for where in ("tasks", "references") for t in ((plan or {}).get(where) or [])
               if isinstance(t, dict) for f in (t.get("faults") or []) if isinstance(f, dict)} \
        if isinstance(plan, dict) else {}
    out, left = [], []
    for r in receipts:
        want = planned.get((r["instance"], r["task_id"]), ...)
        if want == r["fault_id"]:
            out.append(r)
            continue
        why = (f"fault_id {terminal_safe(r['fault_id'][:40])!r}, but the plan's is "
               f"{terminal_safe(str(want)[:40])!r}" if want is not ... else
               f"matches no planned fault (instance and task_id {terminal_safe(r['task_id'][:40])!r})")
        left.append(f"receipt ({terminal_safe(r['instance'][:60])}): {why}")
    return out, left


def checked_receipts(receipts: list[dict], plan, timeline: list[dict]) -> tuple[list[dict], list[str]]:
    """`planned_receipts`, then each kept receipt checked against the plan and the wave's timeline: one that cannot
    be true, and each of a planned fault that has more than one, is `unknown` (a copy, its detail naming why); the
    second and later receipts of one planned fault are left out and named with the unplanned ones."""
    kept, left = planned_receipts(receipts, plan)
    seen: dict[tuple, int] = {}
    for r in kept:
        seen[(r["instance"], r["task_id"])] = seen.get((r["instance"], r["task_id"]), 0) + 1
    walls = [(e.get("event"), e.get("wall")) for e in timeline if isinstance(e, dict)]
    start = next((w for ev, w in walls if ev == "wave_start"), None)
    end = next((w for ev, w in reversed(walls) if ev == "wave_end"), None)
    ended = {e["sandbox"]: e for e in timeline
             if isinstance(e, dict) and e.get("event") == "attempt_end" and isinstance(e.get("sandbox"), str)}
    wave_id = plan.get("wave_id") if isinstance(plan, dict) else None
    out, done = [], set()
    for r in kept:
        key = (r["instance"], r["task_id"])
        if key in done:
            left.append(f"receipt ({terminal_safe(r['instance'][:60])}): a second receipt for the same planned "
                        "fault, left out (the fault is unknown)")
            continue
        done.add(key)
        why = ([f"faults.json holds {seen[key]} receipts for this planned fault: which says what happened cannot be "
                "told"] if seen[key] > 1 else []) + _impossible(r, _num(start), _num(end), wave_id) + (
            _unkilled(r, ended) + _no_store_hit(r) if r["status"] == "applied" else [])
        out.append(dict(r, status="unknown", detail="a receipt that cannot be true: " + "; ".join(why) + (
            f"; it says {r['status']}" + (f" ({r['detail']})" if r.get("detail") else ""))) if why else r)
    return out, left


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _impossible(r: dict, start: float | None, end: float | None, wave_id) -> list[str]:
    """Why the receipt cannot be true: a time outside the wave (`start`/`end`: its timeline's wave_start and
    wave_end wall times, None when it has none: a wave graded before it ended), a clear before the fire, a target
    of another task (its sandbox, its store key prefix). Empty when nothing is wrong."""
    why, fired, cleared = [], r.get("fired_at"), r.get("cleared_at")
    target = r.get("target") or {}
    if fired is not None and end is not None and fired > end + CLOCK_SLACK_S:
        why.append(f"fired_at {fired:.3f} is after the wave ended ({end:.3f}, timeline's wave_end)")
    if fired is not None and start is not None and fired < start - CLOCK_SLACK_S:
        why.append(f"fired_at {fired:.3f} is before the wave started ({start:.3f}, timeline's wave_start)")
    if fired is not None and cleared is not None and cleared < fired - CLOCK_SLACK_S:
        why.append(f"cleared_at {cleared:.3f} is before fired_at {fired:.3f}")
    sid = target.get("sandbox_id")
    if isinstance(sid, str) and (attempt_of(sid) or (None,))[0] != r["task_id"]:
        why.append(f"target.sandbox_id {terminal_safe(sid[:60])!r} is not a sandbox of task "
                   f"{terminal_safe(r['task_id'][:40])!r}, the task it is filed under")
    prefix = target.get("key_prefix")
    if isinstance(prefix, str) and isinstance(wave_id, str) and not prefix.startswith(
            task_prefix(wave_id, r["task_id"])):
        why.append(f"target.key_prefix {terminal_safe(prefix[:80])!r} is not under task "
                   f"{terminal_safe(r['task_id'][:40])!r}'s prefix, the task it is filed under")
    return why


def _unkilled(r: dict, ended: dict[str, dict]) -> list[str]:
    """Why an applied kill of one attempt (the catalog's `kills_attempt`: PK1, PK2, PK5) cannot be true of the
    attempt it names (`ended`: the timeline's attempt_end of each sandbox): it fired after that attempt had ended
    (its next attempt's work would count as the kill's), or that attempt exited 0 with nothing killing it (a kill
    that landed records itself as the attempt's `killed_by`). Empty when nothing is wrong or nothing tells."""
    if not getattr(CATALOG.get(r["fault_id"]), "kills_attempt", False):
        return []
    sid = (r.get("target") or {}).get("sandbox_id")
    a, fired = ended.get(sid) if isinstance(sid, str) else None, _num(r.get("fired_at"))
    if a is None:
        return []
    why, name = [], terminal_safe(sid[:60])
    over = max((t for t in (_num(a.get("ended_at")), _num(a.get("wall"))) if t is not None), default=None)
    if fired is not None and over is not None and fired > over + CLOCK_SLACK_S:
        why.append(f"fired_at {fired:.3f} is after attempt {name} ended ({over:.3f}, timeline's attempt_end)")
    if a.get("exit_code") == 0 and not a.get("killed_by"):
        why.append(f"attempt {name} exited 0 and nothing killed it (its attempt_end has no killed_by)")
    return why


def _no_store_hit(r: dict) -> list[str]:
    """Why an applied storage fault (the catalog's family `storage`: a proxy rule on the task's prefix) shows
    nothing it applied to: the harness writes each with the rule's key prefix (a string) and the requests it
    answered (`evidence.hits` >= 1); a receipt a resumed wave rebuilt from its timeline (`evidence.from`) kept no
    count. Empty when nothing is wrong."""
    if getattr(CATALOG.get(r["fault_id"]), "family", None) != "storage":
        return []
    why, target, ev = [], r.get("target"), r.get("evidence")
    if not isinstance(target, dict) or not isinstance(target.get("key_prefix"), str):
        got = ("target is null" if not isinstance(target, dict) else "it has none" if target.get("key_prefix") is None
               else f"a JSON {type(target['key_prefix']).__name__}, not a string")
        why.append(f"an applied storage fault whose target names no key_prefix it applied to ({got})")
    hits = ev.get("hits", ...) if isinstance(ev, dict) else None
    if hits is ... and isinstance(ev.get("from"), str):
        return why
    if hits is ... or not isinstance(hits, int) or isinstance(hits, bool) or hits < 1:
        shown = "missing" if hits is ... else terminal_safe(repr(hits)[:40])
        why.append(f"an applied storage fault with evidence.hits {shown}: no request of the task was answered by it")
    return why


def read_receipts(path: str | Path) -> tuple[list[dict], str | None]:
    """The receipts of a `faults.json` that have the shape the harness reads, and what is wrong with the file (None:
    nothing; a missing file is no receipt and nothing wrong). Never raises on the file's content."""
    try:
        data = regular_bytes(path, follow=True)
    except FileNotFoundError:
        return [], None
    except ValueError as exc:
        return [], f"{FAULTS}: {str(exc).split(': ', 1)[-1]}"
    except OSError as exc:
        return [], f"{FAULTS}: cannot be read ({exc.strerror or exc})"
    try:
        got, left = receipts_of(orjson.loads(data))
    except orjson.JSONDecodeError as exc:
        return [], f"{FAULTS}: not valid JSON ({exc})"
    except ValueError as exc:
        return [], f"{FAULTS}: {exc}"
    if left:
        return got, f"{FAULTS}: {len(left)} receipt(s) left out: " + "; ".join(left[:5]) + (
            "; ..." if len(left) > 5 else "")
    return got, None
