"""The checks of a task's grade: one function per check, `(history, facts) -> result`, and the registry that says
which apply to a task.

`Facts` holds what every check derives once from the task's history (its attempts, its end, the key ids each
attempt held, ...). A check returns a dict with `verdict` (pass / fail / unknown / not_applied) and `detail`, plus
its own evidence; `cluster/grade/task.py` runs each through a check-safe wrapper (a crashed check is `unknown`).
Which checks apply is decided by the task (a reference has no resume or fault check), the workload (multi-file
applies), the wave's inputs (the store audit, per-attempt keys) and the fault catalog's attributes
(`kills_attempt`, `takes_node`, `adds_checks`), never by a fault id.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from cluster.grade.history import TaskHistory
from cluster.grade.facts import Facts, adds_check, kills_attempt, takes_node  # noqa: F401 (the registry's vocabulary)
from cluster.grade.runs import attempt_budget, fault_applied, liveness, no_outliving_process
from cluster.grade.store import (credentials_reresolved, diagnosable, fenced_writes_rejected, no_foreign_writes,
                                 no_leaked_upload, retry_loop, within_store_quota)
from cluster.grade.work import completed, no_double_apply, no_model_recall, no_torn_apply, resume_equivalent


@dataclass(frozen=True)
class Check:
    name: str
    fn: Callable[["TaskHistory", Facts], dict]
    applies: Callable[["TaskHistory", Facts], bool]
    when: str = "every task and reference"  # what `applies` says, in words (docs/reference/checks.md)


def _always(h, facts) -> bool:
    return True


def _not_reference(h, facts) -> bool:
    return not facts.is_ref


# in the order a grade lists them
REGISTRY: list[Check] = [
    Check("completed", completed, _always),
    Check("resume_equivalent", resume_equivalent, _not_reference, "every task but the references"),
    Check("no_double_apply", no_double_apply, _always),
    Check("no_model_recall", no_model_recall, _always),
    Check("no_torn_apply", no_torn_apply, lambda h, f: any(s.files for s in f.script),
          "tasks of a workload with multi-file applies"),
    Check("fault_applied", fault_applied, _not_reference, "every task but the references"),
    Check("diagnosable", diagnosable, _always),
    Check("retry_loop", retry_loop, _always),
    Check("liveness", liveness, _always),
    Check("attempt_budget", attempt_budget, _always),
    # the host looked at what outlived each attempt's runner (the process backend's wrapper)
    Check("no_outliving_process", no_outliving_process,
          lambda h, f: any(a.get("outlived") is not None for a in f.attempts),
          "tasks whose host listed what outlived the runner (the process backend)"),
    # the store audit ran: a leaked upload fails the task that started it
    Check("no_leaked_upload", no_leaked_upload, lambda h, f: h.leaked_uploads is not None,
          "tasks of a wave whose store audit ran"),
    # the wave had a store quota (a plan from before it has none) and the proxy's log: a refused write fails
    Check("within_store_quota", within_store_quota,
          lambda h, f: h.requests is not None and bool(h.limits.get("store_quota")),
          "tasks of a wave with a store quota (store.quota_objects) and the proxy's log"),
    # attributable (per-attempt keys): the writer answers for its writes
    Check("no_foreign_writes", no_foreign_writes, lambda h, f: h.foreign_writes is not None,
          "tasks of a wave with per-attempt keys (the embedded store)"),
    # a fault that brings a check of its own (PK6: the thawed zombie's writes are refused)
    Check("fenced_writes_rejected", fenced_writes_rejected,
          lambda h, f: any(adds_check(x.get("fault_id"), "fenced_writes_rejected")
                           for x in f.task.get("faults") or []),
          "tasks with a fault that adds it (PK6, NP1)"),
    # a key rotated under an attempt (CR1): the runner re-resolved its credentials rather than keep the dead key
    Check("credentials_reresolved", credentials_reresolved,
          lambda h, f: any(adds_check(x.get("fault_id"), "credentials_reresolved")
                           for x in f.task.get("faults") or []),
          "tasks with a fault that adds it (CR1)"),
]

# the checks of the whole wave (`wave_checks_of` in cluster/grade/wave.py gives one verdict for each)
WAVE_CHECKS: dict[str, str] = {
    "no_leaked_sandbox": "no sandbox left behind, by the hosts' sweep at the wave's end and the sweep actor "
                         "(`unknown` when either could not look everywhere; after a harness fault a lost part's "
                         "sandboxes are the harness's, `unknown`)",
    "no_leaked_upload": "no multipart upload left incomplete in the store (from the store audit)",
    "positive_control": "the references (uninterrupted, fault-free runs of the same runner and seeds, and the tasks "
                        "with no fault planned that ran as one and were their own) passed; a wave "
                        "with faults whose positive control is not 1.0 is a harness error, exit 2, unless the "
                        "reference fails on the runner's own (then the runner fails, exit 1)",
    "store_audit": "every object read back through a second client (`minio`) is what its writer sent: no short "
                   "read, no key outside the tasks",
    "harness": "no harness error: every part of the harness stayed up and answered",
}


def applicable(h: "TaskHistory", facts: Facts) -> list[Check]:
    return [c for c in REGISTRY if c.applies(h, facts)]
