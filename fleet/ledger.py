"""Lease ledger: SQLite (WAL) owned by one Ray actor.

Every attempt of a task runs under a lease. `acquire` hands out the next fencing
token of the task (it only grows), refusing while another unexpired lease of the
task is active. `renew` and `release` take the expected version and return
`(ok, version)`, so a zombie holding an old fence or an old version is refused.
Expiry is computed from an injected clock. `LeaseLedger` is a plain class;
`start_ledger_actor` makes it remote at the edge.
"""
from __future__ import annotations

import sqlite3
import time
from typing import Callable

from fleet.lifecycle import LEASE_TRANSITIONS, LeaseState
from fleet.records import Lease

SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
  task_id     TEXT NOT NULL,
  fence       INTEGER NOT NULL,
  attempt     INTEGER NOT NULL,
  sandbox_id  TEXT NOT NULL,
  holder      TEXT NOT NULL,
  state       TEXT NOT NULL,
  version     INTEGER NOT NULL,
  acquired_at REAL NOT NULL,
  expires_at  REAL NOT NULL,
  ended_at    REAL,
  outcome     TEXT,
  PRIMARY KEY (task_id, fence)
);
CREATE TABLE IF NOT EXISTS history (
  t        REAL NOT NULL,
  task_id  TEXT NOT NULL,
  fence    INTEGER NOT NULL,
  event    TEXT NOT NULL,
  detail   TEXT
);
"""


class LeaseLedger:
    def __init__(self, path: str, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: a commit survives the ledger process dying (the case that matters: a killed actor);
        # only an OS crash may lose the last commits. FULL fsynced every renewal and made the single-threaded
        # ledger the bottleneck that refused healthy attempts' renewals at concurrency 96 (issue 7).
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def _log(self, task_id: str, fence: int, event: str, detail: str = "") -> None:
        self.db.execute("INSERT INTO history VALUES (?,?,?,?,?)", (self.clock(), task_id, fence, event, detail))

    def _transition(self, task_id: str, fence: int, state: str, new: LeaseState) -> None:
        if new not in LEASE_TRANSITIONS[LeaseState(state)]:
            raise ValueError(f"lease {task_id}#{fence}: {state} -> {new.value} is not allowed")

    def expire_stale(self) -> int:
        now = self.clock()
        rows = self.db.execute("SELECT task_id, fence FROM leases WHERE state='active' AND expires_at <= ?",
                               (now,)).fetchall()
        for task_id, fence in rows:
            self.db.execute("UPDATE leases SET state='expired', version=version+1, ended_at=? "
                            "WHERE task_id=? AND fence=?", (now, task_id, fence))
            self._log(task_id, fence, "expired")
        return len(rows)

    def acquire(self, task_id: str, holder: str, sandbox_id: str, ttl_s: float) -> Lease | None:
        """A new lease with the next fence, or None while an unexpired lease of the task is active."""
        if ttl_s <= 0:
            raise ValueError(f"ttl_s={ttl_s!r} must be > 0")
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.expire_stale()
            if self.db.execute("SELECT 1 FROM leases WHERE task_id=? AND state='active'", (task_id,)).fetchone():
                return None
            (top,) = self.db.execute("SELECT COALESCE(MAX(fence), 0) FROM leases WHERE task_id=?",
                                     (task_id,)).fetchone()
            (attempts,) = self.db.execute("SELECT COUNT(*) FROM leases WHERE task_id=?", (task_id,)).fetchone()
            now = self.clock()
            fence = top + 1
            self.db.execute("INSERT INTO leases VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                            (task_id, fence, attempts + 1, sandbox_id, holder, "active", 1, now, now + ttl_s,
                             None, None))
            self._log(task_id, fence, "acquired", f"{holder} {sandbox_id}")
        return Lease.of(self.get(task_id, fence))

    def get(self, task_id: str, fence: int) -> dict | None:
        cur = self.db.execute("SELECT * FROM leases WHERE task_id=? AND fence=?", (task_id, fence))
        row = cur.fetchone()
        return dict(zip([c[0] for c in cur.description], row)) if row else None

    def renew(self, task_id: str, fence: int, expected_version: int, ttl_s: float) -> tuple[bool, int]:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.expire_stale()
            row = self.get(task_id, fence)
            if row is None:
                return False, 0
            if row["state"] != "active" or row["version"] != expected_version:
                self._log(task_id, fence, "renew_refused", f"state={row['state']} version={row['version']} "
                                                          f"expected={expected_version}")
                return False, row["version"]
            version = expected_version + 1
            self.db.execute("UPDATE leases SET version=?, expires_at=? WHERE task_id=? AND fence=?",
                            (version, self.clock() + ttl_s, task_id, fence))
            return True, version

    def renew_many(self, items: list[tuple]) -> list[tuple[bool, int]]:
        """Renew many leases in one transaction: [(task_id, fence, expected_version, ttl_s[, holder])] ->
        [(ok, version)].

        One call per host per tick, whatever the number of attempts it runs: renewals stay cheap under load.
        A lease renews only while active, at the expected version and not yet expired (no expiry scan). An item
        that names its `holder` is also renewed at a version newer than it expected, if the lease is still
        active, unexpired and that holder's: only renewals move an active lease's version, so the holder's own
        earlier renewal was applied after it stopped waiting for the answer (issue: fenced at 1,000 sandboxes).
        The answer is the lease's current version, which the holder keeps from then on."""
        out = []
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            now = self.clock()
            for item in items:
                task_id, fence, version, ttl_s = item[:4]
                holder = item[4] if len(item) > 4 else None
                cur = self.db.execute("UPDATE leases SET version=version+1, expires_at=? WHERE task_id=? AND fence=? "
                                      "AND state='active' AND version=? AND expires_at>?",
                                      (now + ttl_s, task_id, fence, version, now))
                if cur.rowcount == 1:
                    out.append((True, version + 1))
                    continue
                row = self.get(task_id, fence)
                if row is None:
                    out.append((False, 0))
                    continue
                if (holder is not None and row["holder"] == holder and row["state"] == "active"
                        and row["version"] > version and row["expires_at"] > now):
                    self.db.execute("UPDATE leases SET version=?, expires_at=? WHERE task_id=? AND fence=?",
                                    (row["version"] + 1, now + ttl_s, task_id, fence))
                    self._log(task_id, fence, "renew_resynced", f"expected={version} was={row['version']}")
                    out.append((True, row["version"] + 1))
                    continue
                self._log(task_id, fence, "renew_refused", f"state={row['state']} version={row['version']} "
                                                          f"expected={version} expires_at={row['expires_at']:.3f} "
                                                          f"now={now:.3f}")
                out.append((False, row["version"]))
        return out

    def ping(self) -> int:
        import os

        return os.getpid()

    def _end(self, task_id: str, fence: int, expected_version: int | None, new: LeaseState,
             outcome: str) -> tuple[bool, int]:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            row = self.get(task_id, fence)
            if row is None:
                return False, 0
            if row["state"] != "active" or (expected_version is not None and row["version"] != expected_version):
                return False, row["version"]
            self._transition(task_id, fence, row["state"], new)
            version = row["version"] + 1
            self.db.execute("UPDATE leases SET state=?, version=?, ended_at=?, outcome=? "
                            "WHERE task_id=? AND fence=?", (new.value, version, self.clock(), outcome, task_id, fence))
            self._log(task_id, fence, new.value, outcome)
            return True, version

    def release(self, task_id: str, fence: int, expected_version: int | None = None,
                outcome: str = "") -> tuple[bool, int]:
        return self._end(task_id, fence, expected_version, LeaseState.RELEASED, outcome)

    def revoke(self, task_id: str, fence: int, reason: str = "") -> tuple[bool, int]:
        return self._end(task_id, fence, None, LeaseState.REVOKED, reason)

    def active(self) -> list[dict]:
        self.expire_stale()
        cur = self.db.execute("SELECT * FROM leases WHERE state='active' ORDER BY task_id, fence")
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]

    def leases_of(self, prefix: str) -> list[dict]:
        """Every lease row whose task id starts with `prefix` (a wave's), oldest fence first (the sweep actor)."""
        self.expire_stale()
        cur = self.db.execute("SELECT task_id, fence, sandbox_id, holder, state, expires_at FROM leases "
                              "WHERE task_id >= ? AND task_id < ? ORDER BY task_id, fence", (prefix, prefix + "\uffff"))
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]

    def dump(self) -> dict:
        cur = self.db.execute("SELECT * FROM leases ORDER BY task_id, fence")
        cols = [c[0] for c in cur.description]
        leases = [dict(zip(cols, r)) for r in cur.fetchall()]
        hist = [dict(zip(("t", "task_id", "fence", "event", "detail"), r))
                for r in self.db.execute("SELECT * FROM history ORDER BY rowid")]
        return {"leases": leases, "history": hist}

    def close(self) -> None:
        self.db.close()


def actor_options(max_concurrency: int, name: str | None = None, resources: dict | None = None, strategy=None,
                  **more) -> dict:
    """Ray options of a harness actor: no CPU reserved, pinned by a node resource or a scheduling strategy."""
    opts = {"num_cpus": 0, "max_concurrency": max_concurrency, **more}
    from fleet.dockerapi import engine_env

    if engine_env():  # a Ray worker does not inherit the driver's environment: the same docker engine
        opts["runtime_env"] = {"env_vars": engine_env()}
    if name:
        opts["name"] = name
    if resources:
        opts["resources"] = resources
    if strategy is not None:
        opts["scheduling_strategy"] = strategy
    return opts


def start_ledger_actor(path: str, name: str | None = None, resources: dict | None = None, strategy=None):
    """The ledger as one Ray actor (the only writer of its SQLite file); `resources` pins it (to the head)."""
    import ray

    if not path:
        raise ValueError("ledger path must be a file path")
    return ray.remote(LeaseLedger).options(**actor_options(1, name, resources, strategy)).remote(path)
