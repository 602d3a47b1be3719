"""The product's wall beside the bare loop of the same runner (issue 19), in one run.

The wave: `sandfleet wave run` of N durable tasks at concurrency C, faults none, with its own Ray and store, and
the same wave on a fleet already up (`sandfleet up`, then `--address fleet`), cold and then warm (its reference
runs reused from the cache of the same results root). The bare
loop: the same runner script run by `xargs -P C`, once for each attempt the wave ran (its reference runs too), each
with the environment of the runner contract and a workspace holding the task's repo, against the same services
started here with no harness around them (an embedded store with its admin key, the scripted model, the effects
service), no sandbox, no lease, no proxy, no grading. Each runner must exit 0 and leave its journal in the store,
or the row is not written.

CPU, side by side: the wave with its own Ray and store runs in a cpuacct cgroup of its own, and so does the bare loop
(in a child process, `--loop`, which starts its store and services and runs xargs). The wave's CPU less the bare
loop's, per run, is what the harness costs beyond the runners' own work and their own traffic to the same services
(the store's CPU for their requests, the model's answers): both pay those.

`python -m tests.bench.bare` prints the row; `tests.bench.cost` writes it into its table (part of `make bench`).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.cpu import Cgroup, part_cpu

ROOT = Path(__file__).resolve().parents[2]


def _cli(args: list[str], env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _wave(root: Path, cfg: Path, address: str, env: dict, cpu: dict | None = None) -> tuple[float, Path]:
    """The wave's wall and results dir; with `cpu` (a dict to fill), run in a cpuacct cgroup of its own: `all`,
    `sandboxes` (the tree less every harness process) and `parts` (CPU-seconds)."""
    out = root / f"r-{address}"
    argv = [sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--address", address, "--results", str(out),
            "--no-progress"]
    t = time.perf_counter()
    if cpu is None:
        p = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    else:
        cg = Cgroup("bare-wave")
        try:
            p, seen = cg.run(argv, sample=True, cwd=ROOT, env=env, timeout=900)
            cpu["all"], cpu["parts"] = cg.usage_s(), part_cpu(seen)
            cpu["sandboxes"] = cpu["all"] - sum(cpu["parts"].values())
        finally:
            cg.remove()
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"the wave on {address}: exit {p.returncode}: {p.stdout[-500:]} {p.stderr[-2000:]}")
    return wall, (out / "latest").resolve()


def _bare(root: Path, runs: list[dict], concurrency: int, think_ms: int) -> dict:
    """The bare loop in a child process (`--loop`) inside a cpuacct cgroup of its own: its `wall`, and its CPU
    `all` in, split into the `store` (weed), the `services` (the model and effects services, in the child's own
    process) and the `runners` (the rest: the runner processes and their sh/xargs)."""
    spec = root / "bare-spec.json"
    spec.write_text(json.dumps({"root": str(root), "runs": runs, "concurrency": concurrency, "think_ms": think_ms}))
    cg = Cgroup("bare-loop")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        p, seen = cg.run([sys.executable, "-m", "tests.bench.bare", "--loop", str(spec)], sample=True, cwd=ROOT,
                         env=env, timeout=900)
        total, parts = cg.usage_s(), part_cpu(seen)
    finally:
        cg.remove()
    if p.returncode != 0:
        raise SystemExit(f"the bare loop: exit {p.returncode}: {p.stdout[-500:]} {p.stderr[-2000:]}")
    store, services = parts.get("store (weed)", 0.0), parts.get("services (bare loop)", 0.0)
    return {"wall": json.loads(p.stdout.strip().splitlines()[-1])["wall"], "all": total, "store": store,
            "services": services, "runners": total - store - services}


def _loop(root: Path, runs: list[dict], concurrency: int, think_ms: int) -> float:
    """`runs`: [{task_id, seed, steps, workload}], one per runner execution. Returns the loop's wall."""
    from fleet import workloads
    from fleet.effects import EffectsService
    from fleet.model_endpoint import ModelEndpoint
    from fleet.runners import builtin_command
    from fleet.services import TaskRegistry
    from storage.credentials import CredentialSource
    from storage.store import EmbeddedStore, ensure_bucket

    store = EmbeddedStore(root / "store")
    endpoint = store.start()
    registry = TaskRegistry()
    model = ModelEndpoint(registry, think_ms=think_ms).start()
    effects = EffectsService(registry).start()
    try:
        ensure_bucket(endpoint, "bare")
        scripts = []
        for i, r in enumerate(runs):
            d = root / "runs" / f"{i:03d}-{r['task_id']}"
            for path, text in workloads.get(r["workload"]).fixture(r["seed"]).items():
                (d / "repo" / path).parent.mkdir(parents=True, exist_ok=True)
                (d / "repo" / path).write_text(text)
            registry.register(r["task_id"], r["seed"], r["steps"], r["workload"])
            key = registry.attempt_key(r["task_id"], 1, f"{r['task_id']}-bare{i}")
            src = CredentialSource(d / "creds")
            src.publish(endpoint.creds)
            src.write_aws_config(d / "aws-config", endpoint.region)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
                   "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(d), "TMPDIR": "/tmp",
                   "AWS_CONFIG_FILE": str(d / "aws-config"), "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                   "AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL_S3": endpoint.url,
                   "AWS_DEFAULT_REGION": endpoint.region, "OPENAI_BASE_URL": model.base_url,
                   "OPENAI_API_KEY": key, "OPENAI_MODEL": "sandfleet-script", "SANDFLEET_CONTRACT": "1",
                   "SANDFLEET_TASK_ID": r["task_id"], "SANDFLEET_ATTEMPT": "1", "SANDFLEET_FENCE": "1",
                   "SANDFLEET_WORKSPACE": str(d), "SANDFLEET_REPO": str(d / "repo"),
                   "SANDFLEET_S3_ENDPOINT": endpoint.url, "SANDFLEET_S3_BUCKET": "bare",
                   "SANDFLEET_S3_PREFIX": f"bare/{i:03d}/{r['task_id']}/", "SANDFLEET_EFFECTS_URL": effects.url + "/v1",
                   "SANDFLEET_EFFECTS_KEY": key, "SANDFLEET_GRACE_S": "1.0"}
            argv = " ".join(shlex.quote(a) for a in builtin_command("durable"))
            script = d / "run.sh"
            script.write_text("cd " + shlex.quote(str(d)) + " && exec env -i "
                              + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
                              + f" {argv} > runner.log 2>&1\n")
            scripts.append(str(script))
        listing = root / "runs.txt"
        listing.write_text("\n".join(scripts) + "\n")
        t = time.perf_counter()
        p = subprocess.run(["xargs", "-P", str(concurrency), "-n", "1", "sh"], stdin=listing.open(),
                           capture_output=True, text=True, timeout=900)
        wall = time.perf_counter() - t
        if p.returncode != 0:
            logs = sorted((root / "runs").glob("*/runner.log"))
            raise SystemExit(f"the bare loop: xargs exit {p.returncode}; {p.stderr[-500:]}; a runner's log: "
                             f"{logs[0].read_text()[-1500:] if logs else '-'}")
        client = endpoint.client()
        journals = sum(1 for i, r in enumerate(runs)
                       if client.list_objects_v2(Bucket="bare", Prefix=f"bare/{i:03d}/{r['task_id']}/journal/",
                                                 MaxKeys=1).get("KeyCount"))
        if journals != len(runs):
            raise SystemExit(f"the bare loop: {len(runs) - journals} of {len(runs)} runs left no journal")
        return wall
    finally:
        model.stop()
        effects.stop()
        store.stop()


