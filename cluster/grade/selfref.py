"""A task that is its own reference: planned with no fault, run once and never touched by the harness, it is an
uninterrupted run of its seed, so the wave runs no second one beside it (`plan.py` marks it `reference.self`).

`not_uninterrupted` is the one rule, read by the driver (after the tasks: any such task that is not one gets its
reference run then, `WaveRun._own_references`) and by the grader (the comparison is then trivially the same, and the
artifact fills the reference cache under the key a reference would). It is strict: anything but one attempt that
exited 0 on its own, with nothing of a fault or of the harness in the wave near it, runs the reference as before.
"""
from __future__ import annotations

SELF_DETAIL = "reference: self (uninterrupted, no fault planned)"

# what the timeline holds for a task that ran once and was never touched; any other event of it (a retry, a silence,
# a lease that was busy, a fault's turn, a key rotated, a zombie) means it is no plain uninterrupted run
_PLAIN = frozenset({"task_start", "attempt_start", "attempt_end", "task_end"})


def planned_self(task: dict) -> bool:
    """The plan made this task its own reference (no fault planned, none in the cache)."""
    return (task.get("reference") or {}).get("self") is True and not task.get("faults")


def not_uninterrupted(task: dict, events: list[dict], receipts: list[dict], harness_fault=None,
                      receipts_damage: str | None = None) -> str | None:
    """None when the task is an uninterrupted run of its seed; else why it is not (in words). `events` are the task's
    own timeline events, `receipts` every fault receipt of the wave."""
    if task.get("faults"):
        return "a fault was planned for it"
    if harness_fault is not None:
        return "the wave had a harness fault"
    if receipts_damage:
        return f"the wave's fault receipts cannot be read whole ({receipts_damage})"
    other = sorted({str(e.get("event")) for e in events} - _PLAIN)
    if other:
        return f"its timeline has {', '.join(other)}"
    starts = [e for e in events if e.get("event") == "attempt_start"]
    ends = [e for e in events if e.get("event") == "attempt_end"]
    if len(starts) != 1 or len(ends) != 1:
        return f"it ran {max(len(starts), len(ends))} attempts"
    if starts[0].get("attempt") != 1 or ends[0].get("attempt", 1) != 1:
        return f"its one attempt is numbered {starts[0].get('attempt')!r}, not 1"
    end = next((e for e in events if e.get("event") == "task_end"), None)
    if end is None or end.get("state") != "done":
        return f"it did not end done ({(end or {}).get('state', 'no task_end')})"
    a = ends[0]
    if a.get("exit_code") != 0:
        return f"its attempt ended {a.get('cause') or 'exit ' + str(a.get('exit_code'))}"
    if a.get("killed_by"):
        return f"the harness stopped its attempt ({a['killed_by']})"
    if a.get("disk"):
        return "its disk was crashed before the attempt"
    if not (a.get("artifact") or {}).get("captured"):
        return "no artifact was captured"
    hits = {k: v for k, v in (a.get("events") or {}).items() if v}
    if hits:
        return f"its sandbox recorded {', '.join(f'{k} {v}' for k, v in sorted(hits.items()))}"
    tid = task.get("task_id")
    if any(r.get("task_id") == tid for r in receipts):
        return "a fault receipt names it"
    applied = sorted({str(r.get("instance")) for r in receipts if r.get("status") != "not_applied"})
    if applied:  # (a wave-wide effect of another task's fault, applied or unknown, cannot be ruled out)
        return f"faults were applied in the wave, or may have been ({', '.join(applied[:3])})"
    return None
