"""The task registry the services share (per-task and per-attempt keys, liveness) and the call log they write."""
from __future__ import annotations

import contextlib
import secrets
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import orjson


@dataclass
class TaskEntry:
    task_id: str
    seed: int
    steps: int
    workload: str
    key: str
    attempt: int | None = None  # the attempt holding the task's lease right now (set by the driver)


class TaskRegistry:
    """Per-task random keys and the attempt that holds each task's lease, shared by the services."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_key: dict[str, TaskEntry] = {}
        self.by_task: dict[str, TaskEntry] = {}
        self.by_sandbox: dict[str, str] = {}  # sandbox id -> its attempt's key
        self.revoked: dict[str, TaskEntry] = {}  # keys of attempts whose lease ended (fenced)
        self.seen: dict[str, float] = {}  # key -> wall time of the latest request that named it (liveness)
        self.in_flight: dict[str, int] = {}  # key -> its model calls being answered now (the endpoint thinking)

    def register(self, task_id: str, seed: int, steps: int, workload: str) -> str:
        with self.lock:
            if task_id in self.by_task:
                return self.by_task[task_id].key
            entry = TaskEntry(task_id, seed, steps, workload, "sf-" + secrets.token_urlsafe(24))
            self.by_key[entry.key] = entry
            self.by_task[task_id] = entry
            return entry.key

    def attempt_key(self, task_id: str, attempt: int, sandbox_id: str) -> str:
        """A key of one attempt: calls with it are that attempt's (never a guess from the time), and it dies with
        the attempt's lease, so a zombie of the attempt (frozen, then thawed) is refused."""
        with self.lock:
            key = "sf-" + secrets.token_urlsafe(24)
            self.by_key[key] = replace(self.by_task[task_id], key=key, attempt=attempt)
            self.by_sandbox[sandbox_id] = key
            return key

    def revoke_attempt(self, sandbox_id: str) -> None:
        with self.lock:
            key = self.by_sandbox.get(sandbox_id)
            entry = self.by_key.pop(key, None) if key else None
            if entry is not None:
                self.revoked[key] = entry

    def issued_keys(self) -> set[str]:
        with self.lock:
            return {e.key for e in self.by_task.values()} | set(self.by_sandbox.values())

    def set_attempt(self, task_id: str, attempt: int | None) -> None:
        with self.lock:
            self.by_task[task_id].attempt = attempt

    def lookup(self, key: str) -> TaskEntry | None:
        with self.lock:
            return self.by_key.get(key)

    def touch(self, key: str) -> None:
        """A model call or an effect arrived with this key: what `liveness` counts as the attempt doing something
        (a `GET /v1/models` poll is not)."""
        with self.lock:
            self.seen[key] = time.time()

    @contextlib.contextmanager
    def answering(self, key: str):
        """A model call of this key is being answered: the attempt is waiting on the harness, not silent (a
        `think_ms` longer than `liveness_s` must not get the waiting runner killed as hung)."""
        self.touch(key)
        with self.lock:
            self.in_flight[key] = self.in_flight.get(key, 0) + 1
        try:
            yield
        finally:
            with self.lock:
                self.in_flight[key] -= 1
                if not self.in_flight[key]:
                    del self.in_flight[key]
                self.seen[key] = time.time()  # (answered, or given up on: seen up to now)

    def last_seen(self, sandbox_id: str) -> float | None:
        """Wall time of the latest model call or effect by the attempt's own key (None: none yet); now while one of
        its model calls is being answered."""
        with self.lock:
            key = self.by_sandbox.get(sandbox_id)
            if key and self.in_flight.get(key):
                return time.time()
            return self.seen.get(key) if key else None


class CallLog:
    """Append-only JSON lines, written as they happen (a dead driver still leaves the log)."""

    def __init__(self, path: str | Path | None):
        self.lock = threading.Lock()
        self.records: list[dict] = []
        self.f = open(path, "ab") if path else None

    def append(self, rec: dict) -> None:
        with self.lock:
            self.records.append(rec)
            if self.f is not None:
                self.f.write(orjson.dumps(rec) + b"\n")
                self.f.flush()

    def preload(self, path: str | Path) -> list[dict]:
        """A resumed wave: take the records an earlier driver logged (a torn last line is dropped)."""
        recs = []
        try:
            lines = Path(path).read_bytes().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                recs.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
        with self.lock:
            self.records[:0] = recs
        return recs

    def snapshot(self) -> list[dict]:
        with self.lock:
            return [dict(r) for r in self.records]

    def close(self) -> None:
        with self.lock:
            if self.f is not None:
                self.f.close()
                self.f = None
