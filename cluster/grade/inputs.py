"""What a wave stored, read once (`read_wave` -> `WaveRecord`): every input file through `Inputs`, which keeps a
digest of each and names any it could not read (what depends on it is then unknown)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from cluster import results
from cluster.receipts import checked_receipts, receipts_of


class Unreadable(Exception):
    """An input file exists but cannot be read or parsed: whatever depends on it is unknown."""


class Inputs:
    """Reads the wave's files, and remembers a digest of every input it read (stored with each grade)."""

    def __init__(self, d: Path):
        self.d = d
        self.digests: dict[str, str] = {}
        self.unreadable: dict[str, str] = {}
        self.skipped: dict[str, list[str]] = {}  # file -> "record N: why" of each record left out (first 20)
        self.skipped_count: dict[str, int] = {}

    def _bytes(self, name: str) -> bytes | None:
        try:
            data = results.regular_bytes(self.d / name)
        except FileNotFoundError:
            return None
        except ValueError as exc:
            self.unreadable[name] = str(exc)
            raise Unreadable(f"{name}: {exc}") from None
        except OSError as exc:
            self.unreadable[name] = str(exc)
            raise Unreadable(f"{name}: {exc}") from None
        self.digests[name] = hashlib.sha256(data).hexdigest()
        return data

    def json(self, name: str, default=None):
        data = self._bytes(name)
        if data is None:
            return default
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            self.unreadable[name] = f"not valid JSON: {exc}"
            raise Unreadable(f"{name}: not valid JSON: {exc}") from None

    REQUIRED = {results.TIMELINE: ("event",), results.MODEL_CALLS: ("task", "step", "t"),
                results.EFFECTS: ("task", "effect_id", "t"), results.PROXY_REQUESTS: ("t", "method")}

    def lines(self, name: str) -> list[dict] | None:
        """JSON lines; None when the file is missing. Only a torn last line is tolerated; a line of the
        wrong shape makes the file unreadable (never a traceback, never a silent pass)."""
        data = self._bytes(name)
        if data is None:
            return None
        need = self.REQUIRED.get(name, ())
        try:
            recs = results.parse_jsonl(data, need)
        except results.JsonlError as exc:
            self.unreadable[name] = str(exc)
            why = exc.why if need or not exc.why.startswith("not a record") else "not a record with fields"
            raise Unreadable(f"{name} line {exc.line}: {why}") from None
        out, left = results.fit(recs, name)
        if left:
            self.skipped[name] = left[:20]
            self.skipped_count[name] = len(left)
        return out

    def lines_or_none(self, name: str) -> list[dict] | None:
        try:
            return self.lines(name)
        except Unreadable:
            return None




@dataclass
class WaveRecord:
    """What a wave stored, read once: the plan and the timeline (its spine), the receipts, the services' and the
    proxy's logs (None: missing or unreadable), the sweeps' and the store audit's reports."""

    d: Path
    inp: Inputs
    plan: dict
    timeline: list[dict]
    receipts: list[dict]
    calls: list[dict] | None
    effects: list[dict] | None
    proxy: list[dict] | None
    sweep: dict | None
    audit: dict | None
    sweeper: dict | None
    fenced: list[dict]
    host_load: list[dict]
    hfault: dict | None
    # per-task views of the logs, each built once on first use (grading 4,000 tasks by scanning every log for each
    # task took 190 s; issue 45)
    _by_task: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def out(self) -> results.ResultsDir:
        return results.ResultsDir(self.d)

    def of_task(self, name: str, tid: str) -> list[dict] | None:
        """The records of log `name` ("timeline", "calls", "effects", "fenced") whose `task` is `tid`, in the log's
        order; None when the log itself is missing (calls, effects)."""
        recs = getattr(self, name)
        if recs is None:
            return None
        index = self._by_task.get(name)
        if index is None:
            index = self._by_task[name] = {}
            for r in recs:
                t = r.get("task")
                if isinstance(t, str):
                    index.setdefault(t, []).append(r)
        return list(index.get(tid, ()))

    def runner_logs(self, tid: str) -> list[Path]:
        """Every attempt's runner log of a task, in attempt order (the sandboxes folder listed once)."""
        index = self._by_task.get("runner_logs")
        if index is None:
            index = self._by_task["runner_logs"] = self.out.runner_logs_by_task()
        return list(index.get(tid, ()))


def _json_or_none(inp: Inputs, name: str, default=...):
    try:
        return inp.json(name) if default is ... else inp.json(name, default)
    except Unreadable:
        return None


PLAN_KEYS = ("wave_id", "config", "tasks")
TASK_KEYS = ("task_id", "seed", "runner", "steps", "faults")


