"""The wave driver: plan, start the real parts, run every task's attempts under
leases in sandboxes, fire the planned faults, clear them, sweep, snapshot the
store, and hand the stored history to the grader.

Everything the grader needs is written under `results/<wave>/` before grading
starts, so `sandfleet grade RESULTS_DIR` re-grades a finished wave without
running anything.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import orjson

from cluster import grade, report, results
from cluster.artifacts import ReferenceCache, reference_key, write_artifact
from cluster.config import WaveConfig
from cluster.raycluster import FleetSession
from faults.base import APPLIED, CATALOG, UNKNOWN, FaultSpec, Receipt
from faults.planner import derive, drawn, plan_faults, task_seed
from fleet.lifecycle import TASK_ENDED, TASK_TRANSITIONS, Lifecycle, TaskState
from fleet import workloads
from fleet.effects import EffectsService
from fleet.model_endpoint import MODEL_ID, ModelEndpoint
from fleet.runners import HERE as BUILTIN_DIR
from fleet.sandbox import RUN_IN, SANDBOX_UID, WORKSPACE_IN, check_process_backend
from fleet.services import CallLog, TaskRegistry
from storage.credentials import Credentials, CredentialSource
from storage.keys import ScopedKeys
from storage.proxy import ProxyProcess
from storage.store import EmbeddedStore, StoreEndpoint, ensure_bucket


CONTRACT_VERSION = "1"
# Inside every sandbox's own network namespace: loopback ports relayed to the harness services.
PORT_S3, PORT_MODEL, PORT_EFFECTS = 18000, 18001, 18002
CREDS_IN = f"{RUN_IN}/creds"
RUNNERS_DIR = BUILTIN_DIR


def runtime_binds(runner: dict, never: list) -> tuple[list[str], list[str]]:
    """What a runner needs to see read-only (its code, its interpreter's prefix), and what to hide in it.

    An absolute argv[0] brings its installation prefix (a venv, and the interpreter a venv points to);
    other absolute paths on the command line bring their directory; `workdir` comes whole. Anything
    under /usr or /etc is already there. Paths in `never` (results, the wave's private dir) are covered
    by an empty tmpfs if a bind would show them."""
    binds: set[str] = {RUNNERS_DIR}
    if runner.get("workdir"):
        binds.add(runner["workdir"])
    for i, a in enumerate(runner["command"]):
        if not (os.path.isabs(a) and os.path.exists(a)):
            continue
        for p in {os.path.abspath(a), os.path.realpath(a)}:
            binds.add(os.path.dirname(os.path.dirname(p)) if i == 0 else os.path.dirname(p))
    for b in list(binds):
        cfg = os.path.join(b, "pyvenv.cfg")
        if os.path.isfile(cfg):
            for line in open(cfg):
                k, _, v = line.partition("=")
                if k.strip() == "home" and v.strip():
                    binds.add(os.path.dirname(os.path.realpath(v.strip())))
    binds = {b for b in binds
             if b not in ("/", "") and not b.startswith(("/usr/", "/etc/")) and b not in ("/usr", "/etc")}
    hide = sorted({str(n) for n in never for b in binds if str(n).startswith(b.rstrip("/") + "/") or str(n) == b})
    return sorted(binds), hide


def _exit_text(rc: int | None) -> str:
    if rc is None:
        return "running"
    if rc < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


class HarnessError(RuntimeError):
    """The harness could not run the wave (not a verdict about the runner)."""


def new_wave_id(seed: int) -> str:
    ts = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"w-{ts}-s{seed}-{secrets.token_hex(2)}"


REF = "ref-"


def build_plan(cfg: WaveConfig, wave_id: str, cache: ReferenceCache | None = None) -> dict:
    """Every task, its seed and faults, and the reference run (positive control) of each seed.

    A reference is an uninterrupted, fault-free run of the same runner on the same seed; one found
    in the cache (same runner code, workload and seed) is reused instead of run again.
    """
    runner = cfg.runner_spec()
    if cfg.enumerate_boundaries:  # phase 1 runs the reference alone; its boundaries plan the tasks
        seed = task_seed(cfg.seed, 0)
        key = reference_key(runner, cfg.workload.name, cfg.workload.steps, seed)
        base = {"seed": seed, "runner": runner["name"], "workload": cfg.workload.name, "steps": cfg.workload.steps}
        return {"wave_id": wave_id, "seed": cfg.seed, "created_at": time.time(), "config": cfg.model_dump(mode="json"),
                "runner": runner, "tasks": [], "enumerate": {"pending": True},
                "references": [{"task_id": REF + "t000", "role": "reference", "reference_of": "t000", **base,
                                "faults": [], "reference": {"task_id": REF + "t000", "key": key, "cached": False}}]}
    task_ids = [f"t{i:03d}" for i in range(cfg.tasks)]
    faults = plan_faults(cfg.seed, task_ids, cfg.faults, cfg.fault_params())
    tasks, refs = [], []
    for i, tid in enumerate(task_ids):
        seed = task_seed(cfg.seed, i)
        key = reference_key(runner, cfg.workload.name, cfg.workload.steps, seed)
        cached = cache.get(key) is not None if cache is not None else False
        base = {"seed": seed, "runner": runner["name"], "workload": cfg.workload.name, "steps": cfg.workload.steps}
        tasks.append({"task_id": tid, "role": "task", **base, "faults": [f.to_dict() for f in faults[tid]],
                      "reference": {"task_id": REF + tid, "key": key, "cached": cached}})
        if not cached:
            refs.append({"task_id": REF + tid, "role": "reference", "reference_of": tid, **base, "faults": [],
                         "reference": {"task_id": REF + tid, "key": key, "cached": False}})
    return {"wave_id": wave_id, "seed": cfg.seed, "created_at": time.time(), "config": cfg.model_dump(mode="json"),
            "runner": runner, "tasks": tasks, "references": refs, "placement": placement(cfg)}


def placement(cfg: WaveConfig) -> dict:
    """Where attempts run, as the plan shows it to the user."""
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
    task = orjson.loads(orjson.dumps(task))
    ref = task["reference"]
    ref["cached"] = cache is not None and cache.get(ref["key"]) is not None
    refs = [] if ref["cached"] else [{
        "task_id": ref["task_id"], "role": "reference", "reference_of": task_id, "seed": task["seed"],
        "runner": task["runner"], "workload": task["workload"], "steps": task["steps"], "faults": [],
        "reference": dict(ref)}]
    return {"wave_id": wave_id, "seed": original["seed"], "created_at": time.time(), "config": original["config"],
            "runner": original["runner"], "tasks": [task], "references": refs,
            "replay_of": {"wave_id": original["wave_id"], "task_id": task_id}}


def enumerate_tasks(plan: dict, counts: dict, limit: int | None) -> list[dict]:
    """One PK1 task per boundary of the uninterrupted reference run (and per variant of a store write), all on
    the reference's seed; a seeded sample of `limit` when there are more."""
    ref = plan["references"][0]
    points = [("model_call", n, None) for n in range(1, counts["model_call"] + 1)]
    points += [("effect", n, None) for n in range(1, counts["effect"] + 1)]
    points += [("store_write", n, v) for n in range(1, counts["store_write"] + 1) for v in ("ambiguous", "after")]
    if limit is not None and len(points) > limit:
        keep = set(derive(plan["seed"], "boundaries").sample(range(len(points)), limit))
        points = [p for i, p in enumerate(points) if i in keep]
    tasks = []
    for i, (kind, n, variant) in enumerate(points):
        tid = f"t{i:03d}"
        params = {"after": n, "variant": variant or "after"}
        spec = FaultSpec(fault_id="PK1", instance=f"{tid}-PK1", task_id=tid, trigger=kind, at_s=0.0,
                         seed=derive(plan["seed"], tid, "PK1").randrange(2**31), params=params)
        tasks.append({"task_id": tid, "role": "task", "seed": ref["seed"], "runner": ref["runner"],
                      "workload": ref["workload"], "steps": ref["steps"], "faults": [spec.to_dict()],
                      "boundary": {"kind": kind, "n": n, "variant": variant},
                      "reference": {"task_id": ref["task_id"], "key": ref["reference"]["key"], "cached": False}})
    return tasks


def preflight(cfg: WaveConfig) -> None:
    """Fail fast, before any results are written, on what this machine lacks."""
    from fleet.cgroups import CgroupError
    from fleet.sandbox import SandboxError
    from storage.errors import StoreError
    from storage.store import find_weed

    try:
        if cfg.sandbox.backend == "process":
            check_process_backend()
        else:  # docker: the engine answers, and the image exists locally (the base image is built now, once)
            check_process_backend()  # the workspace tmpfs and the relays are made the same way
            from fleet.docker_backend import DockerBackend
            from fleet.sandbox import SandboxSpec

            DockerBackend().image(SandboxSpec("", "", "", 0, [], {}, "", image=cfg.sandbox.image, backend="docker"))
        if not cfg.store.url:
            find_weed()
    except (CgroupError, SandboxError, StoreError, RuntimeError) as exc:
        raise HarnessError(str(exc)) from None
    if cfg.address not in ("local", "auto"):
        check_ray_address(cfg.address)


def check_ray_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail in bounded time, before anything is written, when no Ray cluster answers at `address`."""
    import socket

    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise HarnessError(f"cannot reach a Ray cluster at {address!r}: expected HOST:PORT of the head's GCS "
                           "(e.g. 127.0.0.1:6379), or 'local'")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise HarnessError(f"cannot reach a Ray cluster at {address}: {exc.strerror or exc} (is `ray start --head` "
                           "running there? use --address local for a private Ray)") from None


class Timeline:
    def __init__(self, path: Path, since_wall: float | None = None):
        """`since_wall`: the wall time of an earlier segment's t=0 (a resumed wave's clock continues)."""
        self.t0 = time.monotonic() - (time.time() - since_wall if since_wall is not None else 0.0)
        self.f = open(path, "ab")

    def __call__(self, event: str, **fields) -> dict:
        rec = {"t": round(time.monotonic() - self.t0, 4), "wall": time.time(), "event": event, **fields}
        self.f.write(orjson.dumps(rec, default=str) + b"\n")
        self.f.flush()
        return rec

    def close(self) -> None:
        self.f.close()


@dataclass
class TaskRun:
    plan: dict
    life: Lifecycle = field(default_factory=lambda: Lifecycle(TASK_TRANSITIONS, TaskState.PENDING))
    current: tuple | None = None  # (host handle, sandbox_id) while an attempt runs
    node: str | None = None  # the node of the attempt that runs now
    abandon: dict | None = None  # PK6: set to give up on the running attempt (frozen past its lease)
    arms: dict = field(default_factory=dict)  # instance -> {"arm": watch started with each attempt, "future"}
    abandon_ev: asyncio.Event | None = None
    attempts: int = 0
    finished_before: bool = False  # a resumed wave: it ended before the driver died (kept, not run again)


class FaultContextImpl:
    def __init__(self, wave: "WaveRun"):
        self.wave = wave
        self.bucket = wave.bucket

    def task_prefix(self, task_id: str) -> str:
        return self.wave.task_prefix(task_id)

    async def current_sandbox(self, task_id: str):
        return self.wave.runs[task_id].current

    async def armed_outcome(self, task_id: str, instance: str) -> dict:
        return await self.wave.runs[task_id].arms[instance]["future"]

    async def runner_started(self, task_id: str) -> None:
        """Until the task's current attempt has its runner running (cancelled with the task)."""
        while True:
            cur = self.wave.runs[task_id].current
            if cur is not None:
                try:
                    if await cur[0].started.remote(cur[1], 0.5):
                        return
                except Exception:  # noqa: BLE001 - a lost host: the fault finds no sandbox later
                    return
            await asyncio.sleep(0.02)

    async def wait_model_answers(self, task_id: str, n: int) -> bool:
        """Polls the endpoint's per-task count of delivered answers (cancelled when the task ends)."""
        while self.wave.model.delivered(task_id) < n:
            await asyncio.sleep(0.002)
        return True

    async def wait_effects(self, task_id: str, n: int) -> bool:
        """Polls the effects service's per-task count of answered effects (cancelled when the task ends)."""
        while self.wave.effects.answered(task_id) < n:
            await asyncio.sleep(0.002)
        return True

    async def rotate_credentials(self, task_id: str, delay_s: float) -> dict:
        """CR1: rotate the current attempt's key at the store, then publish the new key to its credential
        source only `delay_s` later (until then credential_process still prints the dead key)."""
        return await self.wave.rotate_attempt_key(task_id, delay_s)

    def store_requests(self, akids: set, t0: float, t1: float) -> list[dict]:
        """The proxy's log lines of requests signed by these key ids between t0 and t1."""
        out = []
        try:
            self.proxy().flush()
        except (RuntimeError, OSError):
            pass
        try:
            for r in results.read_jsonl(self.wave.out.proxy_requests, skip_bad=True):  # the proxy writes on
                if r.get("akid") in akids and t0 <= r["t"] <= t1:
                    out.append(r)
        except OSError:
            pass
        return out

    async def node_of(self, task_id: str) -> str | None:
        run = self.wave.runs[task_id]
        return run.node if run.current is not None else None

    async def lose_node(self, node: str, mode: str, grace_s: float, down_s: float, instance: str,
                        task_id: str) -> dict:
        """PK3: the node goes away with every sandbox on it (after a drain notice when mode is 'drain'), and
        comes back `down_s` later as a new Ray node (an autoscaler replacing a spot VM)."""
        return await self.wave.lose_node(node, mode, grace_s, down_s, instance, task_id)

    async def node_back(self, node: str) -> dict:
        """Wait until a lost node is back (the fault's clear)."""
        return await self.wave.node_back(node)

    async def abandon(self, task_id: str, sandbox_id: str, instance: str) -> None:
        """PK6: the driver gives up on a frozen attempt (its lease will run out) and starts the next one; the
        attempt's keys are revoked now. The frozen sandbox lives on as a zombie until the fault ends it."""
        run = self.wave.runs[task_id]
        if run.current is not None and run.current[1] == sandbox_id and run.abandon_ev is not None:
            run.abandon = {"instance": instance, "at": time.time()}
            run.abandon_ev.set()

    async def newer_attempt(self, task_id: str, sandbox_id: str, timeout_s: float) -> str | None:
        """The sandbox id of a newer attempt of the task once one runs (None after `timeout_s`)."""
        run, att = self.wave.runs[task_id], results.attempt_of(sandbox_id)[1]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and run.life.state not in TASK_ENDED:
            if run.attempts > att:
                return results.sandbox_id(task_id, att + 1)
            await asyncio.sleep(0.02)
        return results.sandbox_id(task_id, att + 1) if run.attempts > att else None

    def fenced_activity(self, task_id: str, sandbox_id: str, since: float) -> dict:
        """What a zombie attempt did from `since`: its store requests (by its key id) and what each got, and the
        model/effects calls the services refused because its key was revoked."""
        akids = {a for a in [self.wave.akids.get(sandbox_id)] if a}
        reqs = self.store_requests(akids, since, time.time() + 1)
        attempt = results.attempt_of(sandbox_id)[1]
        refused = [r for r in list(self.wave.fenced_log.records) if r["task"] == task_id
                   and r["attempt"] == attempt and r["t"] >= since]
        return {"store": [{"method": r.get("method"), "key": r.get("key"), "status": r.get("status")} for r in reqs],
                "refused_calls": [{"service": r["service"], "path": r["path"]} for r in refused]}

    def proxy(self):
        if self.wave.lost("fault proxy"):
            raise RuntimeError("the fault proxy is lost (harness fault)")
        return self.wave.proxy.control()


class WaveRun:
    def __init__(self, cfg: WaveConfig, results_root: str | Path = "results", progress: bool = True,
                 fleet: FleetSession | None = None, resume_dir: str | Path | None = None,
                 replay: tuple[dict, str] | None = None):
        self.cfg = cfg
        self.replay = replay  # (the original plan, the task id) for `wave replay`
        self.resume_plan = None
        if resume_dir is not None:  # `wave resume`: the same wave, results dir and private dir
            self.dir = Path(resume_dir).resolve()
            self.out = results.ResultsDir(self.dir)
            self.resume_plan = orjson.loads(self.out.plan.read_bytes())
            self.results_root = self.dir.parent
            self.wave_id = self.resume_plan["wave_id"]
        else:
            self.results_root = Path(results_root).resolve()
            self.wave_id = new_wave_id(cfg.seed)
            self.dir = self.results_root / self.wave_id
            self.out = results.ResultsDir(self.dir)
        self.private = Path(f"/tmp/sandfleet-{self.wave_id}")
        self.bucket = results.bucket_name(self.wave_id)
        self.show_progress = progress
        self.store: EmbeddedStore | None = None
        self.endpoint: StoreEndpoint | None = None
        self.proxy: ProxyProcess | None = None
        self.model: ModelEndpoint | None = None
        self.effects: EffectsService | None = None
        self.keys: ScopedKeys | None = None
        self.registry = TaskRegistry()
        self.cache = ReferenceCache(self.results_root)
        self.fleet = fleet
        self.own_fleet = fleet is None
        self.ledger = None
        self.hosts: list = []
        self.node_load: dict[str, int] = {}  # node -> attempts running there now (placement)
        self.placed: dict[str, str] = {}  # sandbox id -> its node
        self.nodes_out: set[str] = set()  # draining or lost: no new attempt goes there
        self.nodes_lost: dict[str, dict] = {}  # node -> how PK3 took it (its attempts end as killed, not as a fault)
        self.node_events: dict[str, asyncio.Event] = {}  # node -> set when it is back
        self.node_back_info: dict[str, dict] = {}
        self.node_faults: dict[str, str] = {}  # node -> the PK3 instance draining or taking it
        self.node_tasks: list[asyncio.Task] = []
        self.zombies: list = []  # futures of abandoned attempts (PK6) still running
        self.load_samples: list[dict] = []  # host-load.jsonl
        self.runs: dict[str, TaskRun] = {}
        self.receipts: list[Receipt] = []
        self.fault_tasks: dict[str, list[asyncio.Task]] = {}
        self.timeline: Timeline | None = None
        self.figures: dict = {}
        self.interrupted: str | None = None
        self.harness_fault: dict | None = None
        self._last_ok: dict[str, float] = {}  # each watched part: when it last answered a probe
        self.resumed: dict | None = None  # what a resumed wave kept: finished tasks, attempts, fired faults
        self.prior_receipts: list[dict] = []
        self.akids: dict[str, str] = {}  # sandbox id -> its attempt key's id (per-attempt keys only)

    def task_prefix(self, task_id: str) -> str:
        return results.task_prefix(self.wave_id, task_id)

    def lease_key(self, task_id: str) -> str:
        return results.lease_key(self.wave_id, task_id)

    # ------------------------------------------------------------------ setup
    def _setup(self) -> None:
        preflight(self.cfg)
        from fleet import cgroups

        # the driver (services, relays of the model and effects calls) runs beside the sandboxes, not above
        self.harness_cg = cgroups.join_harness(f"driver-{os.getpid()}")
        self.private.mkdir(parents=True, exist_ok=True)
        os.chmod(self.private, 0o700)
        from cluster.sweep import record_driver

        record_driver(self.private)  # a later `sandfleet sweep` knows this wave is dead once this pid is
        # the store and the proxy are processes that take a while to come up: both are launched first, and the
        # services and the fleet start while they do (a wave's fixed cost is the longest of them, not their sum)
        t_store = time.perf_counter()
        if self.cfg.store.url:
            s = self.cfg.store
            if not (s.access_key and s.secret_key):
                raise HarnessError("store.url is set but store.access_key / store.secret_key are not")
            self.endpoint = StoreEndpoint(url=s.url, creds=Credentials(s.access_key, s.secret_key))
        else:
            self.store = EmbeddedStore(self.private / "store")
            self.endpoint = self.store.launch()
        self.proxy = ProxyProcess(self.endpoint.url, str(self.out.proxy_requests)).launch()
        self.model = ModelEndpoint(self.registry, think_ms=self.cfg.workload.think_ms,
                                   log_path=self.out.model_calls).start()
        self.effects = EffectsService(self.registry, log_path=self.out.effects).start()
        self.fenced_log = CallLog(self.out.fenced)  # calls refused because their attempt was fenced
        self.model.fenced = self.effects.fenced = self.fenced_log
        self.binds, self.hide = runtime_binds(self.plan["runner"], [self.results_root, self.private])
        for t in self.plan["tasks"] + self.plan["references"]:
            self.registry.register(t["task_id"], t["seed"], t["steps"], t["workload"])
        if self.resumed is not None:  # the services carry on from what their logs recorded
            self.model.log.preload(self.out.model_calls)
            self.effects.preload(self.out.effects)
        if self.fleet is None:  # a lent fleet is already running: nothing to time
            t = time.perf_counter()
            # a private Ray's temp dir is recorded in the wave's private dir: a sweep after a dead driver ends
            # that Ray's processes too (its path is short: Ray's unix socket paths must fit in 107 bytes)
            ray_tmp = f"/tmp/sfray-{hashlib.sha256(self.wave_id.encode()).hexdigest()[:10]}"
            if self.cfg.address == "local":
                (self.private / results.RAY_RECORD).write_bytes(orjson.dumps({"tmpdir": ray_tmp}))
            self.fleet = FleetSession(self.cfg.address, state_dir=str(self.private / "fleet"),
                                      ray_tmpdir=ray_tmp if self.cfg.address == "local" else None,
                                      nodes=self.cfg.nodes)
            os.makedirs(self.fleet.state_dir, exist_ok=self.resumed is not None)
            self.fleet.start()
            self.figures["fleet_start_s"] = round(time.perf_counter() - t, 3)
        else:
            replaced = self.fleet.heal()  # a lent fleet may have lost an actor in an earlier wave
            if replaced:
                self.timeline("fleet_healed", replaced=replaced)
        if self.store is not None:
            self.store.wait_ready()
        self.figures["store_start_s"] = round(time.perf_counter() - t_store, 3)  # from its launch until it answered
        ensure_bucket(self.endpoint, self.bucket)
        self.proxy.wait_ready()
        # per-attempt keys scoped to the task's prefix, at the store (embedded store only)
        self.keys = ScopedKeys(self.store, self.endpoint.creds) if self.store is not None else None
        # the only ways out of a sandbox's network namespace: loopback listeners relayed to these services
        self.relay_targets = {PORT_S3: f"127.0.0.1:{self.proxy.port}",
                              PORT_MODEL: f"127.0.0.1:{self.model.server.server_address[1]}",
                              PORT_EFFECTS: f"127.0.0.1:{self.effects.server.server_address[1]}"}
        self.ledger, self.hosts = self.fleet.ledger, self.fleet.hosts
        import ray

        # the sweep actor watches the wave from now on: a sandbox alive with no lease for longer than the settle
        # window is a leak it reaps (long enough for a PK6 zombie's observation and a host's clean-up)
        self.sweep_settle_s = max(10.0, 2 * self.cfg.lease_ttl_s)
        ray.get(self.fleet.sweeper.watch.remote(self.wave_id, self.sweep_settle_s), timeout=60)
        self.part_pids = {"store": getattr(getattr(self.store, "proc", None), "pid", None),
                          "fault proxy": self.proxy.proc.pid, "driver": os.getpid(),
                          "lease ledger": ray.get(self.ledger.ping.remote(), timeout=60),
                          "sandbox hosts": [i["pid"] for i in self.fleet.host_info]}

    def _attempt_credentials(self, tid: str, sandbox_id: str) -> str:
        """The attempt's own key (scoped to the task's prefix) in a directory the sandbox sees read-only."""
        creds = self.endpoint.creds
        if self.keys is not None:
            creds = self.keys.issue(sandbox_id, self.bucket, self.task_prefix(tid))
            self.akids[sandbox_id] = creds.access_key  # the key id (not the secret) attributes its requests
        d = self.private / "creds" / sandbox_id
        d.mkdir(parents=True, exist_ok=True)
        src = CredentialSource(d / results.ATTEMPT_CREDENTIALS)
        src.publish(creds, owner_uid=SANDBOX_UID)
        src.write_aws_config(d / "aws-config", self.endpoint.region,
                             source_path=f"{CREDS_IN}/{results.ATTEMPT_CREDENTIALS}")
        os.chmod(d, 0o755)
        return str(d)

    async def rotate_attempt_key(self, task_id: str, delay_s: float) -> dict:
        current = self.runs[task_id].current
        if current is None:
            return {"applied": False, "why": "the task had no running attempt at the planned time"}
        if self.keys is None:
            return {"applied": False, "why": "the store has no per-attempt keys (an external store): nothing to "
                                             "rotate at the store"}
        sandbox_id = current[1]
        t0 = time.time()
        got = await asyncio.to_thread(self.keys.rotate, sandbox_id)
        if got is None:
            return {"applied": False, "why": f"attempt {sandbox_id} holds no key (it ended meanwhile)"}
        old, new = got
        rotated_at = time.time()
        self.akids[sandbox_id] = new.access_key
        self.timeline("key_rotated", task=task_id, sandbox=sandbox_id, akid=new.access_key, old_akid=old.access_key)
        await asyncio.sleep(delay_s)
        d = self.private / "creds" / sandbox_id
        published = False
        if d.exists() and self.runs[task_id].current is not None and self.runs[task_id].current[1] == sandbox_id:
            CredentialSource(d / results.ATTEMPT_CREDENTIALS).publish(new, owner_uid=SANDBOX_UID)
            published = True
        return {"applied": True, "at": t0, "sandbox_id": sandbox_id, "rotated_at": rotated_at,
                "published_at": time.time() if published else None, "old_akid": old.access_key,
                "new_akid": new.access_key, "store_switch_ms": round((rotated_at - t0) * 1000, 1)}

    def _issued_secrets(self) -> tuple:
        """Every secret handed to a runner in this wave (model/effects keys, store secrets), for redaction by
        value in the evidence; never written anywhere."""
        out = self.registry.issued_keys()
        if getattr(self, "keys", None) is not None:
            out |= set(self.keys.issued_secrets)
        if getattr(self, "endpoint", None) is not None:
            out.add(self.endpoint.creds.secret_key)
        return tuple(sorted(out))

    def _revoke(self, sandbox_id: str, keep_files: bool = False) -> None:
        """The attempt's keys die: at the services and the store. `keep_files` leaves its (now dead) credential
        file in place, as on a frozen machine's disk: a thawed zombie then signs with its revoked key and is refused
        by the store, where it can be seen; the file goes when the zombie ends."""
        self.registry.revoke_attempt(sandbox_id)  # its model and effects key
        if self.keys is not None:
            self.keys.revoke(sandbox_id)
        if not keep_files:
            shutil.rmtree(self.private / "creds" / sandbox_id, ignore_errors=True)

    def _runner_env(self, task: dict, attempt: int, fence: int, sandbox_id: str,
                    workspace: str = WORKSPACE_IN) -> dict:
        """The runner contract's environment (docs/runner-contract.md), as seen inside the sandbox."""
        runner = self.plan["runner"]
        self.registry.register(task["task_id"], task["seed"], task["steps"], task["workload"])
        key = self.registry.attempt_key(task["task_id"], attempt, sandbox_id)  # dies with the attempt's lease
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
               "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", **runner["env"]}
        s3 = f"http://127.0.0.1:{PORT_S3}"
        env.update({
            "HOME": workspace,
            "TMPDIR": "/tmp",
            "AWS_CONFIG_FILE": f"{CREDS_IN}/aws-config",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ENDPOINT_URL_S3": s3,
            "AWS_DEFAULT_REGION": self.endpoint.region,
            "OPENAI_BASE_URL": f"http://127.0.0.1:{PORT_MODEL}/v1",
            "OPENAI_API_KEY": key,
            "OPENAI_MODEL": MODEL_ID,
            "SANDFLEET_CONTRACT": CONTRACT_VERSION,
            "SANDFLEET_TASK_ID": task["task_id"],
            "SANDFLEET_ATTEMPT": str(attempt),
            "SANDFLEET_FENCE": str(fence),
            "SANDFLEET_REPO": os.path.join(workspace, "repo"),
            "SANDFLEET_S3_ENDPOINT": s3,
            "SANDFLEET_S3_BUCKET": self.bucket,
            "SANDFLEET_S3_PREFIX": self.task_prefix(task["task_id"]),
            "SANDFLEET_EFFECTS_URL": f"http://127.0.0.1:{PORT_EFFECTS}/v1",
            "SANDFLEET_EFFECTS_KEY": key,
            "SANDFLEET_GRACE_S": "1.0",
        })
        if runner.get("workdir"):
            env["SANDFLEET_RUNNER_DIR"] = runner["workdir"]
        return env

    # ------------------------------------------------------------------ faults
    async def _fire(self, spec: FaultSpec, ctx: FaultContextImpl) -> None:
        fault = CATALOG[spec.fault_id]
        injected: dict = {}
        cleared: dict = {}
        tl = self.timeline
        try:
            if spec.trigger == "time" and ctx is not None and getattr(fault, "times_from_runner_start", False):
                # a seeded time after the task's runner started, not after its lease was taken (a container can
                # take a second or two to start; the kill would land before the runner did anything)
                await ctx.runner_started(spec.task_id)
            await asyncio.sleep(spec.at_s)
            if not drawn(spec):
                injected = {"applied": False, "why": f"probability draw ({spec.probability}) said no"}
                return
            injected = await fault.inject(spec, ctx)
            tl("fault_inject", task=spec.task_id, fault=spec.fault_id, instance=spec.instance,
               applied=bool(injected.get("applied")), why=injected.get("why", ""))
            if injected.get("applied"):
                await fault.settle(spec, ctx, injected)
        except asyncio.CancelledError:
            if not injected:
                why = ("the task ended" if self.harness_fault is None and not self.interrupted
                       else f"the wave stopped ({self._stop_why()})")
                injected = {"applied": False, "why": f"{why} before the planned time"}
        except Exception as exc:  # noqa: BLE001 - a crashed injection is `unknown`, never a pass
            injected = dict(injected, error=f"{type(exc).__name__}: {exc}")
        finally:
            try:
                cleared = await fault.clear(spec, ctx, injected)
            except Exception as exc:  # noqa: BLE001
                cleared = {"error": f"clear failed: {exc}"}
            receipt = fault.receipt(spec, injected, cleared)
            if "error" in injected:
                receipt.status, receipt.detail = UNKNOWN, f"injection crashed: {injected['error']}"
            self.receipts.append(receipt)
            tl("fault_clear", task=spec.task_id, fault=spec.fault_id, instance=spec.instance,
               status=receipt.status, detail=receipt.detail)

    # ------------------------------------------------------------------ health
    PROBE_S = 0.5  # processes and services: dead at once; not answering HTTP in health.answer_s, strikes times
    ACTOR_PROBE_S = 1.0  # actors: dead at once; no answer to a ping in health.actor_timeout_s, actor_strikes times

    def _part_lost(self, part: str, why: str, since: float | None = None) -> None:
        """A part of the harness died or stopped answering: record it, stop starting tasks, end the wave.

        Tasks it touched (any not ended before the part's last good probe) are graded `unknown`, never `fail`."""
        if self.harness_fault is not None:
            return
        hints = {"store": "the embedded S3 store (weed mini) failed: re-run the wave",
                 "fault proxy": "the fault proxy failed: re-run the wave",
                 "lease ledger": "the lease ledger actor failed: re-run the wave (check Ray's logs for why)",
                 "model endpoint": "the model endpoint failed: re-run the wave",
                 "effects service": "the effects service failed: re-run the wave",
                 "docker engine": "the docker engine stopped answering (a runner still running was ended by pid): "
                                  "check `docker info` (infra/dockerd-up starts it); once it answers, `sandfleet "
                                  "sweep` removes the wave's containers; then re-run the wave"}
        hint = hints.get(part, f"{part} failed: re-run the wave (check Ray's logs for why)")
        self.harness_fault = {"part": part, "why": why, "since_wall": since or time.time(), "hint": hint}
        self.timeline("harness_fault", **self.harness_fault)
        loop, main = getattr(self, "_loop", None), getattr(self, "_main", None)
        if loop is not None and main is not None and not main.done():
            main.cancel()

    def lost(self, part: str) -> bool:
        """Is `part` the one a harness fault named (calls to it would only wait for their timeouts)?"""
        return self.harness_fault is not None and self.harness_fault["part"].startswith(part)

    def _stop_why(self) -> str:
        if self.interrupted:
            return f"interrupted by {self.interrupted}"
        if self.harness_fault is not None:
            return f"harness fault: {self.harness_fault['part']}"
        return "stopped"

    @staticmethod
    async def _answers_http(host: str, port: int, timeout: float, path: str = "/") -> str | None:
        """None when something answers HTTP at host:port within `timeout` (any status); else why not. A stopped
        process still accepts connections (the kernel does): only an answer proves it alive."""
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            return f"no connection to {host}:{port} ({exc or 'timed out'})"
        try:
            w.write(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            await w.drain()
            return None if await asyncio.wait_for(r.read(1), timeout) else f"{host}:{port} closed without answering"
        except (OSError, asyncio.TimeoutError):
            return f"{host}:{port} took the connection but did not answer within {timeout:.0f} s (hung?)"
        finally:
            w.close()

    def _dead_process(self) -> tuple[str, str] | None:
        for part, proc in (("store", getattr(self.store, "proc", None)), ("fault proxy", self.proxy.proc)):
            if proc is not None and proc.poll() is not None:
                return part, f"pid {proc.pid} exited ({_exit_text(proc.returncode)})"
        for part, svc in (("model endpoint", self.model), ("effects service", self.effects)):
            if not svc.thread.is_alive():
                return part, "its server thread ended"
        return None

    async def _probe_services(self) -> dict[str, tuple[str, bool] | None]:
        """{part: None (healthy) or (why, certain)} for the store, proxy, model endpoint, effects service."""
        from urllib.parse import urlsplit

        dead = self._dead_process()
        if dead is not None:
            return {dead[0]: (dead[1], True)}
        u = urlsplit(self.endpoint.url)
        targets = {"store": (u.hostname, u.port or 80, "/"),
                   "fault proxy": ("127.0.0.1", self.proxy.control_port, "/stats"),  # answers 401 itself
                   "model endpoint": ("127.0.0.1", self.model.server.server_address[1], "/v1/models"),
                   "effects service": ("127.0.0.1", self.effects.server.server_address[1], "/")}
        got = await asyncio.gather(*(self._answers_http(h, port, self.cfg.health.answer_s, path)
                                     for h, port, path in targets.values()))
        out = {part: (why, False) if why else None for part, why in zip(targets, got)}
        if self.cfg.sandbox.backend == "docker":  # the engine every container of the wave depends on
            out["docker engine"] = await self._docker_answers()
        return out

    async def _docker_answers(self) -> tuple[str, bool] | None:
        def ping():
            from fleet.dockerapi import docker_client

            docker_client(self.cfg.health.answer_s).ping()

        try:
            await asyncio.wait_for(asyncio.to_thread(ping), self.cfg.health.answer_s + 1)
            return None
        except Exception as exc:  # noqa: BLE001 - refused, gone, or hung
            return f"no answer from the docker engine ({type(exc).__name__}: {str(exc)[:150]})", False

    async def _probe_actors(self) -> dict[str, tuple[str, bool] | None]:
        from ray.exceptions import RayActorError

        from fleet.host import awaitable

        actors = [("lease ledger", self.ledger)] + [(f"sandbox host {n}", h) for n, h in
                                                    zip(self.fleet.node_ids, self.hosts)
                                                    if n not in self.nodes_out]

        async def one(actor):
            try:
                await asyncio.wait_for(awaitable(actor.ping.remote()), self.cfg.health.actor_timeout_s)
                return None
            except RayActorError as exc:
                return f"the actor died ({str(exc).strip().splitlines()[0][:200]})", True
            except asyncio.TimeoutError:
                return f"no answer to a ping within {self.cfg.health.actor_timeout_s:g} s (hung?)", False

        got = await asyncio.gather(*(one(a) for _, a in actors))
        return {part: r for (part, _), r in zip(actors, got)}

    async def _watch(self, probe, every: float, strikes_needed: int) -> None:
        """Run `probe` every `every` s; a part certainly lost, or failing `strikes_needed` probes in a row, is a
        harness fault. Strikes and the last good time are kept per part."""
        strikes: dict[str, int] = {}
        last_ok = self._last_ok
        t0 = time.time()
        while self.harness_fault is None:
            await asyncio.sleep(every)
            for part, bad in (await probe()).items():
                if bad is None:
                    strikes[part] = 0
                    last_ok[part] = time.time()
                    continue
                why, certain = bad
                strikes[part] = strikes.get(part, 0) + 1
                self.timeline("part_probe_failed", part=part, why=why, strike=strikes[part])
                if certain or strikes[part] >= strikes_needed:
                    self._part_lost(part, why, since=last_ok.get(part, t0))
                    return

    async def _watch_parts(self) -> None:
        """Every part the wave started or uses, watched until the wave ends; and the host's load."""
        await asyncio.gather(self._watch(self._probe_services, self.PROBE_S, self.cfg.health.strikes),
                             self._watch(self._probe_actors, self.ACTOR_PROBE_S, self.cfg.health.actor_strikes),
                             self._sample_load())

    async def _sample_load(self) -> None:
        """Runnable tasks on the host every 0.5 s (`procs_running` of /proc/stat), for the grader: a runner silent
        while the host was overloaded is starved, not provably hung (`liveness` is then unknown)."""
        cores = os.cpu_count() or 1
        while self.harness_fault is None:
            try:
                line = next(x for x in Path("/proc/stat").read_text().splitlines() if x.startswith("procs_running"))
                self.load_samples.append({"t": round(time.time(), 3), "running": int(line.split()[1]) - 1,
                                          "cores": cores})  # minus this sampler itself
            except (OSError, StopIteration, ValueError):
                pass
            await asyncio.sleep(0.5)

    def _diagnose(self, exc: BaseException) -> bool:
        """An unexpected error in the wave loop: if a part is dead, it is the cause (a harness fault)."""
        dead = self._dead_process() if self.proxy is not None and self.model is not None else None
        if dead is None:
            return False
        self._part_lost(dead[0], f"{dead[1]} (seen as {type(exc).__name__}: {str(exc)[:200]})")
        return True

    async def _await_attempt(self, run: TaskRun, ref, sandbox_id: str, timeout: float) -> dict:
        """The attempt's result, or {"abandoned": ...} when a fault gave up on it first (the attempt then runs on
        as a zombie: its end is recorded as `zombie_end` when it comes). Raises asyncio.TimeoutError at the
        deadline and what the host raised (RayActorError) as before."""
        fut = asyncio.wrap_future(ref.future())
        ab = asyncio.ensure_future(run.abandon_ev.wait())
        try:
            done, _ = await asyncio.wait({fut, ab}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ab.cancel()
        if fut in done:
            return fut.result()
        if run.abandon is not None:
            def ended(f, sid=sandbox_id, task=run.plan["task_id"]):
                shutil.rmtree(self.private / "creds" / sid, ignore_errors=True)  # the zombie's dead key file
                try:
                    r = f.result()
                    self.timeline("zombie_end", task=task, sandbox=sid, exit_code=r.get("exit_code"),
                                  killed_by=r.get("killed_by"), ended_at=r.get("ended_at"))
                except BaseException as exc:  # noqa: BLE001
                    self.timeline("zombie_end", task=task, sandbox=sid, error=f"{type(exc).__name__}"[:100])
            fut.add_done_callback(ended)
            self.zombies.append(fut)
            return {"exit_code": None, "abandoned": run.abandon}
        raise asyncio.TimeoutError

    # ------------------------------------------------------------------ nodes
    def _place(self) -> str | None:
        """Least-loaded: the live sandbox node with the fewest attempts running (ties: the lowest number)."""
        live = [n for n in self.fleet.node_ids if n not in self.nodes_out and n not in self.fleet.down]
        if not live:
            return None
        return min(live, key=lambda n: (self.node_load.get(n, 0), self.fleet.node_ids.index(n)))

    async def lose_node(self, node: str, mode: str, grace_s: float, down_s: float, instance: str,
                        task_id: str) -> dict:
        """PK3. 'drain': the GCS is asked to drain the node for preemption with a deadline, every sandbox there
        gets the notice (as PK2's) and SIGTERM, and at the deadline the node is lost. 'abrupt': lost at once.
        Lost = its host process SIGKILLed (the sandboxes die with it) and its raylet killed; what the dead host
        could not remove (workspace mounts, cgroups) goes with the machine. The node comes back `down_s` later."""
        if node in self.nodes_out:
            return {"applied": False, "why": f"node {node} was already draining or lost"}
        if not [n for n in self.fleet.node_ids if n != node and n not in self.nodes_out]:
            return {"applied": False, "why": f"node {node} is the last live sandbox node; a wave keeps one to finish "
                                             "its tasks on"}
        self.nodes_out.add(node)  # from now on no attempt is placed there
        host = self.hosts[self.fleet.node_ids.index(node)]
        t_wait = time.monotonic()
        while time.monotonic() - t_wait < 60 and any(  # a reference run is the positive control: never interrupted
                r.current is not None and r.node == node and r.plan["role"] == "reference" for r in self.runs.values()):
            await asyncio.sleep(0.05)
        if any(r.current is not None and r.node == node and r.plan["role"] == "reference" for r in self.runs.values()):
            self.nodes_out.discard(node)
            return {"applied": False, "why": f"a reference run (the positive control) still ran on {node} after 60 s"}
        own = self.runs[task_id]
        if not (own.current is not None and own.node == node):
            self.nodes_out.discard(node)  # the task moved on or ended while a reference run finished there
            return {"applied": False, "why": f"the task's attempt was no longer on {node} when the node could go "
                                             "(it waited for a reference run there)"}
        on_node = sorted(sid for sid, n in self.placed.items() if n == node and
                         any(r.current is not None and r.current[1] == sid for r in self.runs.values()))
        out: dict = {"node": node, "mode": mode, "sandboxes": on_node,
                     "waited_for_references_s": round(time.monotonic() - t_wait, 3)}
        t0 = time.time()
        if mode == "drain":
            self.node_faults[node] = instance  # attempts that end now end because of the drain
            ok, err = await asyncio.to_thread(self.fleet.ray_session.drain_node, node, grace_s,
                                              f"sandfleet {instance}: spot preemption")
            out["drain"] = {"accepted": ok, "rejection": err, "deadline_s": grace_s}
            notice = {"action": "terminate", "grace_s": grace_s, "reason": f"node drain (sandfleet {instance})",
                      "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0 + grace_s))}
            noticed = await asyncio.gather(*(host.notify.remote(sid, notice) for sid in on_node),
                                           return_exceptions=True)
            out["noticed"] = sum(1 for n in noticed if isinstance(n, dict) and n.get("written"))
            for sid in on_node:  # SIGTERM only: the SIGKILL is the node going away at the deadline
                try:
                    await host.terminate.remote(sid)
                except Exception:  # noqa: BLE001
                    pass
            await asyncio.sleep(max(0.0, t0 + grace_s - time.time()))
        self.nodes_lost[node] = {"instance": instance, "mode": mode, "at": time.time()}
        self.node_events[node] = asyncio.Event()
        self.timeline("node_lost", node=node, fault=instance, mode=mode, sandboxes=on_node)
        lost = await asyncio.to_thread(self.fleet.lose_node, node)
        out.update(lost)
        out["reaped"] = await asyncio.to_thread(self._reap_node, node)
        out["applied"] = True
        self.node_tasks.append(asyncio.get_running_loop().create_task(self._bring_back(node, down_s, instance)))
        return out

    def _reap_node(self, node: str) -> list[str]:
        """The lost machine's leftovers on this (shared) machine: its sandboxes' cgroups and workspace mounts."""
        from fleet import cgroups
        from fleet.dockerapi import list_containers
        from fleet.backends import reap_leftover

        gone = []
        deadline = time.monotonic() + 10
        docker_sids = [c["sandbox"] for c in list_containers(self.wave_id) or []]  # not children of the host
        for sid in sorted({s for _, s in cgroups.list_sandboxes(self.wave_id)} | set(docker_sids)):
            if self.placed.get(sid) == node:
                reap_leftover(self.wave_id, sid)
                gone.append(sid)
        while time.monotonic() < deadline and any(self.placed.get(s) == node for _, s in
                                                  cgroups.list_sandboxes(self.wave_id)):
            time.sleep(0.05)
        return gone

    def _all_tasks_ended(self) -> bool:
        return all(r.finished_before or r.life.state in TASK_ENDED
                   for r in self.runs.values())

    async def _bring_back(self, node: str, down_s: float, instance: str) -> None:
        """The node comes back `down_s` after it was lost, or as soon as every task of the wave has ended: from
        then on nothing can run on it or miss it, and the wave would only wait (the node_back event says so)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + down_s
        while loop.time() < until and not self._all_tasks_ended():
            await asyncio.sleep(min(0.1, max(0.0, until - loop.time())))
        early = loop.time() < until
        try:
            back = await asyncio.to_thread(self.fleet.restore_node, node)
            back["down_s"] = round(time.time() - self.nodes_lost[node]["at"], 3)
            back["planned_down_s"] = round(down_s, 3)
            if early:
                back["cut_short"] = "every task of the wave had ended: nothing was left to run or to miss the node"
            self.node_back_info[node] = back
            self.timeline("node_back", fault=instance, **back)
        except Exception as exc:  # noqa: BLE001
            self.node_back_info[node] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            self.timeline("node_not_back", node=node, fault=instance, **self.node_back_info[node])
        finally:
            self.nodes_out.discard(node)
            self.nodes_lost.pop(node, None)
            self.node_faults.pop(node, None)
            self.node_events[node].set()

    async def node_back(self, node: str) -> dict:
        """Wait (bounded) until the lost node is back; the task that planned the fault ending meanwhile (which
        cancels its fault) does not cut the wait short: the fault's receipt says when the node came back."""
        ev = self.node_events.get(node)
        deadline = time.monotonic() + 120
        while ev is not None and not ev.is_set() and time.monotonic() < deadline:
            try:
                await asyncio.wait_for(ev.wait(), max(0.01, deadline - time.monotonic()))
            except (asyncio.CancelledError, asyncio.TimeoutError):
                continue
        return dict(self.node_back_info.get(node, {}), back=node not in self.fleet.down)

    # ------------------------------------------------------------------ tasks
    async def _run_task(self, run: TaskRun, sem: asyncio.Semaphore, on_change) -> None:
        from ray.exceptions import RayActorError

        task = run.plan
        tid = task["task_id"]
        tl = self.timeline
        if run.finished_before:
            return
        async with sem:
            loop = asyncio.get_running_loop()
            launched = loop.time()
            deadline = launched + self.cfg.deadline_s
            run.life.to(TaskState.RUNNING, "launched")
            tl("task_start", task=tid, seed=task["seed"], runner=task["runner"])
            ctx = FaultContextImpl(self)
            fired = (self.resumed or {}).get("fired", set())
            for f in task["faults"]:
                fspec, arm_of = FaultSpec(**f), getattr(CATALOG[f["fault_id"]], "attempt_arm", None)
                arm = arm_of(fspec) if arm_of and f["instance"] not in fired and drawn(fspec) else None
                if arm:
                    run.arms[f["instance"]] = {"arm": dict(arm), "future": loop.create_future()}
            self.fault_tasks[tid] = [asyncio.create_task(self._fire(FaultSpec(**f), ctx)) for f in task["faults"]
                                     if f["instance"] not in fired]
            final = TaskState.FAILED
            why = ""
            while True:
                if self.harness_fault is not None:
                    return  # the wave is ending on a harness fault: this task gets no end (graded unknown)
                if loop.time() >= deadline:
                    final, why = TaskState.DEADLINE, f"deadline {self.cfg.deadline_s}s"
                    break
                if run.attempts >= self.cfg.max_attempts:
                    final, why = TaskState.FAILED, f"max_attempts {self.cfg.max_attempts} reached"
                    break
                sandbox_id = results.sandbox_id(tid, run.attempts + 1)
                node = self._place()
                if node is None:  # every sandbox node is lost or draining: wait for one to come back
                    await asyncio.sleep(0.1)
                    continue
                host = self.hosts[self.fleet.node_ids.index(node)]
                self.node_load[node] = self.node_load.get(node, 0) + 1  # held from now: placements beside it spread
                try:
                    lease = await self.ledger.acquire.remote(self.lease_key(tid), node, sandbox_id,
                                                             self.cfg.lease_ttl_s)
                except RayActorError as exc:
                    self.node_load[node] -= 1
                    self._part_lost("lease ledger", f"the actor died ({str(exc).strip().splitlines()[0][:200]})")
                    return
                if lease is None:
                    self.node_load[node] -= 1
                    tl("lease_busy", task=tid)
                    await asyncio.sleep(min(1.0, self.cfg.lease_ttl_s / 2))
                    continue
                run.attempts += 1
                attempt, fence = lease["attempt"], lease["fence"]
                sdir = self.out.sandbox(sandbox_id)
                sdir.mkdir(parents=True, exist_ok=True)
                ws = str(self.private / "ws" / sandbox_id)
                fixture = workloads.get(task["workload"]).fixture(task["seed"])
                creds_dir = await asyncio.to_thread(self._attempt_credentials, tid, sandbox_id)
                sbc = self.cfg.sandbox
                spec = {"wave_id": self.wave_id, "sandbox_id": sandbox_id, "task_id": tid, "attempt": attempt,
                        "argv": self.plan["runner"]["command"],
                        "env": self._runner_env(task, attempt, fence, sandbox_id),
                        "state_dir": str(sdir), "workspace_mb": sbc.workspace_mb,
                        "memory_mb": sbc.memory_mb, "pids_max": sbc.pids_max, "cpu_shares": sbc.cpu_shares,
                        "cpu_quota": sbc.cpu_cores, "workspace_dir": ws,
                        "files": {f"repo/{p}": text for p, text in fixture.items()},
                        "ro_binds": self.binds, "hide": self.hide, "ro_mounts": {creds_dir: CREDS_IN},
                        "relays": self.relay_targets, "backend": sbc.backend, "image": sbc.image}
                tl("attempt_start", task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, node=node,
                   lease_acquired_at=lease.get("acquired_at"), akid=self.akids.get(sandbox_id))
                run.current, run.node = (host, sandbox_id), node
                self.placed[sandbox_id] = node
                self.registry.set_attempt(tid, attempt)
                arms = [a["arm"] for a in run.arms.values() if not a["future"].done()]
                ref = host.run_attempt.remote(spec, lease, self.cfg.lease_ttl_s, "repo", arms)
                result: dict = {}
                run.abandon, run.abandon_ev = None, asyncio.Event()
                try:
                    result = await self._await_attempt(run, ref, sandbox_id, max(0.1, deadline - loop.time()))
                except asyncio.CancelledError:  # the wave is stopping: the sweep ends this attempt's sandbox
                    tl("attempt_end", task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, exit_code=None,
                       killed_by="wave stopped", ended_at=time.time(), cause=f"the wave stopped ({self._stop_why()})")
                    raise
                except asyncio.TimeoutError:
                    try:
                        await host.kill.remote(sandbox_id, 1.0, "deadline")
                        result = await ref
                    except RayActorError as exc:
                        result = {"exit_code": None, "error": f"sandbox host lost: {exc}", "host_lost": True}
                except RayActorError as exc:
                    result = {"exit_code": None, "error": f"sandbox host lost: {exc}", "host_lost": True}
                finally:
                    run.current = None
                    self.node_load[node] -= 1
                    self.registry.set_attempt(tid, None)
                if self._settle_arms(run, sandbox_id, result.get("watches") or {}):
                    await asyncio.sleep(0)  # the fired fault records its injection before this attempt's end
                code = result.get("exit_code")
                if result.get("abandoned"):  # PK6: frozen past its lease; its lease runs out, its keys die now
                    ab = result["abandoned"]
                    await asyncio.to_thread(self._revoke, sandbox_id, True)
                    tl("attempt_end", task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, exit_code=None,
                       killed_by=ab["instance"], ended_at=ab["at"], node=node,
                       cause=f"killed: frozen, abandoned to run out its lease ({ab['instance']}); a zombie now")
                    on_change()
                    run.life.to(TaskState.RETRYING, f"attempt {attempt} abandoned (frozen)")
                    tl("task_retry", task=tid, after_attempt=attempt, exit_code=None)
                    run.life.to(TaskState.RUNNING, f"attempt {attempt + 1}")
                    continue
                if result.get("host_lost") and node in self.nodes_lost:
                    # PK3 took the node and this attempt with it: its lease is left to expire (no one renews it;
                    # a lost machine cannot say it is done); its key dies now
                    lost = self.nodes_lost[node]
                    tl("attempt_end", task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, exit_code=None,
                       killed_by=lost["instance"], ended_at=lost["at"], node=node,
                       cause=f"killed: node {node} lost ({lost['instance']}, {lost['mode']})")
                    await asyncio.to_thread(self._revoke, sandbox_id)
                    on_change()
                    run.life.to(TaskState.RETRYING, f"attempt {attempt}: node {node} lost")
                    tl("task_retry", task=tid, after_attempt=attempt, exit_code=None)
                    run.life.to(TaskState.RUNNING, f"attempt {attempt + 1}")
                    continue
                if result.get("host_lost"):
                    tl("attempt_end", task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, exit_code=None,
                       error=result["error"][:300], cause="harness fault: the sandbox host was lost")
                    self._part_lost(f"sandbox host {node}", "the actor died while it ran attempt "
                                    f"{sandbox_id} ({result['error'].strip().splitlines()[0][:200]})")
                    return
                if node in self.node_faults and not result.get("cause", "").startswith("killed"):
                    result["cause"] = (f"{result.get('cause') or f'exit {code}'} (node {node} draining for "
                                       f"preemption: {self.node_faults[node]})")
                try:
                    await self.ledger.release.remote(self.lease_key(tid), fence, None, f"exit {code}")
                except RayActorError as exc:
                    self._part_lost("lease ledger", f"the actor died ({str(exc).strip().splitlines()[0][:200]})")
                await asyncio.to_thread(self._revoke, sandbox_id)  # the lease ended: its key is dead
                captured = None
                if "artifact" in result:
                    captured = self._store_artifact(tid, attempt, result["artifact"])
                tl("attempt_end", task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id,
                   exit_code=code, killed_by=result.get("killed_by"), start_ms=result.get("start_ms"),
                   started_at=result.get("started_at"), ended_at=result.get("ended_at"),
                   error=result.get("error"), start_error=result.get("start_error"), artifact=captured,
                   cause=result.get("start_error") or result.get("cause") or result.get("error"),
                   events=result.get("events"))
                on_change()
                if result.get("harness_part"):  # the backend's engine failed under this attempt: the harness's
                    why = (result.get("start_error") or result.get("cause") or "")[:300]
                    self._part_lost(result["harness_part"], f"{why} (attempt {sandbox_id})",
                                    since=self._last_ok.get(result["harness_part"]))
                if self.harness_fault is not None:
                    return  # this attempt may have ended because of the fault: no verdict from it
                if result.get("start_error"):
                    final, why = TaskState.FAILED, result["start_error"]
                    break
                if code == 0:
                    final, why = TaskState.DONE, "runner exited 0"
                    break
                if result.get("killed_by") == "deadline":
                    final, why = TaskState.DEADLINE, f"deadline {self.cfg.deadline_s}s"
                    break
                run.life.to(TaskState.RETRYING, f"attempt {attempt} exit {code}")
                tl("task_retry", task=tid, after_attempt=attempt, exit_code=code)
                run.life.to(TaskState.RUNNING, f"attempt {attempt + 1}")
            run.life.to(final, why)
            for ft in self.fault_tasks[tid]:
                ft.cancel()
            await asyncio.gather(*self.fault_tasks[tid], return_exceptions=True)
            tl("task_end", task=tid, state=final.value, why=why, attempts=run.attempts,
               duration_s=round(loop.time() - launched, 3))
            on_change()

    @staticmethod
    def _settle_arms(run: TaskRun, sandbox_id: str, watches: dict) -> bool:
        """What the attempt's watches saw: a fired one hands its kill to its fault; the others carry the rest
        of their count to the next attempt. True if one fired."""
        fired = False
        for reason, w in watches.items():
            entry = run.arms.get(reason)
            if entry is None or entry["future"].done():
                continue
            if w.get("error"):
                entry["future"].set_result({"applied": None, "error": f"the watch crashed: {w['error']}",
                                            "sandbox_id": sandbox_id})
                fired = True
            elif w.get("fired"):
                entry["future"].set_result(dict(w, sandbox_id=sandbox_id))
                fired = True
            else:
                entry["arm"]["nth"] -= int(w.get("seen", 0))
        return fired

    def _store_artifact(self, tid: str, attempt: int, captured: dict) -> dict:
        """Write what the host read back from the workspace into a fresh `artifacts/<task>/`."""
        if captured.get("files") is None:
            return {"captured": False, "why": captured.get("why", "nothing captured")}
        m = write_artifact(self.out.artifact(tid), captured["files"],
                           {"task_id": tid, "attempt": attempt, "skipped": captured.get("skipped", [])})
        return {"captured": True, "digest": m["digest"], "files": len(m["files"]), "skipped": m["skipped"]}

    def _seed_cached_references(self) -> None:
        for t in self.plan["tasks"]:
            ref = t["reference"]
            if ref["cached"]:
                files, manifest = self.cache.get(ref["key"])
                write_artifact(self.out.artifact(ref["task_id"]), files,
                               {"task_id": ref["task_id"], "attempt": manifest.get("attempt"), "skipped": [],
                                "from_cache": ref["key"]})

    def _cache_references(self, result: dict) -> None:
        from cluster.artifacts import read_artifact

        for g in result.get("references", []):
            if g["checks"]["completed"]["verdict"] != grade.PASS:
                continue
            got = read_artifact(self.out.artifact(g["task_id"]))
            if got is not None:
                self.cache.put(g["reference_key"], got[0], {"task_id": g["task_id"], "wave_id": self.wave_id,
                                                            "attempt": got[1].get("attempt")})

    async def _run_all(self) -> None:
        # `concurrency` tasks at once; a reference run (a seed's uninterrupted positive control, when the cache
        # has none) takes a slot of its own beside them, so it runs alongside its task rather than before it
        # (not in a wave with a fault that takes a node: a node is never lost under a reference, so there the
        # references run first, in the tasks' slots)
        sem = asyncio.Semaphore(self.cfg.concurrency)
        beside = not any(getattr(CATALOG[f["fault_id"]], "takes_node", False)
                         for t in self.plan["tasks"] for f in t["faults"])
        slots = {"task": sem, "reference": asyncio.Semaphore(self.cfg.concurrency) if beside else sem}
        self.runs = {t["task_id"]: TaskRun(plan=t) for t in self.plan["references"] + self.plan["tasks"]}
        for tid, run in self.runs.items():
            if self.resumed is not None:
                run.finished_before = tid in self.resumed["finished"]
                run.attempts = self.resumed["attempts"].get(tid, 0)
        progress = None
        if self.show_progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), transient=False)
            progress.start()
            bar = progress.add_task(f"wave {self.wave_id}", total=len(self.runs), info="")

        def on_change():
            if progress is None:
                return
            done = sum(1 for r in self.runs.values() if r.life.state in TASK_ENDED)
            running = sum(1 for r in self.runs.values() if r.current is not None)
            attempts = sum(r.attempts for r in self.runs.values())
            applied = sum(1 for r in self.receipts if r.status == APPLIED)
            progress.update(bar, completed=done, info=f"running {running}  attempts {attempts}  faults applied "
                                                      f"{applied} of {len(self.receipts)} ended")

        self._loop, self._main = asyncio.get_running_loop(), asyncio.current_task()
        if self.interrupted:  # a signal came during set-up
            raise asyncio.CancelledError
        watch = asyncio.create_task(self._watch_parts())
        try:
            if (self.plan.get("enumerate") or {}).get("pending"):
                await asyncio.gather(*(self._run_task(r, slots[r.plan.get("role", "task")], on_change)
                                       for r in self.runs.values()))
                self._plan_boundaries()
                for t in self.plan["tasks"]:
                    self.runs[t["task_id"]] = TaskRun(plan=t)
                if progress is not None:
                    progress.update(bar, total=len(self.runs))
            await asyncio.gather(*(self._run_task(r, slots[r.plan.get("role", "task")], on_change)
                                   for r in self.runs.values() if r.life.state == TaskState.PENDING))
        finally:
            watch.cancel()
            await asyncio.wait({watch}, timeout=5)  # bounded: a probe never holds the wave's end
            for fts in self.fault_tasks.values():
                for ft in fts:
                    ft.cancel()
            await asyncio.gather(*(ft for fts in self.fault_tasks.values() for ft in fts), return_exceptions=True)
            if self.node_tasks:  # a lost node still on its way back: the sweep must see every node
                await asyncio.wait(self.node_tasks, timeout=120)
            if self.zombies:  # abandoned attempts end with their fault (bounded: the sweep ends any left)
                await asyncio.wait(self.zombies, timeout=30)
            if progress is not None:
                progress.stop()

    def _plan_boundaries(self) -> None:
        """Phase 2 of an enumerated wave: count the reference run's boundaries from what the harness logged."""
        ref = self.plan["references"][0]["task_id"]
        g = self.runs[ref]
        if g.life.state != TaskState.DONE and not g.finished_before:
            raise HarnessError(f"the uninterrupted run {ref} did not complete ({g.life.state.value}): there are "
                               "no boundaries to enumerate; see its runner.log")
        prefix = self.task_prefix(ref)
        writes = 0
        self.proxy.control().flush()
        for r in results.read_jsonl(self.out.proxy_requests):
            if (r.get("key") or "").startswith(prefix) and r.get("method") in ("PUT", "POST", "DELETE") \
                    and 200 <= (r.get("status") or 0) < 300:
                writes += 1
        counts = {"model_call": sum(1 for c in self.model.log.snapshot() if c["task"] == ref and c.get("delivered")),
                  "effect": sum(1 for e in self.effects.log.snapshot() if e["task"] == ref), "store_write": writes}
        self.plan["tasks"] = enumerate_tasks(self.plan, counts, self.cfg.boundaries)
        self.plan["enumerate"] = {"pending": False, "counts": counts, "tasks": len(self.plan["tasks"]),
                                  "sampled": self.cfg.boundaries}
        self._write_json(results.PLAN, self.plan)
        self.timeline("boundaries_enumerated", counts=counts, tasks=len(self.plan["tasks"]))
        for t in self.plan["tasks"]:
            self.registry.register(t["task_id"], t["seed"], t["steps"], t["workload"])

    # ------------------------------------------------------------------ teardown pieces
    def _clear_everything(self) -> None:
        """Belt and braces after the per-fault clears: no proxy rule survives the wave."""
        if self.lost("fault proxy"):
            self.timeline("proxy_rules_not_cleared", why="the fault proxy is lost; it is stopped instead")
        elif self.proxy is not None and self.proxy.proc is not None:
            try:
                left = self.proxy.control().close_all()
                if left:
                    self.timeline("proxy_rules_force_closed", rules=[r["rule_id"] for r in left])
            except Exception as exc:  # noqa: BLE001
                self.timeline("proxy_clear_failed", error=str(exc))

    def _final_sweep(self) -> None:
        """The sweep actor's last pass for this wave (after its settle window if anything still looks leaked);
        its report is `sweeper.json`. A lost sweep actor is recorded, never fatal: the host sweep ran already."""
        import ray

        sweeper = getattr(self.fleet, "sweeper", None) if self.fleet is not None else None
        if sweeper is None or self.ledger is None:
            return
        try:
            engine = self.harness_fault["why"][:200] if self.lost("docker engine") else None
            rep = ray.get(sweeper.final.remote(self.wave_id, engine), timeout=self.sweep_settle_s + 60)
        except Exception as exc:  # noqa: BLE001
            rep = {"wave_id": self.wave_id, "errors": [f"the sweep actor did not report: {type(exc).__name__}: "
                                                       f"{str(exc)[:200]}"], "unavailable": True}
        self._write_json(results.SWEEPER, rep)
        self.timeline("sweep_actor", scans=rep.get("scans"), leaked=len(rep.get("leaked") or []),
                      reaped=len(rep.get("reaped") or []), dangling=len(rep.get("dangling_leases") or []),
                      expired_but_running=len(rep.get("expired_but_running") or []), errors=rep.get("errors"))

    def _sweep(self) -> dict:
        """End what is left of the wave and record it. A stopped wave (signal, harness fault) ends all its
        sandboxes and leases; otherwise sandboxes with no active lease are leaks. A host or ledger that is
        gone does not stop the sweep: the driver then reaps the wave's sandboxes by their markers itself."""
        import ray

        from fleet import cgroups
        from fleet.backends import reap_leftover

        stopping = self.interrupted or (self.harness_fault and f"harness fault ({self.harness_fault['part']})")
        problems = []
        for part, actor in [("lease ledger", self.ledger)] + [(f"sandbox host {n}", h) for n, h in
                                                               zip(self.fleet.node_ids, self.hosts)
                                                               if n not in self.fleet.down]:
            if self.lost(part):  # hung or dead: end it now rather than wait for each call's timeout
                problems.append(f"{part} lost (harness fault)")
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001
                    pass
        try:
            if self.lost("lease ledger"):
                raise RuntimeError("the lease ledger is lost")
            active = [l for l in ray.get(self.ledger.active.remote(), timeout=30)
                      if l["task_id"].startswith(self.wave_id + "/")]
        except Exception as exc:  # noqa: BLE001
            problems.append(f"ledger: {type(exc).__name__}: {str(exc)[:200]}")
            active = None
        live = [l["sandbox_id"] for l in active or []]
        if stopping:  # the wave is being stopped: every sandbox of it goes and its leases end
            for n, h in zip(self.fleet.node_ids, self.hosts):
                if self.lost(f"sandbox host {n}") or n in self.fleet.down:
                    continue
                engine = self.harness_fault["why"][:200] if self.lost("docker engine") else None
                try:
                    ray.get(h.cancel_wave.remote(self.wave_id, 20.0, engine), timeout=30)
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"cancel on host: {type(exc).__name__}")
            for lease in active or []:
                try:
                    ray.get(self.ledger.release.remote(lease["task_id"], lease["fence"], None,
                                                       f"wave stopped: {stopping}"), timeout=10)
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"release {lease['task_id']}: {type(exc).__name__}")
                    break
            live = []
        reports = []
        for n, h in zip(self.fleet.node_ids, self.hosts):
            if self.lost(f"sandbox host {n}") or n in self.fleet.down:
                continue
            try:
                reports.append(ray.get(h.sweep.remote(self.wave_id, live), timeout=60))
            except Exception as exc:  # noqa: BLE001
                problems.append(f"sweep on {n}: {type(exc).__name__}: {str(exc)[:200]}")
        by_driver = []
        if problems:  # a part is gone: reap the wave's sandboxes here, by marker (same machine)
            for wid, sid in cgroups.list_sandboxes(self.wave_id):
                try:
                    by_driver.append(reap_leftover(wid, sid))
                except Exception as exc:  # noqa: BLE001
                    by_driver.append({"sandbox_id": sid, "error": str(exc)})
        out = {"wave_id": self.wave_id, "active_leases": active or [], "nodes": reports,
               "leaked": [r for rep in reports for r in rep["reaped"]], "problems": problems,
               "reaped_by_driver": by_driver}
        self.out.sandbox_sweep.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
        if problems and not self.harness_fault:
            raise HarnessError("; ".join(problems))
        return out

    def _snapshot_store(self) -> None:
        """The store audit (storage/audit.py, a second client): every object read back and checked against
        what its writer sent, keys outside task prefixes, incomplete uploads reported then aborted."""
        from storage.audit import audit, client_for

        log = []
        try:
            if not self.lost("fault proxy"):
                self.proxy.control().flush()
        except (RuntimeError, OSError):
            pass
        try:
            self.out.proxy_requests.stat()  # no log at all: the audit cannot match writes to writers
            log += results.read_jsonl(self.out.proxy_requests, skip_bad=True)
        except OSError:
            log = None
        creds = self.endpoint.creds
        mc = client_for(self.endpoint.url, creds.access_key, creds.secret_key,
                        getattr(self.endpoint, "region", None) or "us-east-1")
        out = audit(mc, self.bucket, self.wave_id, sorted(self.runs), log)
        self.out.store_audit.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))

    def _write_json(self, name: str, data) -> None:
        (self.dir / name).write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str))

    def _teardown(self) -> None:
        import ray

        errors = []
        elog = getattr(getattr(self.fleet, "ray_session", None), "error_log", None)
        if elog and os.path.exists(elog):  # what Ray said about the nodes it lost (PK3)
            shutil.copyfile(elog, self.out.ray_errors)
        if getattr(self, "fenced_log", None) is not None:
            self.fenced_log.close()
        with open(self.out.host_load, "ab") as f:  # appended: a resumed wave keeps the first part
            f.write(b"".join(orjson.dumps(x) + b"\n" for x in self.load_samples))
        if self.ledger is not None:
            try:
                try:
                    if self.lost("lease ledger"):
                        raise RuntimeError("the lease ledger actor is lost")
                    dump = ray.get(self.ledger.dump.remote(), timeout=60)
                except Exception:  # noqa: BLE001 - read its SQLite file directly (WAL: consistent after a kill)
                    from fleet.ledger import LeaseLedger

                    led = LeaseLedger(os.path.join(self.fleet.state_dir, results.LEDGER_DB))
                    dump = led.dump()
                    led.close()
                with open(self.out.ledger, "wb") as f:
                    mine = self.wave_id + "/"
                    for row in dump["leases"]:
                        if row["task_id"].startswith(mine):
                            f.write(orjson.dumps({"kind": "lease", **row}) + b"\n")
                    for row in dump["history"]:
                        if row["task_id"].startswith(mine):
                            f.write(orjson.dumps({"kind": "event", **row}) + b"\n")
            except Exception as exc:  # noqa: BLE001
                errors.append(f"ledger dump: {exc}")
        try:  # how the hosts' lease renewals went (cumulative over a lent fleet's life)
            self.timeline("lease_renewals", hosts=ray.get([h.renewals.remote() for h in self.hosts], timeout=10))
        except Exception:  # noqa: BLE001 - a lost host has no figures
            pass
        counts = {}
        for key, svc in (("model", self.model), ("effects", self.effects)):
            if svc is not None:
                per: dict = {}
                for r in svc.log.snapshot():
                    per[r["task"]] = per.get(r["task"], 0) + 1
                counts[key] = per
        if counts:
            self.timeline("service_counts", **counts)
        for svc in (self.model, self.effects):
            if svc is not None:
                try:
                    svc.stop()
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"stop {type(svc).__name__}: {exc}")
        for name, part in (("fault proxy", self.proxy), ("store", self.store)):
            if part is not None:
                # a lost part gets no grace, and neither does the wave's own store: the audit has read it back,
                # its data dir goes with the private dir below, and weed's graceful stop took 1.2-5 s per wave
                # (a SIGKILLed weed keeps its committed objects anyway: DESIGN.md, "Real parts")
                try:
                    part.stop(grace_s=0.0) if self.lost(name) or name == "store" else part.stop()
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"stop {type(part).__name__}: {exc}")
        if self.own_fleet and self.fleet is not None:
            try:
                self.fleet.stop()
            except Exception as exc:  # noqa: BLE001
                errors.append(f"fleet stop: {exc}")
        shutil.rmtree(self.private, ignore_errors=True)
        from fleet import cgroups

        cgroups.leave_harness(getattr(self, "harness_cg", None))
        if errors:
            self.timeline("teardown_errors", errors=errors)

    # ------------------------------------------------------------------ signals
    def _install_signal_handlers(self) -> dict:
        """SIGINT/SIGTERM stop the wave in order (kill sandboxes, release leases, clear faults, stop the
        parts, grade what finished); a second one stops at once, still leaving nothing running."""
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: dict) -> None:
        import signal

        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum, frame) -> None:
        import signal

        name = signal.Signals(signum).name
        if self.interrupted:
            self._emergency_stop(name)
        self.interrupted = name
        sys.stderr.write(f"\n{name}: stopping wave {self.wave_id} in order (again to stop at once)...\n")
        loop, main = getattr(self, "_loop", None), getattr(self, "_main", None)
        if loop is not None and main is not None and not loop.is_closed():
            loop.call_soon_threadsafe(main.cancel)

    def _emergency_stop(self, name: str) -> None:
        """Second signal: kill what this wave started, by PID and by its markers, and exit now."""
        from fleet.backends import reap_leftover
        from fleet import cgroups

        for part in (self.proxy, self.store):
            proc = getattr(part, "proc", None)
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(5)
        if self.store is not None:
            self.store.remove_sockets()
        for wid, sid in cgroups.list_sandboxes(self.wave_id):
            try:
                reap_leftover(wid, sid)
            except Exception:  # noqa: BLE001
                pass
        if self.own_fleet and self.fleet is not None:
            try:
                self.fleet.stop()
            except Exception:  # noqa: BLE001
                pass
        cgroups.leave_harness(getattr(self, "harness_cg", None))
        shutil.rmtree(self.private, ignore_errors=True)
        try:
            self.timeline("wave_stopped_at_once", signal=name)
            self.out.summary.write_text(
                f"# Wave {self.wave_id}\n\n**Stopped at once by a second {name}**: not graded. What was stored "
                f"so far can be graded with `sandfleet grade {self.dir}` (unfinished tasks are unknown).\n")
        except Exception:  # noqa: BLE001
            pass
        sys.stderr.write(f"{name} again: stopped at once; results so far in {self.dir}\n")
        os._exit(130 if name == "SIGINT" else 143)

    # ------------------------------------------------------------------ resume
    def _prepare_resume(self) -> None:
        """Read what the dead driver recorded: tasks that ended keep their results; attempts it left running
        are closed in the timeline (they were reaped); faults that fired keep their receipts."""
        try:
            events = results.read_jsonl(self.out.timeline)  # a torn last line is the dead driver's last write
        except ValueError as exc:
            raise HarnessError(f"{exc}: the timeline is damaged, cannot resume") from None
        if not events or events[0].get("event") != "wave_start":
            raise HarnessError(f"{self.out.timeline} has no wave_start: not a wave that ran")
        if any(e["event"] == "wave_end" for e in events):
            raise HarnessError(f"wave {self.wave_id} already ended; grade it again with `sandfleet grade {self.dir}`")
        finished = {e["task"] for e in events if e["event"] == "task_end"}
        attempts: dict[str, int] = {}
        open_attempts = {}
        for e in events:
            if e["event"] == "attempt_start":
                attempts[e["task"]] = attempts.get(e["task"], 0) + 1
                open_attempts[e["sandbox"]] = e
            elif e["event"] == "attempt_end":
                open_attempts.pop(e.get("sandbox"), None)
        fired = {}
        for e in events:
            if e["event"] == "fault_clear":
                fired[e["instance"]] = {"fault_id": e["fault"], "instance": e["instance"], "task_id": e["task"],
                                        "status": e["status"], "target": {}, "detail": e.get("detail", ""),
                                        "fired_at": None, "cleared_at": e["wall"],
                                        "evidence": {"from": "the timeline of the driver that died"}}
        self.prior_receipts = list(fired.values())
        self.resumed = {"finished": finished, "attempts": attempts, "fired": set(fired)}
        self.timeline = Timeline(self.out.timeline, since_wall=events[0]["wall"])
        now = time.time()
        for sid, e in open_attempts.items():  # reaped by the resume's sweep: they ended with the driver
            self.timeline("attempt_end", task=e["task"], attempt=e["attempt"], fence=e["fence"], sandbox=sid,
                          exit_code=None, killed_by="driver died", ended_at=now, started_at=e["wall"],
                          cause="the wave's driver died; the attempt was reaped when the wave resumed")
        unfinished = sorted(t["task_id"] for t in self.plan["references"] + self.plan["tasks"]
                            if t["task_id"] not in finished)
        self.timeline("wave_resumed", finished=sorted(finished), unfinished=unfinished,
                      closed_attempts=sorted(open_attempts), faults_fired_before=sorted(fired))

    # ------------------------------------------------------------------ main
    def run(self) -> dict:
        """Run the wave; returns the wave verdict summary. Raises HarnessError on set-up failure."""
        if self.resume_plan is not None:
            self.plan = self.resume_plan
            self._prepare_resume()
        else:
            self.dir.mkdir(parents=True, exist_ok=False)
            results.link_latest(self.results_root, self.dir)
            self.plan = (replay_plan(self.replay[0], self.replay[1], self.wave_id, self.cache) if self.replay
                         else build_plan(self.cfg, self.wave_id, self.cache))
            self._write_json(results.PLAN, self.plan)
            self._seed_cached_references()
            self.timeline = Timeline(self.out.timeline)
        harness_error = None
        t_wave = time.perf_counter()
        previous = self._install_signal_handlers()
        try:
            if self.resumed is None:
                self.timeline("wave_start", wave=self.wave_id, tasks=self.cfg.tasks,
                              runner=self.plan["runner"]["name"], faults=self.cfg.faults, seed=self.cfg.seed)
            self._setup()
            self._install_signal_handlers()  # again: ray.init installs its own SIGTERM handler (it aborts)
            self.timeline("parts_ready", store=self.endpoint.url, proxy=self.proxy.url, model=self.model.url,
                          effects=self.effects.url, pids=self.part_pids,
                          **self.figures)
            asyncio.run(self._run_all())
        except asyncio.CancelledError:
            if self.harness_fault is not None and not self.interrupted:
                f = self.harness_fault
                harness_error = f"harness fault: {f['part']}: {f['why']}. {f['hint']}"
            else:
                self.timeline("wave_interrupted", signal=self.interrupted)
        except Exception as exc:  # noqa: BLE001
            if self.interrupted:
                self.timeline("wave_interrupted", signal=self.interrupted, during=f"{type(exc).__name__}: {exc}")
            elif self.harness_fault is not None or self._diagnose(exc):
                f = self.harness_fault
                harness_error = f"harness fault: {f['part']}: {f['why']}. {f['hint']}"
            else:
                harness_error = f"{type(exc).__name__}: {exc}"
                self.timeline("harness_error", error=harness_error)
        finally:
            if harness_error is None and self.harness_fault is not None and not self.interrupted:
                f = self.harness_fault  # the wave loop ended by itself after the fault: the fault is the cause
                harness_error = f"harness fault: {f['part']}: {f['why']}. {f['hint']}"
            if self.timeline:
                self._clear_everything()
                try:
                    if self.ledger is not None:
                        self._sweep()
                except Exception as exc:  # noqa: BLE001
                    harness_error = harness_error or f"sweep failed: {exc}"
                    self.timeline("harness_error", error=f"sweep: {exc}")
                self._final_sweep()
                try:
                    if self.endpoint is not None and self.runs and not self.lost("store"):
                        self._snapshot_store()  # (a lost store has nothing to read back: the fault says so)
                except Exception as exc:  # noqa: BLE001
                    harness_error = harness_error or f"store snapshot failed: {exc}"
                    self.timeline("harness_error", error=f"store snapshot: {exc}")
                self._write_json(results.FAULTS, self.prior_receipts + [r.to_dict() for r in self.receipts])
                self._teardown()
                self.figures["wave_wall_s"] = round(time.perf_counter() - t_wave, 3)
                self.timeline("wave_end", harness_error=harness_error, interrupted=self.interrupted,
                              **self.figures)
                self.timeline.close()
            self._restore_signal_handlers(previous)
        result = grade.grade_wave(self.dir, secrets=self._issued_secrets())
        report.write_summary(self.dir, result)
        try:
            self._cache_references(result)
        except OSError as exc:
            result.setdefault("notes", []).append(f"reference cache not written: {exc}")
        if harness_error:
            result["harness_error"] = harness_error
        return result
