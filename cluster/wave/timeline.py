"""The wave's event log (`timeline.jsonl`, one JSON object per line, flushed per event) and the state of each
task's run (its lifecycle, its running attempt, its fault watches)."""
from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from fleet.lifecycle import TASK_TRANSITIONS, Lifecycle, TaskState
from fleet.records import PlannedTask


class Event(str, enum.Enum):
    """Every event the timeline holds (the grader, the report and resume read them by these names)."""

    WAVE_START = "wave_start"
    WAVE_RESUMED = "wave_resumed"
    PARTS_READY = "parts_ready"
    FLEET_HEALED = "fleet_healed"
    FLEET_WARNING = "fleet_warning"  # e.g. every sandbox on the driver's machine of an --address cluster
    CODE_SHIPPED = "code_shipped"  # remote nodes: the runner's snapshot (bytes) and the envs each node has its own
    TASK_START = "task_start"
    ATTEMPT_START = "attempt_start"
    LEASE_BUSY = "lease_busy"
    ATTEMPT_END = "attempt_end"
    ZOMBIE_END = "zombie_end"
    ATTEMPT_SILENT = "attempt_silent"  # silent past liveness_s: the harness ends it (cluster/wave/silence.py)
    TASK_RETRY = "task_retry"
    TASK_END = "task_end"
    FAULT_INJECT = "fault_inject"
    FAULT_CLEAR = "fault_clear"
    KEY_ROTATED = "key_rotated"
    NODE_LOST = "node_lost"
    NODE_BACK = "node_back"
    LINK_CUT = "link_cut"  # NP1: a node's link to the head went down
    LINK_HEALED = "link_healed"
    LINK_DEGRADED = "link_degraded"  # NP2
    LINK_RESTORED = "link_restored"
    NODE_NOT_BACK = "node_not_back"
    NODE_FAULT_TURN = "node_fault_turn"  # a task with a node-level fault got its turn and its node
    BOUNDARIES_ENUMERATED = "boundaries_enumerated"
    SECOND_REFERENCES = "second_references"  # a task differed from its reference: the seed runs once more
    # a task planned as its own reference (no fault) was no uninterrupted run: its reference runs after the tasks
    REFERENCES_AFTER = "references_after"
    PART_PROBE_FAILED = "part_probe_failed"
    HARNESS_FAULT = "harness_fault"
    HARNESS_ERROR = "harness_error"
    WAVE_INTERRUPTED = "wave_interrupted"
    WAVE_STOPPED_AT_ONCE = "wave_stopped_at_once"
    PROXY_RULES_NOT_CLEARED = "proxy_rules_not_cleared"
    PROXY_RULES_FORCE_CLOSED = "proxy_rules_force_closed"
    PROXY_CLEAR_FAILED = "proxy_clear_failed"
    SWEEP_ACTOR = "sweep_actor"
    LEASE_RENEWALS = "lease_renewals"
    SERVICE_COUNTS = "service_counts"
    STORE_KEYS = "store_keys"
    TEARDOWN_ERRORS = "teardown_errors"
    RAY_LEFTOVERS_ENDED = "ray_leftovers_ended"
    KEYS_REVOKED_AT_END = "keys_revoked_at_end"
    WAVE_END = "wave_end"


EVENTS = frozenset(e.value for e in Event)


class Timeline:
    def __init__(self, path: Path, since_wall: float | None = None):
        """`since_wall`: the wall time of an earlier segment's t=0 (a resumed wave's clock continues)."""
        self.t0 = time.monotonic() - (time.time() - since_wall if since_wall is not None else 0.0)
        self.f = open(path, "ab")

    def __call__(self, event: Event, **fields) -> dict:
        """Append one event. Every writer passes an `Event` (a unit test holds it); a name is read as one, and a name
        that is not one raises, so a typo cannot write an event that nothing reads."""
        if event not in EVENTS:
            raise ValueError(f"unknown timeline event {event!r}; the events are cluster.wave.timeline.Event")
        rec = {"t": round(time.monotonic() - self.t0, 4), "wall": time.time(), "event": str(Event(event).value),
               **fields}
        self.f.write(orjson.dumps(rec, default=str) + b"\n")
        self.f.flush()
        return rec

    def close(self) -> None:
        self.f.close()


@dataclass
class TaskRun:
    plan: PlannedTask  # the task as planned (typed: fleet/records.py)
    life: Lifecycle = field(default_factory=lambda: Lifecycle(TASK_TRANSITIONS, TaskState.PENDING))
    current: tuple | None = None  # (host handle, sandbox_id) while an attempt runs
    node: str | None = None  # the node of the attempt that runs now
    abandon: dict | None = None  # PK6: set to give up on the running attempt (frozen past its lease)
    arms: dict = field(default_factory=dict)  # instance -> {"arm": watch started with each attempt, "future"}
    abandon_ev: asyncio.Event | None = None
    silenced: str | None = None  # the sandbox the silence watch ended (once per attempt)
    attempts: int = 0
    finished_before: bool = False  # a resumed wave: it ended before the driver died (kept, not run again)
    last_killed_by: str | None = None  # what ended its last attempt (a fault's instance): the disk mode it leaves
    disk_ops: dict | None = None  # a lazy volume's boundaries so far ({write, fsync, rename}), as its host counted

    def running_sandbox(self) -> str | None:
        return self.current[1] if self.current is not None else None
