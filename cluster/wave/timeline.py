"""The wave's event log (`timeline.jsonl`, one JSON object per line, flushed per event) and the state of each
task's run (its lifecycle, its running attempt, its fault watches)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from fleet.lifecycle import TASK_TRANSITIONS, Lifecycle, TaskState


class Timeline:
    def __init__(self, path: Path, since_wall: float | None = None):
        """`since_wall`: the wall time of an earlier segment's t=0 (a resumed wave's clock continues)."""
        self.t0 = time.monotonic() - (time.time() - since_wall if since_wall is not None else 0.0)
        self.f = open(path, "ab")

    def __call__(self, event: str, **fields) -> dict:
        rec = {"t": round(time.monotonic() - self.t0, 4), "wall": time.time(), "event": event, **fields}
        self.f.write(orjson.dumps(rec, default=str) + b"\n")
        self.f.flush()
        return rec

    def close(self) -> None:
        self.f.close()


@dataclass
class TaskRun:
    plan: dict
    life: Lifecycle = field(default_factory=lambda: Lifecycle(TASK_TRANSITIONS, TaskState.PENDING))
    current: tuple | None = None  # (host handle, sandbox_id) while an attempt runs
    node: str | None = None  # the node of the attempt that runs now
    abandon: dict | None = None  # PK6: set to give up on the running attempt (frozen past its lease)
    arms: dict = field(default_factory=dict)  # instance -> {"arm": watch started with each attempt, "future"}
    abandon_ev: asyncio.Event | None = None
    attempts: int = 0
    finished_before: bool = False  # a resumed wave: it ended before the driver died (kept, not run again)

    def running_sandbox(self) -> str | None:
        return self.current[1] if self.current is not None else None
