"""Reference runs planned after the tasks. Second uninterrupted runs, on demand: when a task a fault met left an
artifact that differs from its reference's, the wave runs the seed's reference once more (or takes it from the
reference cache), so the grader can tell the runner's own non-determinism (the two uninterrupted runs differ there
too) from damage (they agree there). And the reference of a task planned as its own that turns out no uninterrupted
run (`references_after`)."""
from __future__ import annotations

from pathlib import Path

import orjson

from cluster.artifacts import ReferenceCache, read_artifact, write_artifact
from cluster.grade.selfref import not_uninterrupted, planned_self
from fleet.records import PlannedTask
from fleet.workloads.base import tree_digest

SECOND = "-b"  # ref-t003 -> ref-t003-b (its sandboxes: ref-t003-b-a1, ...)


def _files(out, task_id: str) -> dict[str, bytes] | None:
    try:
        got = read_artifact(out.artifact(task_id))
    except (OSError, ValueError, KeyError):
        return None
    return got[0] if got else None


def _digest(files: dict[str, bytes], rules: list[dict]) -> str:
    from cluster.grade.diff import drop_volatile

    return tree_digest(drop_volatile(files, rules)[0])


def second_references(plan: dict, out, cache: ReferenceCache | None, done: set[str]) -> list[dict]:
    """The second uninterrupted runs the wave needs, as reference tasks of the plan: one per reference whose task
    (done, with a fault) left an artifact that differs from the reference's, less the declared volatile paths.
    Each task of that reference gets `reference.second` ({"task_id", "key", "cached"}) in `plan`; one found in the
    cache is written as its artifact in `out` and is not run (not returned)."""
    rules = [v for v in (plan.get("config") or {}).get("volatile") or [] if isinstance(v, dict)]
    seconds: dict[str, dict] = {t["reference"]["second"]["task_id"][:-len(SECOND)]: t["reference"]["second"]
                                for t in plan["tasks"] if (t.get("reference") or {}).get("second")}
    to_run = []
    for t in plan["tasks"]:
        ref = t.get("reference") or {}
        rid = ref.get("task_id")
        if t["task_id"] not in done or not t.get("faults") or not rid or rid in seconds:
            continue
        got, want = _files(out, t["task_id"]), _files(out, rid)
        if got is None or want is None or _digest(got, rules) == _digest(want, rules):
            continue
        key = ref["key"] + SECOND
        hit = cache.get(key) if cache is not None else None
        seconds[rid] = {"task_id": rid + SECOND, "key": key, "cached": hit is not None}
        if hit is not None:
            write_artifact(out.artifact(rid + SECOND), hit[0], {"task_id": rid + SECOND, "attempt": hit[1].get(
                "attempt"), "skipped": [], "from_cache": key})
            continue
        to_run.append(PlannedTask(rid + SECOND, "reference", t["seed"], t["runner"], t["workload"], t["steps"],
                                  reference_of=t["task_id"],
                                  reference={"task_id": rid + SECOND, "key": key, "cached": False,
                                             "second_of": rid}).to_dict())
    for t in plan["tasks"]:
        rid = (t.get("reference") or {}).get("task_id")
        if rid in seconds:
            t["reference"]["second"] = dict(seconds[rid])
    return to_run


def references_after(plan: dict, timeline: Path, receipts: list[dict]) -> tuple[list[dict], dict[str, str]]:
    """The references to run after the tasks, as reference tasks of the plan, and why each runs: one per task planned
    as its own reference (no fault planned, `cluster/grade/selfref.py`) that turns out no uninterrupted run by its
    events in the timeline so far and the wave's receipts."""
    planned = {t["task_id"] for t in plan["references"]}
    own = {t["task_id"]: t for t in plan["tasks"]
           if planned_self(t) and t["reference"]["task_id"] not in planned}
    if not own:
        return [], {}
    events: dict[str, list[dict]] = {}
    for line in timeline.read_bytes().splitlines():  # (flushed per event: the tasks' whole record)
        try:
            e = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(e, dict) and e.get("task") in own:
            events.setdefault(e["task"], []).append(e)
    extra, why_of = [], {}
    for tid, t in own.items():
        why = not_uninterrupted(t, events.get(tid, []), receipts)
        if why is None:
            continue
        rid = t["reference"]["task_id"]
        why_of[rid] = why
        extra.append(PlannedTask(rid, "reference", t["seed"], t["runner"], t["workload"], t["steps"],
                                 reference_of=tid,
                                 reference={"task_id": rid, "key": t["reference"]["key"], "cached": False}
                                 ).to_dict())
    return extra, why_of