def _check_plan(inp: Inputs, plan) -> None:
    """The plan has the shape the grader reads (a damaged or hand-edited one is unreadable, naming what is wrong)."""
    def bad(why: str):
        inp.unreadable[results.PLAN] = why
        return Unreadable(f"{results.PLAN}: {why}")

    if not isinstance(plan, dict):
        raise bad(f"not a wave plan: a JSON {type(plan).__name__}, not an object")
    missing = [k for k in PLAN_KEYS if k not in plan]
    if missing:
        raise bad(f"not a wave plan: no {', '.join(missing)}")
    for where in ("tasks", "references"):
        for i, task in enumerate(plan.get(where) or []):
            if not isinstance(task, dict):
                raise bad(f"{where}[{i}] is a JSON {type(task).__name__}, not a task")
            lacks = [k for k in TASK_KEYS if k not in task]
            if lacks:
                raise bad(f"{where}[{i}] ({task.get('task_id', '?')}) has no {', '.join(lacks)}")


def _check_wave_id(inp: Inputs, plan: dict, timeline: list[dict]) -> None:
    """The plan's wave id is the one the wave ran as (its timeline's `wave_start`): every store key and prefix is
    judged against it, so a plan that names another wave would blame each runner for writes outside its prefix."""
    start = next((e for e in timeline if e["event"] == "wave_start"), None)
    ran_as = start.get("wave") if start is not None else None
    if isinstance(ran_as, str) and plan["wave_id"] != ran_as:
        why = (f"field `wave_id` is {results.terminal_safe(str(plan['wave_id'])[:80])!r}, but the wave ran as "
               f"{results.terminal_safe(ran_as[:80])!r} ({results.TIMELINE}'s wave_start): the plan was changed")
        inp.unreadable[results.PLAN] = why
        raise Unreadable(f"{results.PLAN}: {why}")


def read_wave(d: Path) -> WaveRecord:
    inp = Inputs(d)
    plan = inp.json(results.PLAN)  # the plan and the timeline are the spine: unreadable = no grade (Unreadable)
    if plan is None:
        raise FileNotFoundError(f"{d / results.PLAN} not found: not a wave results directory")
    _check_plan(inp, plan)
    timeline = inp.lines(results.TIMELINE) or []
    _check_wave_id(inp, plan, timeline)
    try:  # a receipt of another shape, or for no planned fault, is left out and named; one that cannot be true is
        # unknown; a file that is no list of receipts is unreadable
        receipts, left = receipts_of(inp.json(results.FAULTS, []))
        receipts, unplanned = checked_receipts(receipts, plan, timeline)
        left = left + unplanned
        if left:
            inp.skipped[results.FAULTS], inp.skipped_count[results.FAULTS] = left[:20], len(left)
    except Unreadable:
        receipts = []  # every planned fault then has no receipt: unknown, the file named
    except ValueError as exc:
        inp.unreadable[results.FAULTS] = str(exc)
        receipts = []
    calls = inp.lines_or_none(results.MODEL_CALLS)
    effects = inp.lines_or_none(results.EFFECTS)
    # the driver records how many calls and effects each service logged: a log that lost lines is unreadable
    counts = next((e for e in reversed(timeline) if e["event"] == "service_counts"), None)
    for name, recs, key in ((results.MODEL_CALLS, calls, "model"), (results.EFFECTS, effects, "effects")):
        if counts is None or recs is None:
            continue
        got: dict = {}
        for r in recs:
            got[r["task"]] = got.get(r["task"], 0) + 1
        if got != (counts.get(key) or {}):
            inp.unreadable[name] = "its lines do not add up to the counts the driver recorded (lines lost)"
            if key == "model":
                calls = None
            else:
                effects = None
    proxy = inp.lines_or_none(results.PROXY_REQUESTS)
    sweep, audit = _json_or_none(inp, results.SANDBOX_SWEEP), _json_or_none(inp, results.STORE_AUDIT)
    if audit is not None and (not isinstance(audit, dict) or audit.get("error") is not None):
        # an audit that failed (named: the call, bucket, prefix, error) or a report of another shape: unknown
        inp.unreadable[results.STORE_AUDIT] = (f"the audit failed: {str(audit.get('failed') or audit['error'])[:600]}"
                                               if isinstance(audit, dict) else
                                               f"a JSON {type(audit).__name__}, not the audit's report")
        audit = None
    sweeper = _json_or_none(inp, results.SWEEPER, None)  # the sweep actor's report (none: a wave before it existed)
    reports = {results.SANDBOX_SWEEP: sweep, results.STORE_AUDIT: audit, results.SWEEPER: sweeper}
    for name, rep in reports.items():  # a report of another shape (a field's type, one missing): unreadable, named
        why = None if rep is None else results.report_misfit(name, rep)
        if why is not None:
            inp.unreadable[name] = why
            reports[name] = None
    sweep, audit, sweeper = reports[results.SANDBOX_SWEEP], reports[results.STORE_AUDIT], reports[results.SWEEPER]
    hfault = next((e for e in timeline if e["event"] == "harness_fault"), None)
    return WaveRecord(d, inp, plan, timeline, receipts, calls, effects, proxy, sweep, audit, sweeper,
                      inp.lines_or_none(results.FENCED) or [], inp.lines_or_none(results.HOST_LOAD) or [], hfault)

