"""Resume a wave whose driver died: what the dead driver recorded decides what runs on."""
from __future__ import annotations

import time

from cluster import results
from cluster.wave.errors import HarnessError
from cluster.wave.timeline import Event, Timeline


NEEDS = {"attempt_start": ("task", "sandbox", "attempt", "fence", "wall"), "task_end": ("task",),
         "fault_clear": ("instance", "fault", "task", "status", "wall")}  # what a resume reads of each event
NUMS, NAMES = ("wall",), ("task", "sandbox", "instance", "fault", "status")


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def prepare_resume(out: results.ResultsDir, plan: dict, wave_id: str) -> tuple[dict, list[dict], Timeline]:
    """Returns (resumed: the tasks that ended, attempts per task, fault instances that fired; the receipts of
    those faults; the timeline, reopened to go on). Tasks that ended keep their results; attempts the dead driver
    left running are closed in the timeline (they were reaped); faults that fired keep their receipts."""
    try:
        events = results.read_jsonl(out.timeline, ("event",))  # a torn last line is the dead driver's last write
    except ValueError as exc:
        raise HarnessError(f"{exc}: the timeline is damaged, cannot resume") from None
    if not events or events[0].get("event") != "wave_start" or not _is_num(events[0].get("wall")):
        raise HarnessError(f"{out.timeline} has no wave_start (with its wall time): not a wave that ran")
    for i, e in enumerate(events):
        lacks = [k for k in NEEDS.get(e["event"], ()) if k not in e or (k in NUMS and not _is_num(e[k]))
                 or (k in NAMES and not isinstance(e[k], str))]
        if lacks:
            raise HarnessError(f"{out.timeline} record {i + 1} ({str(e['event'])[:40]!r}): field {lacks[0]} is "
                               "missing or of another type: the timeline is damaged, cannot resume")
    if any(e["event"] == "wave_end" for e in events):
        raise HarnessError(f"wave {wave_id} already ended; grade it again with `sandfleet grade {out.path}`")
    finished = {e["task"] for e in events if e["event"] == "task_end"}
    attempts: dict[str, int] = {}
    open_attempts = {}
    for e in events:
        if e["event"] == "attempt_start":
            attempts[e["task"]] = attempts.get(e["task"], 0) + 1
            open_attempts[e["sandbox"]] = e
        elif e["event"] == "attempt_end":
            open_attempts.pop(e.get("sandbox") if isinstance(e.get("sandbox"), str) else None, None)
    fired = {}
    for e in events:
        if e["event"] == "fault_clear":
            # its fire time and target as the injector recorded them: a timeline from before they were kept
            # gives none, and the grader reads such an `applied` receipt as `unknown` (cluster/receipts.py)
            fired[e["instance"]] = {"fault_id": e["fault"], "instance": e["instance"], "task_id": e["task"],
                                    "status": e["status"], "detail": e.get("detail", ""),
                                    "target": e["target"] if isinstance(e.get("target"), dict) else {},
                                    "fired_at": e["fired_at"] if _is_num(e.get("fired_at")) else None,
                                    "cleared_at": e["wall"],
                                    "evidence": {"from": "the timeline of the driver that died"}}
    timeline = Timeline(out.timeline, since_wall=events[0]["wall"])
    now = time.time()
    for sid, e in open_attempts.items():  # reaped by the resume's sweep: they ended with the driver
        timeline(Event.ATTEMPT_END, task=e["task"], attempt=e["attempt"], fence=e["fence"], sandbox=sid,
                      exit_code=None, killed_by="driver died", ended_at=now, started_at=e["wall"],
                      cause="the wave's driver died; the attempt was reaped when the wave resumed")
    unfinished = sorted(t["task_id"] for t in plan["references"] + plan["tasks"]
                        if t["task_id"] not in finished)
    timeline(Event.WAVE_RESUMED, finished=sorted(finished), unfinished=unfinished,
                  closed_attempts=sorted(open_attempts), faults_fired_before=sorted(fired))
    return {"finished": finished, "attempts": attempts, "fired": set(fired)}, list(fired.values()), timeline
