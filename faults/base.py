"""The fault protocol, the shared envelope (`FaultSpec`), receipts, and the catalog.

A fault kind is one small class with `plan` (seeded choice of its parameters),
`inject` (change the world), `settle` (wait until its effect is over), `clear` (heal it; always run before grading) and
`receipt` (did it apply, and to what). Shared fields live in the envelope; the
probability draw happens once, in the injector, never in a fault.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

APPLIED, NOT_APPLIED, UNKNOWN = "applied", "not_applied", "unknown"


@dataclass
class FaultSpec:
    """The envelope every planned fault shares."""

    fault_id: str
    instance: str
    task_id: str
    trigger: str
    at_s: float
    window_s: float | None = None
    probability: float = 1.0
    seed: int = 0
    params: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Receipt:
    fault_id: str
    instance: str
    task_id: str
    status: str
    target: dict = field(default_factory=dict)
    detail: str = ""
    fired_at: float | None = None
    cleared_at: float | None = None
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class FaultContext(Protocol):
    """What the wave driver lets a fault touch."""

    bucket: str

    def task_prefix(self, task_id: str) -> str: ...

    async def current_sandbox(self, task_id: str) -> tuple[Any, str] | None: ...

    async def armed_outcome(self, task_id: str, instance: str) -> dict:
        """Until a watch the fault armed with the task's attempts (`Fault.attempt_arm`) fired on one of them;
        returns what the host reported (cancelled with the task when none fired)."""

    async def wait_model_answers(self, task_id: str, n: int) -> bool:
        """Until the task's Nth model answer was delivered (True), or the task ended (False)."""

    async def wait_effects(self, task_id: str, n: int) -> bool:
        """Until the task's Nth external effect was answered (True), or the task ended (False)."""

    def proxy(self) -> Any: ...

    async def rotate_credentials(self, task_id: str, delay_s: float) -> dict:
        """CR1: rotate the current attempt's key at the store; publish the new key `delay_s` later."""

    def store_requests(self, akids: set, t0: float, t1: float) -> list[dict]:
        """The proxy's log lines of requests signed by these key ids between t0 and t1."""

    async def runner_started(self, task_id: str) -> None:
        """Until the task's current attempt has its runner running (a clock-timed fault counts from there)."""

    async def node_of(self, task_id: str) -> str | None:
        """The node the task's running attempt is on (None when none runs)."""

    async def lose_node(self, node: str, mode: str, grace_s: float, down_s: float, instance: str,
                        task_id: str) -> dict:
        """PK3: the node goes away with every sandbox on it ('drain': after a notice), back `down_s` later."""

    async def node_back(self, node: str) -> dict:
        """Until a lost node is back (bounded); what its return was."""

    async def partition(self, node: str, cut_s: float, instance: str, task_id: str, fencing: bool) -> dict:
        """NP1: the node's link to the head down for `cut_s` (its attempts given up, fenced unless `fencing` is
        off), then healed; what was cut, when, and whether the node answered again."""

    async def degrade_link(self, node: str, window_s: float, instance: str, **knobs) -> dict:
        """NP2: the node's link degraded (loss_pct, rate_kbit, delay_ms, jitter_ms) for `window_s`, then restored."""

    async def abandon(self, task_id: str, sandbox_id: str, instance: str) -> None:
        """PK6: give up on the frozen attempt (its keys die now, its lease runs out); the next one starts."""

    async def newer_attempt(self, task_id: str, sandbox_id: str, timeout_s: float) -> str | None:
        """The sandbox id of the task's next attempt once it runs (None after `timeout_s`, or once the task ends
        or the wave stops)."""

    def no_newer_why(self, task_id: str, timeout_s: float) -> str:
        """Why `newer_attempt` gave None: the wave stopped, the task ended, or `timeout_s` went by."""

    def fenced_activity(self, task_id: str, sandbox_id: str, since: float) -> dict:
        """What a zombie attempt did from `since`: its store requests and the calls refused as fenced."""