def bench_bare(rows: list, tasks: int = 32, concurrency: int = 16, steps: int = 10, think_ms: int = 50) -> dict:
    """Appends the rows; returns the bare loop's CPU per run (seconds): `store`, `services`, `runners`."""
    root = Path(tempfile.mkdtemp(prefix="sfbench-bare-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_USAGE_STATS_ENABLED="0", SANDFLEET_FLEET_FILE=str(root / "run" / "fleet.json"))
    cfg = root / "w.yaml"
    cfg.write_text(f"tasks: {tasks}\nconcurrency: {concurrency}\nseed: 5\nrunner: durable\nfaults: none\n"
                   f"workload: {{steps: {steps}, think_ms: {think_ms}}}\ndeadline_s: 300\n")
    try:
        cpu: dict = {}
        wall, d = _wave(root, cfg, "local", env, cpu)
        up = _cli(["up"], env, 300)
        if up.returncode != 0:
            raise SystemExit(f"sandfleet up: exit {up.returncode}: {up.stderr[-2000:]}")
        try:
            on_fleet, _ = _wave(root, cfg, "fleet", env)
            warm, dw = _wave(root, cfg, "fleet", env)  # the same results root: its reference runs are cached
            reused = sum(1 for t in json.loads((dw / "plan.json").read_text())["tasks"] if t["reference"]["cached"])
        finally:
            _cli(["down"], env, 300)
        plan = json.loads((d / "plan.json").read_text())
        seeds = {t["task_id"]: t for t in plan["tasks"]}
        events = [json.loads(x) for x in (d / "timeline.jsonl").read_text().splitlines()]
        runs = []
        causes: dict = {}
        for e in events:
            if e["event"] == "attempt_end":
                causes[e.get("cause")] = causes.get(e.get("cause"), 0) + 1
            if e["event"] == "attempt_start":
                t = seeds[e["task"].removeprefix("ref-")]
                runs.append({"task_id": e["task"], "seed": t["seed"], "steps": t["steps"], "workload": t["workload"]})
        bare = _bare(root, runs, concurrency, think_ms)
    finally:
        if not os.environ.get("SFBENCH_KEEP"):  # (set: the waves' results are kept for a look)
            shutil.rmtree(root, ignore_errors=True)
    rows.append((f"{tasks} durable tasks ({steps} steps x {think_ms} ms), concurrency {concurrency}: the product's "
                 f"wave (its own Ray and store) / the bare `xargs -P {concurrency}` loop of the same {len(runs)} runner "
                 "runs against the same services", f"{wall:.1f} s", f"{bare['wall']:.1f} s",
                 f"x{wall / bare['wall']:.2f} (goal: x1.25); the wave's attempts ended: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(causes.items(), key=str))))
    n = len(runs)
    harness = cpu["all"] - cpu["sandboxes"]
    rows.append((f"the same {n} runs, CPU all in: the wave (own Ray and store) / the bare loop",
                 f"{cpu['all']:.1f} s", f"{bare['all']:.1f} s",
                 f"the wave's sandboxes {cpu['sandboxes']:.1f} s, harness {harness:.1f} s = "
                 f"x{harness / cpu['sandboxes']:.2f} of the sandboxes (goal: x0.15 at 32 tasks); the bare loop's "
                 f"runners {bare['runners']:.1f} s, store {bare['store']:.1f} s, services {bare['services']:.1f} s"))
    beyond = cpu["all"] - bare["all"]
    rows.append((f"the same {n} runs: what the wave costs beyond the bare loop (CPU all in, per run)",
                 f"{beyond / n * 1000:.0f} ms", f"of which the sandboxes beyond the bare runners "
                 f"{(cpu['sandboxes'] - bare['runners']) / n * 1000:.0f} ms",
                 f"x{beyond / bare['runners']:.2f} of the bare runners' CPU; the wave's harness by part: " + "; ".join(
                     f"{k} {v:.1f} s" for k, v in sorted(cpu["parts"].items(), key=lambda kv: -kv[1]) if v >= 0.05)))
    rows.append(("the same wave on a fleet already up (`sandfleet up`, `--address fleet`) / the bare loop",
                 f"{on_fleet:.1f} s", f"{bare['wall']:.1f} s", f"x{on_fleet / bare['wall']:.2f}"))
    rows.append((f"the same wave on the fleet, cold (every reference run, beside its task) / warm ({reused} of "
                 f"{tasks} references reused from the cache)", f"{on_fleet:.1f} s", f"{warm:.1f} s",
                 f"x{on_fleet / warm:.2f} (goal: x1.2)"))
    return {k: bare[k] / n for k in ("store", "services", "runners")}


def main() -> None:
    sys.path.insert(0, str(ROOT))
    if sys.argv[1:2] == ["--loop"]:  # the bare loop itself, in the cgroup _bare made
        spec = json.loads(Path(sys.argv[2]).read_text())
        print(json.dumps({"wall": _loop(Path(spec["root"]), spec["runs"], spec["concurrency"], spec["think_ms"])}))
        return
    rows: list = []
    bench_bare(rows)
    for r in rows:
        print(" | ".join(r))


if __name__ == "__main__":
    main()
