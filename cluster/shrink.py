"""`sandfleet shrink results/<wave>/<task>`: the smallest fault plan that still fails the same way.

The task is replayed (same seed, same runner) first as it was, to see that its failure reproduces, then with plans
one step smaller than the smallest failing one so far, in a fixed order: a fault fewer; a boundary kill earlier
(`after` halved); a time trigger earlier (`at_s` halved); a window shorter (`window_s` halved); one kill fewer
(PK4); fewer steps (halved, the reference run again for them). A smaller plan is kept when its task fails with the
same failure signature; the search ends when no step smaller fails so, or at the budget of runs. Deterministic:
every run is a replay of a fixed plan, and the candidates come in a fixed order.

Every run is an ordinary wave under the same results root (`sandfleet grade` and `wave replay` work on each);
`<wave>/shrink-<task>.json` records every step tried with its verdict and signature.
"""
from __future__ import annotations

import copy
import time
from pathlib import Path

import orjson

MIN_STEPS = 3  # fewer steps than this leave a kill nothing to land between


def size(task: dict) -> tuple:
    """How big a task's plan is (smaller sorts first): faults, kills, boundaries, windows, times, steps."""
    fs = task.get("faults") or []  # of the shape cluster/planfile.py checks
    return (len(fs), sum(int((f.get("params") or {}).get("kills", 1)) for f in fs),
            sum(int((f.get("params") or {}).get("after", 0) or 0) for f in fs),
            round(sum(float(f.get("window_s") or 0) for f in fs), 3),
            round(sum(float(f.get("at_s") or 0) for f in fs if f.get("trigger") == "time"), 3), task.get("steps", 0))


