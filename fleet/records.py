"""The typed records that cross the seams of a wave: the plan and its tasks (driver -> attempts, `plan.json`), a
lease (ledger -> driver -> host), an attempt's result (host -> driver), what a fault's injection did (fault ->
injector -> receipt) and a harness fault (health -> attempts, teardown, timeline).

Each is a frozen dataclass whose `to_dict()` gives back the exact keys the stored files have always had, so
`plan.json`, `timeline.jsonl`, `faults.json` and the grades keep their shape, and `of(d)` reads one back. They live
in `fleet/` because the ledger and the hosts make two of them and nothing below `cluster/` may import it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

def _known(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class Lease:
    """A row of the lease ledger: the task's `fence` (it only grows) and the row's `version` (every write takes the
    expected one)."""

    task_id: str
    fence: int
    attempt: int
    sandbox_id: str
    holder: str
    state: str
    version: int
    acquired_at: float
    expires_at: float
    ended_at: float | None = None
    outcome: str | None = None

    @classmethod
    def of(cls, row: dict | None) -> Lease | None:
        return None if row is None else cls(**row)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in _known(Lease)}


@dataclass(frozen=True)
class AttemptResult:
    """How an attempt ended, as its host (or the driver, when the host could not say) reports it. Only the fields a
    path set are in `to_dict()`: a start error has no timings, a lost host has only `error` and `host_lost`."""

    sandbox_id: str | None = None
    exit_code: int | None = None
    node: str | None = None
    task_id: str | None = None
    attempt: int | None = None
    state: str | None = None
    pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    start_ms: float | None = None
    killed_by: str | None = None
    cause: str | None = None
    events: dict | None = None
    history: list | None = None
    outlived: list | None = None
    harness_part: str | None = None
    disk: dict | None = None  # a crash mode's receipt: what dropping or tearing the kept volume did before it started
    disk_ops: dict | None = None  # a lazy volume's boundaries at the attempt's end: {write, fsync, rename} so far
    error: str | None = None  # the host could not run it ("wave cancelled", "sandbox host lost: ...")
    start_error: str | None = None  # the sandbox could not start (the runner's command, the engine)
    host_lost: bool = False
    abandoned: dict | None = None  # PK6 gave up on it: it runs on as a zombie
    artifact: dict | None = None  # the workspace read back after an exit 0
    watches: dict | None = None  # what each armed watch saw, by its reason
    log: bytes | None = None  # a remote attempt's runner log (capped as the host caps it), shipped to the driver
    _keys: tuple = field(default=(), repr=False, compare=False)  # the keys it was given, in their order

    @classmethod
    def of(cls, d: dict) -> AttemptResult:
        known = set(_known(cls)) - {"_keys"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"an attempt's result has unknown fields {unknown}; known: {sorted(known)}")
        return cls(**d, _keys=tuple(d))

    def to_dict(self) -> dict:
        keys = self._keys or tuple(k for k in _known(AttemptResult) if k != "_keys"
                                   and getattr(self, k) not in (None, False))
        return {k: getattr(self, k) for k in keys}

    def but(self, **changes) -> AttemptResult:
        """A copy with `changes` (a new key keeps its place after the ones it was given)."""
        keys = self._keys + tuple(k for k in changes if k not in self._keys) if self._keys else ()
        return replace(self, **changes, _keys=keys)


@dataclass(frozen=True)
class Injected:
    """What a fault's `inject` did: whether it applied and why not, an `error` when the injection crashed (the
    receipt is then `unknown`), and the fault's own facts (its target, its timings), which only that fault's
    `settle`, `clear` and `receipt` read (they get `to_dict()`: the dict the fault returned, `error` added)."""

    applied: bool = False
    why: str = ""
    error: str | None = None
    facts: dict = field(default_factory=dict)
    _keys: tuple = field(default=("applied", "why"), repr=False, compare=False)

    @classmethod
    def of(cls, d: dict | None) -> Injected:
        d = dict(d or {})
        if not isinstance(d.get("why") or "", str):
            raise ValueError(f"a fault's injection said why as {type(d['why']).__name__}, not text: {d['why']!r}")
        return cls(applied=bool(d.get("applied")), why=d.get("why") or "", error=d.get("error"),
                   facts={k: v for k, v in d.items() if k not in ("applied", "why", "error")}, _keys=tuple(d))

    def crashed(self, error: str) -> Injected:
        return replace(self, error=error, _keys=self._keys + (() if "error" in self._keys else ("error",)))

    def to_dict(self) -> dict:
        own = {"applied": self.applied, "why": self.why, "error": self.error}
        return {k: own[k] if k in own else self.facts[k] for k in self._keys if k in own or k in self.facts} | {
            k: v for k, v in self.facts.items() if k not in self._keys}


@dataclass(frozen=True)
class HarnessFault:
    """A part of the harness died or stopped answering: which, why, since when its last good probe, what to do."""

    part: str
    why: str
    since_wall: float
    hint: str

    @classmethod
    def of(cls, d: dict | None) -> HarnessFault | None:
        return None if d is None else cls(d["part"], d["why"], d["since_wall"], d.get("hint", ""))

    def to_dict(self) -> dict:
        return {"part": self.part, "why": self.why, "since_wall": self.since_wall, "hint": self.hint}

    def text(self) -> str:
        return f"harness fault: {self.part}: {self.why}. {self.hint}"


@dataclass(frozen=True)
class PlannedTask:
    """One task of the plan (or a reference run: `role` "reference", `reference_of` its task), with its seed, its
    faults (`FaultSpec` dicts) and its reference's cache key; `boundary` for a boundary-enumerated task."""

    task_id: str
    role: str
    seed: int
    runner: str
    workload: str
    steps: int
    faults: tuple = ()
    reference: dict = field(default_factory=dict)
    reference_of: str | None = None
    boundary: dict | None = None

    @classmethod
    def of(cls, d: dict) -> PlannedTask:
        return cls(**{**d, "faults": tuple(d.get("faults") or ())})

    def to_dict(self) -> dict:
        out = {"task_id": self.task_id, "role": self.role}
        if self.reference_of is not None:
            out["reference_of"] = self.reference_of
        out.update(seed=self.seed, runner=self.runner, workload=self.workload, steps=self.steps,
                   faults=[dict(f) for f in self.faults])
        if self.boundary is not None:
            out["boundary"] = dict(self.boundary)
        out["reference"] = dict(self.reference)
        return out


