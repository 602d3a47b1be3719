"""The seeded planner: which task gets which fault, and when.

One `random.Random` is derived per wave, per task and per fault from the wave
seed, so two plans of the same seed and config are equal (a test proves it).
Faults are dealt round-robin over the tasks after a seeded shuffle, so every
selected fault kind is exercised once there are as many tasks as kinds. An item `A+B` puts both on one
task (`ST1+PK1`: the kill lands inside the outage, while the runner retries).
"""
from __future__ import annotations

import hashlib
import random

from faults.base import CATALOG, FaultSpec


def derive(seed: int, *salt) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256(repr((seed,) + salt).encode()).digest()[:8], "big"))


def drawn(spec: FaultSpec) -> bool:
    """The fault's one probability draw (seeded by its spec): False when it is not to be injected."""
    return spec.probability >= 1.0 or derive(spec.seed, "draw").random() < spec.probability


def task_seed(wave_seed: int, index: int) -> int:
    return derive(wave_seed, "task-seed", index).randrange(2**31)


def plan_faults(wave_seed: int, task_ids: list[str], fault_ids: list[str],
                params: dict[str, dict] | None = None) -> dict[str, list[FaultSpec]]:
    params = params or {}
    out: dict[str, list[FaultSpec]] = {t: [] for t in task_ids}
    if not fault_ids:
        return out
    order = list(fault_ids)
    derive(wave_seed, "deal").shuffle(order)
    for i, task_id in enumerate(task_ids):
        combo = order[i % len(order)].split("+")  # "ST1+PK1": both on this task, the kill during the outage
        for fid in combo:
            rng = derive(wave_seed, task_id, fid)
            base = dict(params.get(fid, {}))
            if fid == "PK1" and "ST1" in combo:
                base = {"during": f"{task_id}-ST1"}
            spec = CATALOG[fid].plan(task_id, rng, base)
            out[task_id].extend(spec if isinstance(spec, list) else [spec])  # K kills in one task: K specs
    return out