def candidates(task: dict, runner: dict) -> list[tuple[str, dict]]:
    """Plans one step smaller than `task`, in the order they are tried."""
    out: list[tuple[str, dict]] = []
    faults = task.get("faults") or []

    def with_fault(i: int, **change) -> dict:
        t = copy.deepcopy(task)
        params = change.pop("params", None)
        t["faults"][i].update(change)
        if params:
            t["faults"][i].setdefault("params", {}).update(params)
        return t

    if len(faults) > 1:
        for i, f in enumerate(faults):
            t = copy.deepcopy(task)
            del t["faults"][i]
            out.append((f"without {f['instance']} ({f['fault_id']})", t))
    for i, f in enumerate(faults):
        p = f.get("params") or {}
        after = p.get("after")
        if f.get("trigger") != "time" and isinstance(after, int) and after > 1:
            out.append((f"{f['instance']}: after {f['trigger']} {after // 2} instead of {after}",
                        with_fault(i, params={"after": after // 2})))
        if f.get("trigger") == "time" and float(f.get("at_s") or 0) > 0.2:
            at = round(float(f["at_s"]) / 2, 3)
            out.append((f"{f['instance']}: at {at} s instead of {f['at_s']} s", with_fault(i, at_s=at)))
        if f.get("window_s") and float(f["window_s"]) > 0.2:
            w = round(float(f["window_s"]) / 2, 3)
            out.append((f"{f['instance']}: a {w} s window instead of {f['window_s']} s", with_fault(i, window_s=w)))
        if isinstance(p.get("kills"), int) and p["kills"] > 1:
            out.append((f"{f['instance']}: {p['kills'] - 1} kills instead of {p['kills']}",
                        with_fault(i, params={"kills": p["kills"] - 1})))
    steps = int(task.get("steps") or 0)
    if steps // 2 >= MIN_STEPS:
        from cluster.artifacts import reference_key

        t = copy.deepcopy(task)
        t["steps"] = steps // 2
        t["reference"] = dict(t["reference"], key=reference_key(runner, t["workload"], t["steps"], t["seed"]),
                              cached=False)
        out.append((f"{t['steps']} steps instead of {steps}", t))
    return out


def code_changed(plan: dict) -> list[str]:
    """What of the runner's or the workload's code differs from when the wave ran (empty: the same)."""
    from cluster import manifest
    from cluster.artifacts import reference_key

    m = plan.get("manifest")
    if not m:
        return ["the wave has no manifest (made before manifests): its runner's code cannot be compared"]
    out = []

    def then(part: str):  # a field of the manifest as stored; any other shape reads as absent (and so differs)
        x = m.get(part) if isinstance(m, dict) else None
        return x.get("code_digest") if isinstance(x, dict) else None

    now = reference_key(plan["runner"], "", 0, 0)
    if then("runner") != now:
        out.append(f"runner.code_digest: {then('runner')!r} != {now!r} (the runner's code or command changed)")
    wl = manifest._workload_digest()
    if then("workload") != wl:
        out.append(f"workload.code_digest: {then('workload')!r} != {wl!r}")
    return out


def manifest_drift(plan: dict, cfg) -> list[str]:
    """What else of the manifest differs from what this machine would run now (the kernel, a limit, the harness's
    revision, Ray's or SeaweedFS's version, the runner's packages), one `field: then != now` each; the code digests
    are `code_changed`'s, the seed is not in a manifest."""
    from cluster import manifest
    from cluster.artifacts import reference_key

    if not plan.get("manifest"):
        return []  # `code_changed` already says the wave has none
    now = manifest.build(cfg, plan["runner"], reference_key(plan["runner"], "", 0, 0))
    try:
        return manifest.differences(plan["manifest"], now, ignore=("runner.code_digest", "workload.code_digest"))
    except (TypeError, AttributeError, ValueError, RecursionError) as exc:  # a hand-edited manifest
        return [f"manifest: the wave's is damaged and cannot be compared ({type(exc).__name__})"]


class Shrinker:
    """Runs the search on one fleet; `run(task)` replays a plan and returns (verdict, signature, wave dir)."""

    def __init__(self, plan: dict, task_id: str, root: Path, cfg, fleet, budget: int, on_step=None):
        self.plan, self.task_id, self.root, self.cfg, self.fleet = plan, task_id, root, cfg, fleet
        self.budget, self.on_step = budget, on_step or (lambda *_: None)
        self.tried: list[dict] = []

    def run(self, task: dict, what: str) -> dict:
        from cluster.driver import WaveRun

        original = dict(self.plan, tasks=[task])
        t = time.perf_counter()
        wave = WaveRun(self.cfg, self.root, progress=False, fleet=self.fleet, replay=(original, self.task_id))
        result = wave.run()
        g = next(x for x in result["tasks"] if x["task_id"] == self.task_id)
        step = {"step": len(self.tried), "what": what, "wave_id": result["wave_id"], "verdict": g["verdict"],
                "signature": g.get("signature"), "size": list(size(task)), "wall_s": round(time.perf_counter() - t, 1),
                "faults": [{k: f.get(k) for k in ("instance", "fault_id", "trigger", "at_s", "window_s", "params")}
                           for f in task.get("faults") or []], "steps": task.get("steps"),
                "harness_error": result.get("harness_error")}
        self.tried.append(step)
        self.on_step(step)
        return step

    def search(self, task: dict, signature: str) -> dict:
        """Returns {"reproduced", "smallest": step, "task": smallest plan, "exhausted"}."""
        first = self.run(task, "as it ran")
        if first["verdict"] != "fail" or first["signature"] != signature:
            return {"reproduced": False, "smallest": first, "task": task, "exhausted": False}
        best, best_task = first, task
        while len(self.tried) < self.budget:
            for what, cand in candidates(best_task, self.plan["runner"]):
                if len(self.tried) >= self.budget:
                    break
                step = self.run(cand, what)
                if step["verdict"] == "fail" and step["signature"] == signature:
                    best, best_task = step, cand
                    break
            else:
                return {"reproduced": True, "smallest": best, "task": best_task, "exhausted": False}
        return {"reproduced": True, "smallest": best, "task": best_task, "exhausted": True}


def write_record(wave_dir: Path, task_id: str, signature: str, outcome: dict, tried: list[dict], budget: int,
                 code_changed: list[str] = ()) -> Path:
    """`shrink-<task>.json`; an earlier shrink's record is kept as `shrink-<task>.<n>.json`."""
    out = wave_dir / f"shrink-{task_id}.json"
    if out.exists():
        n = 1
        while (wave_dir / f"shrink-{task_id}.{n}.json").exists():
            n += 1
        out.rename(wave_dir / f"shrink-{task_id}.{n}.json")
    out.write_bytes(orjson.dumps({"task_id": task_id, "wave_id": wave_dir.name, "signature": signature,
                                  "code_changed_since_the_wave": list(code_changed), "anyway": bool(code_changed),
                                  "budget": budget, "reproduced": outcome["reproduced"],
                                  "budget_exhausted": outcome["exhausted"], "smallest": outcome["smallest"],
                                  "tried": tried}, option=orjson.OPT_INDENT_2))
    return out


def replay_command(root: Path, step: dict, task_id: str) -> str:
    return f"sandfleet wave replay {root / step['wave_id'] / task_id}"

