"""Resume a wave whose driver died: what the dead driver recorded decides what runs on."""
from __future__ import annotations

import time

from cluster import results
from cluster.wave.errors import HarnessError
from cluster.wave.timeline import Timeline


def prepare_resume(out: results.ResultsDir, plan: dict, wave_id: str) -> tuple[dict, list[dict], Timeline]:
    """Returns (resumed: the tasks that ended, attempts per task, fault instances that fired; the receipts of
    those faults; the timeline, reopened to go on). Tasks that ended keep their results; attempts the dead driver
    left running are closed in the timeline (they were reaped); faults that fired keep their receipts."""
    try:
        events = results.read_jsonl(out.timeline)  # a torn last line is the dead driver's last write
    except ValueError as exc:
        raise HarnessError(f"{exc}: the timeline is damaged, cannot resume") from None
    if not events or events[0].get("event") != "wave_start":
        raise HarnessError(f"{out.timeline} has no wave_start: not a wave that ran")
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
            open_attempts.pop(e.get("sandbox"), None)
    fired = {}
    for e in events:
        if e["event"] == "fault_clear":
            fired[e["instance"]] = {"fault_id": e["fault"], "instance": e["instance"], "task_id": e["task"],
                                    "status": e["status"], "target": {}, "detail": e.get("detail", ""),
                                    "fired_at": None, "cleared_at": e["wall"],
                                    "evidence": {"from": "the timeline of the driver that died"}}
    timeline = Timeline(out.timeline, since_wall=events[0]["wall"])
    now = time.time()
    for sid, e in open_attempts.items():  # reaped by the resume's sweep: they ended with the driver
        timeline("attempt_end", task=e["task"], attempt=e["attempt"], fence=e["fence"], sandbox=sid,
                      exit_code=None, killed_by="driver died", ended_at=now, started_at=e["wall"],
                      cause="the wave's driver died; the attempt was reaped when the wave resumed")
    unfinished = sorted(t["task_id"] for t in plan["references"] + plan["tasks"]
                        if t["task_id"] not in finished)
    timeline("wave_resumed", finished=sorted(finished), unfinished=unfinished,
                  closed_attempts=sorted(open_attempts), faults_fired_before=sorted(fired))
    return {"finished": finished, "attempts": attempts, "fired": set(fired)}, list(fired.values()), timeline
