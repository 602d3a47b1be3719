"""The plan of a wave: every task, its seed and faults, and the reference run (the uninterrupted positive control)
of each seed; a replay's plan (one task of an earlier wave), and a boundary-enumerated wave's tasks."""
from __future__ import annotations

import secrets
import time
from datetime import datetime, timezone

import orjson

from cluster.artifacts import ReferenceCache, reference_key
from cluster.config import WaveConfig
from cluster.wave.errors import HarnessError
from faults.base import FaultSpec
from faults.planner import derive, plan_faults, task_seed
from fleet.records import Plan, PlannedTask


def new_wave_id(seed: int) -> str:
    ts = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"w-{ts}-s{seed}-{secrets.token_hex(2)}"


REF = "ref-"


def build_plan(cfg: WaveConfig, wave_id: str, cache: ReferenceCache | None = None) -> dict:
    """Every task, its seed and faults, and the reference run (positive control) of each seed.

    A reference is an uninterrupted, fault-free run of the same runner on the same seed; one found
    in the cache (same runner code, workload and seed) is reused instead of run again. A task with no fault
    planned is its own (`reference.self`): none runs beside it.
    """
    runner = cfg.runner_spec()
    if cfg.enumerate_boundaries:  # phase 1 runs the reference alone; its boundaries plan the tasks
        seed = task_seed(cfg.seed, 0)
        key = reference_key(runner, cfg.workload.name, cfg.workload.steps, seed)
        base = {"seed": seed, "runner": runner["name"], "workload": cfg.workload.name, "steps": cfg.workload.steps}
        ref = PlannedTask(REF + "t000", "reference", reference_of="t000", **base,
                          reference={"task_id": REF + "t000", "key": key, "cached": False})
        return Plan(wave_id, cfg.seed, time.time(), cfg.public_dump(), runner, references=(ref,),
                    extra={"enumerate": {"pending": True}}).to_dict()
    task_ids = [f"t{i:03d}" for i in range(cfg.tasks)]
    faults = plan_faults(cfg.seed, task_ids, cfg.faults, cfg.fault_params())
    tasks, refs = [], []
    for i, tid in enumerate(task_ids):
        seed = task_seed(cfg.seed, i)
        key = reference_key(runner, cfg.workload.name, cfg.workload.steps, seed)
        cached = cache.get(key) is not None if cache is not None else False
        base = {"seed": seed, "runner": runner["name"], "workload": cfg.workload.name, "steps": cfg.workload.steps}
        # with `fault_free_reference: self`, a task with no fault planned is itself an uninterrupted run of its seed:
        # no reference runs beside it (cluster/grade/selfref.py; one that turns out interrupted gets its reference
        # after the tasks). By default it gets one, which also catches a runner that is not deterministic.
        own = cfg.fault_free_reference == "self" and not cached and not faults[tid]
        tasks.append(PlannedTask(tid, "task", **base, faults=tuple(f.to_dict() for f in faults[tid]),
                                 reference={"task_id": REF + tid, "key": key, "cached": cached,
                                            **({"self": True} if own else {})}))
        if not cached and not own:
            refs.append(PlannedTask(REF + tid, "reference", reference_of=tid, **base,
                                    reference={"task_id": REF + tid, "key": key, "cached": False}))
    return Plan(wave_id, cfg.seed, time.time(), cfg.public_dump(), runner, tuple(tasks), tuple(refs),
                extra={"placement": placement(cfg)}).to_dict()


def placement(cfg: WaveConfig) -> dict:
    """Where attempts run, as the plan shows it to the user."""
    if cfg.address == "fleet":
        return {"policy": "one node: the fleet of `sandfleet up` (its sandbox host runs every attempt)",
                "sandbox_nodes": ["node-0"], "head": "node-0 (the fleet's actors and store; this driver's proxy, "
                                                     "model and effects)"}
    if cfg.address != "local":
        return {"policy": "least-loaded over the cluster's sandbox nodes, found when the fleet starts: the alive "
                          "nodes offering a `sandfleet` resource, else every alive node but the driver's; a one-node "
                          "cluster runs them on its only node (nodes.json lists what was found)",
                "sandbox_nodes": "discovered", "head": "the driver's node (ledger, store, proxy, model, effects)"}
    if cfg.nodes == 1:
        return {"policy": "one node", "sandbox_nodes": ["node-0"],
                "head": "node-0 (the harness and every sandbox)"}
    return {"policy": "least-loaded: each attempt goes to the live sandbox node with the fewest attempts running "
                      "(ties: the lowest number); a draining or lost node gets none; a task's next attempt may land "
                      "on another node",
            "sandbox_nodes": [f"node-{i}" for i in range(1, cfg.nodes)],
            "head": "node-0 (driver, lease ledger, store, fault proxy, model endpoint, effects service; no sandboxes)"}


