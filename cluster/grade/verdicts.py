"""The verdicts a check gives and how they merge: fail > unknown > not_applied > pass (Jepsen's three values,
plus `not_applied` for a fault that never applied), and the constants the checks share."""
from __future__ import annotations

import re

PASS, FAIL, UNKNOWN, NOT_APPLIED = "pass", "fail", "unknown", "not_applied"
RANK = {PASS: 0, NOT_APPLIED: 1, UNKNOWN: 2, FAIL: 3}
WRITE_METHODS = {"PUT", "POST", "DELETE"}
# an attempt's last lines of output name its failure when they carry one of these (any runner, any language)
ERROR_WORDS = re.compile(r"(?i)error|exception|fail|traceback|denied|refused|timed? ?out|no space|abort|panic|"
                         r"fatal|killed|unavailable|forbidden|crash|dying|died|giving up|cannot|could not|can't|"
                         r"no such file|not found|errno|permission|unable to|invalid|missing")


def merge(verdicts) -> str:
    out = PASS
    for v in verdicts:
        if RANK[v] > RANK[out]:
            out = v
    return out


# liveness: a silence is the harness's (unknown) when the host averaged this many runnable tasks per core
OVERLOAD_PER_CORE = 4
