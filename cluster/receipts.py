"""A fault's receipt as the grader and the reports read it (`faults.json`, written by the driver): a damaged or
hand-edited one is named, never a traceback. A time is a wall clock's (seconds since 1970, before the year 5000): a
receipt that says it fired at 1e300 is damaged, and a kill's `exercised` cannot be judged from it. A receipt that
answers no fault the plan planned is named and left out, never counted as a fault that applied. A receipt written
`applied` that says not when it fired (`fired_at` null or missing) is read as `unknown`, named in its detail: whether
it exercised anything cannot be judged. The file's name and the record kinds (`misfit`) are cluster/results.py's.
"""
from __future__ import annotations

from pathlib import Path

import orjson

from cluster.results import DICT, FAULTS, LIST, NONE, NUM, STR, WALL, misfit, regular_bytes, terminal_safe

RECEIPT: dict[str, tuple[str, ...]] = {
    "fault_id": (STR,), "instance": (STR,), "task_id": (STR,), "status": (STR,), "target": (DICT, NONE),
    "detail": (STR, NONE), "fired_at": (WALL, NONE), "cleared_at": (WALL, NONE), "evidence": (DICT, NONE)}
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