def replay_plan(original: dict, task_id: str, wave_id: str, cache: ReferenceCache | None = None) -> dict:
    """A wave of one task of `original`: the same seed, the same faults at the same times, boundaries or
    windows, and its reference (from the cache when it is there)."""
    task = next((t for t in original["tasks"] if t["task_id"] == task_id), None)
    if task is None:
        raise HarnessError(f"wave {original['wave_id']} has no task {task_id!r}; its tasks: "
                           f"{', '.join(t['task_id'] for t in original['tasks'][:20])}")
    task = PlannedTask.of(orjson.loads(orjson.dumps(task)))
    ref = dict(task.reference, cached=cache is not None and cache.get(task.reference["key"]) is not None)
    ref.pop("self", None)  # (a replay runs its reference beside it, as every wave of one task did)
    task = PlannedTask.of({**task.to_dict(), "reference": ref})
    refs = () if ref["cached"] else (PlannedTask(ref["task_id"], "reference", task.seed, task.runner, task.workload,
                                                 task.steps, reference_of=task_id, reference=dict(ref)),)
    return Plan(wave_id, original["seed"], time.time(), original["config"],
                original["runner"], (task,), refs,
                extra={"replay_of": {"wave_id": original["wave_id"], "task_id": task_id}}).to_dict()


DISK_KINDS = ("disk_write", "disk_fsync", "disk_rename")  # counted on a lazy volume (fleet/lazyfs/)


def boundary_counts(ref: str, prefix: str, proxy_rows, model_calls: list, effects: list, disk_ops: dict | None) -> dict:
    """An enumerated wave's phase 2: how many of each boundary the uninterrupted run `ref` crossed, from what the
    harness logged (its store writes answered 2xx under its prefix, its delivered model answers, its effects, and on
    a lazy volume its own disk writes, fsyncs and renames)."""
    writes = sum(1 for r in proxy_rows if (r.get("key") or "").startswith(prefix)
                 and r.get("method") in ("PUT", "POST", "DELETE") and 200 <= (r.get("status") or 0) < 300)
    counts = {"model_call": sum(1 for c in model_calls if c["task"] == ref and c.get("delivered")),
              "effect": sum(1 for e in effects if e["task"] == ref), "store_write": writes}
    if disk_ops is not None:
        counts.update({f"disk_{op}": int(disk_ops.get(op, 0)) for op in ("write", "fsync", "rename")})
    return counts


def enumerate_tasks(plan: dict, counts: dict, limit: int | None) -> list[dict]:
    """One PK1 task per boundary of the uninterrupted reference run (and per variant of a store write), all on
    the reference's seed; a seeded sample of `limit` when there are more. The runner's own disk boundaries (its
    writes, fsyncs and renames on a kept volume) outnumber the rest many times: a sample gives them half (rounded
    up) and takes one of each disk kind first, so a small sample still kills mid-write, mid-fsync and at a rename."""
    ref = plan["references"][0]
    points = [("model_call", n, None) for n in range(1, counts["model_call"] + 1)]
    points += [("effect", n, None) for n in range(1, counts["effect"] + 1)]
    points += [("store_write", n, v) for n in range(1, counts["store_write"] + 1) for v in ("ambiguous", "after")]
    disk = [(k, n, None) for k in DISK_KINDS for n in range(1, counts.get(k, 0) + 1)]
    if limit is not None and len(points) + len(disk) > limit:
        rng = derive(plan["seed"], "boundaries")
        share = min(len(disk), max(limit - len(points), (limit + 1) // 2))
        take = min(len(points), limit - share)
        keep = set(rng.sample(range(len(points)), take))  # (no disk boundaries: the sample it always was)
        points = [p for i, p in enumerate(points) if i in keep]
        firsts = [rng.choice([p for p in disk if p[0] == k]) for k in DISK_KINDS if counts.get(k)][:share]
        rest = [p for p in disk if p not in firsts]
        chosen = set(firsts) | set(rng.sample(rest, share - len(firsts)))
        disk = [p for p in disk if p in chosen]
    points += disk
    tasks = []
    for i, (kind, n, variant) in enumerate(points):
        tid = f"t{i:03d}"
        params = {"after": n, "variant": variant or "after"}
        spec = FaultSpec(fault_id="PK1", instance=f"{tid}-PK1", task_id=tid, trigger=kind, at_s=0.0,
                         seed=derive(plan["seed"], tid, "PK1").randrange(2**31), params=params)
        tasks.append(PlannedTask(tid, "task", ref["seed"], ref["runner"], ref["workload"], ref["steps"],
                                 faults=(spec.to_dict(),), boundary={"kind": kind, "n": n, "variant": variant},
                                 reference={"task_id": ref["task_id"], "key": ref["reference"]["key"],
                                            "cached": False}).to_dict())
    return tasks
