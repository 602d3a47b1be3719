"""Grading: reads only what a wave stored under `results/<wave>/` and gives every task
a verdict. Checks have three outcomes plus `not_applied`; a check that crashes is
`unknown`, never `pass`. Merge order: fail > unknown > not_applied > pass.

Nothing here imports a runner: the inputs are the artifact the harness captured
from the workspace, the reference (an uninterrupted run of the same runner on the
same seed), the model endpoint's and effects service's logs, the proxy's request
log and the driver's timeline. The workload (the test's world) says which steps
leave a marker in the artifact and which effect belongs to which step.

Checks per task:
- completed: the last attempt exited 0, the harness captured `repo/`, every
  workspace step's marker and every external effect of the script is there.
- resume_equivalent: the artifact's digest equals the reference's. If two
  uninterrupted runs of one seed differ, `unknown` (the runner is not
  deterministic under a fixed model), never pass or fail.
- no_double_apply: no step's marker twice in the artifact, and no effect applied
  twice in the effects log (a repeated Idempotency-Key is a deduplicated retry).
- no_model_recall: asking again for a step whose result had been recorded is a
  recall. Only the answer that was in flight when its attempt ended is forgiven:
  not delivered, or delivered to an attempt that then ended with no later model
  call, no effect of that step and no store write.
- fault_applied: every planned fault's receipt says applied.
"""
from __future__ import annotations

from cluster.grade.evidence import redact, write_evidence  # noqa: F401
from cluster.grade.history import Attribution, TaskHistory, attribute, recall_analysis, task_history  # noqa: F401
from cluster.grade.inputs import Inputs, Unreadable, WaveRecord, read_wave  # noqa: F401
from cluster.grade.task import excuse, grade_task, run_checks, task_figures  # noqa: F401
from cluster.grade.verdicts import (ERROR_WORDS, FAIL, NOT_APPLIED, OVERLOAD_PER_CORE, PASS, RANK, UNKNOWN,  # noqa: F401
                                    WRITE_METHODS, merge)
from cluster.grade.wave import (exit_code, grade_tasks, grade_wave, leaks_of, runner_failures,  # noqa: F401
                                runner_own_failure, ungraded_wave, wave_checks_of, write_grades)
