"""A stored `plan.json` checked before `wave resume`, `wave replay` or `shrink` acts on it: every field those
commands (and the driver they start) read has the shape the planner writes, and every id that names a path (the
wave's, a task's, a fault instance's) is a plain name. A damaged or hand-edited plan is a `PlanError` naming the
file and the field (exit 2), never a traceback and never a path built from an unchecked id."""
from __future__ import annotations

import math
import re
from pathlib import Path

from cluster import results
from cluster.artifacts import is_cache_key

ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")  # no '/', no leading '.', no control byte: safe in a path
TASK_FIELDS = ("task_id", "role", "seed", "runner", "workload", "steps", "faults", "reference", "reference_of",
               "boundary")  # fleet.records.PlannedTask
FAULT_FIELDS = ("fault_id", "instance", "task_id", "trigger", "at_s", "window_s", "probability", "seed", "params")


class PlanError(ValueError):
    """The plan's file and field, and what is wrong with it."""




def _kind(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number")


def safe_id(v) -> bool:
    return isinstance(v, str) and ID.fullmatch(v) is not None and ".." not in v


class _Checker:
    def __init__(self, source: str):
        self.source = source

    def bad(self, where: str, value, want: str) -> PlanError:
        shown = repr(value) if isinstance(value, (str, int, float, bool, type(None))) else _kind(value)
        return PlanError(f"{self.source}: field `{where}`: value {shown[:80]}: expected {want}")

    def need(self, d: dict, key: str, where: str, ok, want: str, optional: bool = False):
        if key not in d:
            if optional:
                return None
            raise PlanError(f"{self.source}: field `{where}{key}`: missing (expected {want})")
        v = d[key]
        if not ok(v):
            raise self.bad(where + key, v, want)
        return v


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _str(v) -> bool:
    return isinstance(v, str)


def _opt(ok):
    return lambda v: v is None or ok(v)


MAX_PLAN_BYTES = 256 * 1024 * 1024  # a plan of 100k tasks is ~60 MB


def read(path: Path) -> dict:
    """A stored plan.json, read as a regular file only (never through a link, never a FIFO that would hang the read,
    at most MAX_PLAN_BYTES) and checked (`check`). FileNotFoundError when there is none; PlanError otherwise."""
    import os
    import stat

    import orjson

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise
    except OSError as exc:
        raise PlanError(f"{path}: cannot be opened as a regular file ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PlanError(f"{path}: not a regular file")
        if st.st_size > MAX_PLAN_BYTES:
            raise PlanError(f"{path}: {st.st_size} bytes, more than a plan's {MAX_PLAN_BYTES}")
        data = f.read(MAX_PLAN_BYTES + 1)
    try:
        plan = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise PlanError(f"{path}: not valid JSON ({exc})") from None
    return check(plan, path)


def check(plan, source: str | Path = results.PLAN) -> dict:
    """`plan` (parsed JSON) when it has the planner's shape; PlanError naming `source` and the field otherwise."""
    from faults.base import CATALOG

    c = _Checker(str(source))
    if not isinstance(plan, dict):
        raise PlanError(f"{source}: {_kind(plan)}, not a wave's plan (an object)")
    c.need(plan, "wave_id", "", safe_id, "a wave id (letters, digits, '.', '_', '-', '+'; no '/' or '..')")
    c.need(plan, "seed", "", _int, "an integer")
    c.need(plan, "created_at", "", _num, "a time (a finite number)", optional=True)
    c.need(plan, "config", "", lambda v: isinstance(v, dict), "an object (the wave's config)")
    c.need(plan, "manifest", "", _opt(lambda v: isinstance(v, dict)), "an object or null", optional=True)
    runner = c.need(plan, "runner", "", lambda v: isinstance(v, dict), "an object (name, command, env, workdir)")
    c.need(runner, "name", "runner.", _str, "a string")
    c.need(runner, "command", "runner.", lambda v: isinstance(v, list) and v and all(isinstance(a, str) and a and
                                                                                       "\0" not in a for a in v),
           "a non-empty list of non-empty strings")
    c.need(runner, "env", "runner.", lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(x, str) and "\0" not in k + x for k, x in v.items()),
        "an object of strings", optional=True)
    c.need(runner, "workdir", "runner.", _opt(_str), "a string or null", optional=True)
    c.need(runner, "builtin", "runner.", _opt(_str), "a string or null", optional=True)
    seen = set()
    for part in ("tasks", "references"):
        tasks = c.need(plan, part, "", lambda v, part=part: isinstance(v, list) and bool(v or part == "references"),
                       "a list of planned tasks" + (" (at least one: a plan of none grades nothing)"
                                                    if part == "tasks" else ""))
        for i, t in enumerate(tasks):
            w = f"{part}[{i}]."
            if not isinstance(t, dict):
                raise c.bad(f"{part}[{i}]", t, "an object (a planned task)")
            extra = sorted(set(t) - set(TASK_FIELDS), key=str)
            if extra:
                raise PlanError(f"{source}: field `{w}{extra[0]}`: not a field of a planned task (its fields: "
                                f"{', '.join(TASK_FIELDS)})")
            tid = c.need(t, "task_id", w, safe_id, "a task id (letters, digits, '.', '_', '-'; no '/' or '..')")
            if tid in seen:
                raise c.bad(w + "task_id", tid, "a task id no other task of the plan has")
            seen.add(tid)
            c.need(t, "role", w, _str, "a string")
            c.need(t, "seed", w, _int, "an integer")
            c.need(t, "runner", w, _str, "a string")
            c.need(t, "workload", w, _str, "a string")
            c.need(t, "steps", w, lambda v: _int(v) and 1 <= v <= 100000, "an integer from 1")
            c.need(t, "reference_of", w, _opt(safe_id), "a task id or null", optional=True)
            c.need(t, "boundary", w, _opt(lambda v: isinstance(v, dict)), "an object or null", optional=True)
            ref = c.need(t, "reference", w, lambda v: isinstance(v, dict), "an object (task_id, key, cached)",
                         optional=part == "references") or {}
            if ref or part == "tasks":
                c.need(ref, "task_id", w + "reference.", safe_id, "a task id")
                c.need(ref, "key", w + "reference.", is_cache_key,
                       "32 hex digits, or those and '-b' for a second run (the reference cache's key)")
            for j, f in enumerate(c.need(t, "faults", w, lambda v: isinstance(v, list), "a list of faults")):
                fw = f"{w}faults[{j}]"
                if not isinstance(f, dict):
                    raise c.bad(fw, f, "an object (a planned fault)")
                extra = sorted(set(f) - set(FAULT_FIELDS), key=str)
                if extra:
                    raise PlanError(f"{source}: field `{fw}.{extra[0]}`: not a field of a planned fault (its fields: "
                                    f"{', '.join(FAULT_FIELDS)})")
                fw += "."
                c.need(f, "fault_id", fw, lambda v: isinstance(v, str) and v in CATALOG,
                       f"a fault id of the catalog ({', '.join(sorted(CATALOG))})")
                c.need(f, "instance", fw, safe_id, "a fault instance id")
                c.need(f, "task_id", fw, _str, "a string")
                c.need(f, "trigger", fw, _str, "a string")
                c.need(f, "at_s", fw, _opt(_num), "a number or null")
                c.need(f, "window_s", fw, _opt(_num), "a number or null", optional=True)
                c.need(f, "probability", fw, _num, "a number", optional=True)
                c.need(f, "seed", fw, _int, "an integer", optional=True)
                params = c.need(f, "params", fw, lambda v: isinstance(v, dict), "an object", optional=True) or {}
                c.need(params, "after", fw + "params.", _opt(_int), "an integer or null", optional=True)
                c.need(params, "kills", fw + "params.", lambda v: _int(v) and v >= 1, "an integer from 1",
                       optional=True)
    return plan