@dataclass(frozen=True)
class Plan:
    """A wave's plan, as `plan.json` holds it: its tasks and references, the config and runner it ran with, and what
    kind of wave it is (`enumerate` pending, `replay_of`, `placement`); `manifest`, what it ran on."""

    wave_id: str
    seed: int
    created_at: float
    config: dict
    runner: dict
    tasks: tuple[PlannedTask, ...] = ()
    references: tuple[PlannedTask, ...] = ()
    extra: dict = field(default_factory=dict)  # enumerate, placement, replay_of, manifest: as they were added

    HEAD = ("wave_id", "seed", "created_at", "config", "runner")

    @classmethod
    def of(cls, d: dict) -> Plan:
        rest = {k: v for k, v in d.items() if k not in (*cls.HEAD, "tasks", "references")}
        return cls(**{k: d[k] for k in cls.HEAD}, tasks=tuple(PlannedTask.of(t) for t in d.get("tasks", ())),
                   references=tuple(PlannedTask.of(t) for t in d.get("references", ())), extra=rest)

    def to_dict(self) -> dict:
        """`plan.json`'s keys in their order: the head, the tasks, (an enumerated wave's `enumerate`), the
        references, then the rest as they were added (placement, replay_of, manifest)."""
        out = {k: getattr(self, k) for k in self.HEAD}
        out["tasks"] = [t.to_dict() for t in self.tasks]
        if "enumerate" in self.extra:
            out["enumerate"] = self.extra["enumerate"]
        out["references"] = [t.to_dict() for t in self.references]
        return out | {k: v for k, v in self.extra.items() if k != "enumerate"}
