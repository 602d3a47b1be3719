"""Lifecycles as transition tables: an enum of states, a dict of valid next states,
and a history of (time, from, to, why) appended on every change."""
from __future__ import annotations

import time
from enum import Enum
from typing import Callable


class InvalidTransition(RuntimeError):
    pass


class Lifecycle:
    """Holds one object's state; `to()` refuses edges the table does not list."""

    def __init__(self, table: dict[Enum, set[Enum]], initial: Enum, clock: Callable[[], float] = time.time):
        self.table = table
        self.state = initial
        self.clock = clock
        self.history: list[tuple[float, str, str, str]] = []

    def can(self, new: Enum) -> bool:
        return new in self.table[self.state]

    def to(self, new: Enum, why: str = "") -> None:
        if new not in self.table[self.state]:
            allowed = sorted(s.value for s in self.table[self.state])
            raise InvalidTransition(f"{self.state.value} -> {new.value} is not allowed; from "
                                    f"{self.state.value} the next states are {allowed}")
        self.history.append((self.clock(), self.state.value, new.value, why))
        self.state = new


class SandboxState(str, Enum):
    CREATED = "created"
    RUNNING = "running"
    STOPPING = "stopping"
    FROZEN = "frozen"
    EXITED = "exited"
    KILLED = "killed"
    FAILED = "failed"
    REMOVED = "removed"


SANDBOX_TRANSITIONS: dict[Enum, set[Enum]] = {
    # created: cgroups made, process not yet started
    SandboxState.CREATED: {SandboxState.RUNNING, SandboxState.FAILED},
    # running: the runner may exit by itself, be stopped, or be frozen (PK6)
    SandboxState.RUNNING: {SandboxState.EXITED, SandboxState.STOPPING, SandboxState.FROZEN},
    # stopping: SIGTERM/grace/SIGKILL in progress; ends when the cgroup is empty
    SandboxState.STOPPING: {SandboxState.KILLED, SandboxState.EXITED},
    # frozen: thawed back to running, or killed while frozen
    SandboxState.FROZEN: {SandboxState.RUNNING, SandboxState.STOPPING},
    # terminal states are only left by removing the cgroups and state dir
    SandboxState.EXITED: {SandboxState.REMOVED},
    SandboxState.KILLED: {SandboxState.REMOVED},
    SandboxState.FAILED: {SandboxState.REMOVED},
    SandboxState.REMOVED: set(),
}


class LeaseState(str, Enum):
    ACTIVE = "active"
    RELEASED = "released"
    EXPIRED = "expired"
    REVOKED = "revoked"


LEASE_TRANSITIONS: dict[Enum, set[Enum]] = {
    # active: renewed by its host while the sandbox lives
    LeaseState.ACTIVE: {LeaseState.RELEASED, LeaseState.EXPIRED, LeaseState.REVOKED},
    # released by the holder after the attempt ended
    LeaseState.RELEASED: set(),
    # expired: no renewal before expires_at; a later attempt takes a higher fence
    LeaseState.EXPIRED: set(),
    # revoked by the harness (e.g. node lost)
    LeaseState.REVOKED: set(),
}


class TaskState(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    RETRYING = "retrying"
    DONE = "done"
    FAILED = "failed"
    DEADLINE = "deadline"


TASK_TRANSITIONS: dict[Enum, set[Enum]] = {
    # pending: planned, waiting for a concurrency slot
    TaskState.PENDING: {TaskState.RUNNING, TaskState.DEADLINE},
    # running: an attempt holds a lease and a sandbox
    TaskState.RUNNING: {TaskState.DONE, TaskState.RETRYING, TaskState.FAILED, TaskState.DEADLINE},
    # retrying: the attempt died (preempted); the next one takes the next fence
    TaskState.RETRYING: {TaskState.RUNNING, TaskState.FAILED, TaskState.DEADLINE},
    TaskState.DONE: set(),
    TaskState.FAILED: set(),
    TaskState.DEADLINE: set(),
}
# a task in one of these has ended: no edge leaves them
TASK_ENDED = frozenset(s for s, nxt in TASK_TRANSITIONS.items() if not nxt)
