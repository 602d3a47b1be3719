"""What every check derives once from a task's history (`Facts`), and what the grader asks the fault catalog
(`kills_attempt`, `takes_node`, `adds_check`), never a fault id."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from faults import CATALOG

if TYPE_CHECKING:
    from cluster.grade.history import TaskHistory


def _fault(fault_id: str | None):
    return CATALOG.get(fault_id or "")


def kills_attempt(fault_id: str | None) -> bool:
    """One kill of the task's running attempt at a moment of the runner (PK1, PK2, PK5): a kill that landed before
    the attempt did anything durable tested nothing."""
    return bool(getattr(_fault(fault_id), "kills_attempt", False))


def takes_node(fault_id: str | None) -> bool:
    return bool(getattr(_fault(fault_id), "takes_node", False))


def adds_check(fault_id: str | None, check: str) -> bool:
    return check in (getattr(_fault(fault_id), "adds_checks", ()) or ())


def attempt_cause(a: dict) -> str:
    """Why an attempt ended, as the grades name it: its recorded cause, else its exit code."""
    return a.get("cause") or f"exit {a.get('exit_code')}"


@dataclass
class Facts:
    """What every check derives once from a task's history."""

    task: dict
    tid: str
    wl: object
    script: list
    attempts: list[dict]
    end: dict | None
    interrupted: list[dict]
    is_ref: bool
    starts: dict
    by_attempt: dict
    akids: dict[int, set]
    dead_keys: dict
    fault_kills: set

    @classmethod
    def of(cls, h: "TaskHistory") -> "Facts":
        from fleet import workloads

        task = h.task
        tid = task["task_id"]
        wl = workloads.get(task.get("workload", "patch-repo"))
        attempts = [e for e in h.events if e["event"] == "attempt_end"]
        by_attempt = {e["attempt"]: e for e in h.events if e["event"] == "attempt_start"}
        akids: dict[int, set] = {}  # attempt -> every key id it held (CR1 rotates one mid-attempt)
        for e in h.events:
            if e["event"] == "attempt_start" and e.get("akid"):
                akids.setdefault(e["attempt"], set()).add(e["akid"])
            elif e["event"] == "key_rotated":
                att = next((a for a, st in by_attempt.items() if st.get("sandbox") == e.get("sandbox")), None)
                if att is not None:
                    akids.setdefault(att, set()).update({e.get("akid"), e.get("old_akid")})
        return cls(
            task=task, tid=tid, wl=wl, script=wl.script(task["seed"], task["steps"]), attempts=attempts,
            end=next((e for e in h.events if e["event"] == "task_end"), None),
            interrupted=[a for a in attempts if a.get("exit_code") != 0],
            is_ref=task.get("role") == "reference",
            starts={e.get("sandbox"): e for e in h.events if e["event"] == "attempt_start"},
            by_attempt=by_attempt, akids=akids,
            # CR1: a key rotated at the store answers real 403s (no proxy rule tags them); requests signed with it
            # after its rotation are the fault's doing, not a runner's retry loop
            dead_keys={e.get("old_akid"): e["wall"] for e in h.events
                       if e["event"] == "key_rotated" and e.get("old_akid")},
            fault_kills={(r.get("target") or {}).get("sandbox_id") for r in h.receipts
                         if r["task_id"] == tid and r.get("status") == "applied"})

    @property
    def noticed(self) -> list[dict]:
        """Attempts that exited 0 while the harness was stopping them: a spot notice's SIGTERM (PK2) the runner
        answered by exiting 0 in the grace. Exit 0 ends the task, but the attempt was interrupted all the same."""
        return [a for a in self.attempts if a.get("exit_code") == 0 and a.get("killed_by")]

    @property
    def was_interrupted(self) -> bool:
        """An attempt failed, or was stopped (a notice it answered by exiting 0 is an interruption too)."""
        return bool(self.interrupted or self.noticed)

    def rotated_out(self, r: dict) -> bool:
        t = self.dead_keys.get(r.get("akid"))
        return t is not None and r["t"] >= t - 0.5

    def mine(self, r: dict, attempt: int, t0: float, t1: float) -> bool:
        ids = self.akids.get(attempt)
        return r.get("akid") in ids if ids else t0 <= r["t"] <= t1