class Fault(Protocol):
    id: str
    family: str
    description: str

    def plan(self, task_id: str, rng: random.Random, base: dict) -> FaultSpec: ...

    async def inject(self, spec: FaultSpec, ctx: FaultContext) -> dict: ...

    async def settle(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> None:
        """Return when the fault's effect is over (at once for a kill, after the window for an outage)."""

    async def clear(self, spec: FaultSpec, ctx: FaultContext, injected: dict) -> dict: ...

    def receipt(self, spec: FaultSpec, injected: dict, cleared: dict) -> Receipt: ...

    def attempt_arm(self, spec: FaultSpec) -> dict | None:
        """A watch the sandbox host starts with each of the task's attempts, in the same call that starts the
        attempt (so no attempt, however short, can end before it is watched), or None. The driver carries the
        watch over to the next attempt (with what this one consumed) until it fires."""


# What an interruption that ends an attempt leaves of the task's disk (its workspace and HOME): `sandbox.disk` for a
# wave, `fault_timing.<id>.disk` for one fault; each fault lists the modes it accepts in its `disk_modes`
DISK_MODES = {
    "wipe": "the next attempt starts on a fresh disk with the task's repo (a new machine: spot reclaim, eviction)",
    "keep": "the next attempt starts on the same disk, on the same node, as the killed attempt left it, synced or "
            "not (a restarted container, a rebooted VM)",
    "move": "PK3: the next attempt starts on another node with the disk as the lost node left it, carried through "
            "Ray (a network disk re-attached after a node loss)",
    "lose-unsynced": "a power loss: file data stays up to its last fsync/fdatasync, a create/rename/unlink once its "
                     "directory was fsynced (the lazy file system, FUSE)",
    "torn": "as lose-unsynced, and the write in flight keeps a seeded prefix of its bytes (FUSE)",
}
# PK1's boundaries on the runner's own disk (fault_timing.PK1, and --enumerate-boundaries), counted by the lazy file
# system that serves a kept volume (a crash mode, or keep with a disk boundary planned) over the volume's life
DISK_BOUNDARIES = {
    "after_disk_writes": "kill while the runner's Nth write to its disk is held in flight (a torn journal append)",
    "after_disk_fsyncs": "kill right before its Nth fsync returns (the data already persisted)",
    "after_disk_renames": "kill right after its Nth rename was applied (before its directory's fsync)",
}


def disk_mode_rows() -> list[str]:
    """One markdown row per fault that ends attempts, `| PK1 | wipe, keep, ... |`: the table README and
    docs/runner-contract.md carry (a unit test holds them to the catalog)."""
    return [f"| {fid} | {', '.join(f.disk_modes)} |" for fid, f in sorted(CATALOG.items())
            if getattr(f, "disk_modes", ())]


CATALOG: dict[str, Fault] = {}


def register(fault_cls):
    fault = fault_cls()
    CATALOG[fault.id] = fault
    return fault_cls


def unknown_fault_message(fid: str) -> str:
    return f"unknown fault id {fid!r}; valid fault ids: {', '.join(sorted(CATALOG))}"


def timed_spec(fault_id: str, task_id: str, rng, at: tuple, window: tuple, params: dict) -> FaultSpec:
    """A fault armed at a seeded time after launch with a seeded window: the draws (time, window, seed) in one
    order for every such fault, so equal seeds plan equal faults."""
    return FaultSpec(fault_id=fault_id, instance=f"{task_id}-{fault_id}", task_id=task_id, trigger="time",
                     at_s=round(rng.uniform(*at), 3), window_s=round(rng.uniform(*window), 3),
                     seed=rng.randrange(2**31), params=params)


def armed_spec(fault_id: str, task_id: str, rng, base: dict, at: tuple, window: tuple, params: dict) -> FaultSpec:
    """`timed_spec`, or, with `after_model_calls: [lo, hi]` in the fault's timing, armed right after the task's
    seeded Nth model answer (a boundary of the runner: load cannot move where in its run the fault lands). The
    boundary adds one draw after timed_spec's, so plans without it are unchanged."""
    return arm_at_model_answer(timed_spec(fault_id, task_id, rng, at, window, params), rng, base)


def arm_at_model_answer(spec: FaultSpec, rng, base: dict) -> FaultSpec:
    """With `after_model_calls: [lo, hi]` in the timing: the clock-timed `spec` becomes armed right after the task's
    seeded Nth model answer (one draw after the spec's own)."""
    if "after_model_calls" in base:
        lo, hi = base["after_model_calls"]
        spec.trigger, spec.at_s = "model_call", 0.0
        spec.params["after"] = rng.randint(int(lo), int(hi))
    return spec


async def wait_armed(spec: FaultSpec, ctx: FaultContext) -> dict | None:
    """For a fault armed at a model-answer boundary: wait for it. None once it came (or the fault is timed);
    else the `not_applied` injection result: the task ended first."""
    if spec.trigger != "model_call":
        return None
    n = spec.params["after"]
    if await ctx.wait_model_answers(spec.task_id, n):
        return None
    return {"applied": False, "why": f"the task ended before its model answer #{n} was delivered"}
