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
import shutil
import sys
import time
from pathlib import Path

import orjson

from cluster import grade, report, results
from cluster.artifacts import ReferenceCache, write_artifact
from cluster.config import WaveConfig
from cluster.raycluster import FleetSession
from cluster.wave.access import (CONTRACT_VERSION, CREDS_IN, PORT_EFFECTS, PORT_MODEL, PORT_S3,  # noqa: F401
                                 RUNNERS_DIR, Access, runtime_binds)
from cluster.wave.context import WaveContext
from cluster.wave.errors import HarnessError
from cluster.wave.health import Health
from cluster.wave.injector import Injector
from cluster.wave.nodes import Nodes
from cluster.wave.parts import Parts, check_ray_address, preflight  # noqa: F401
from cluster.wave.plan import (REF, build_plan, enumerate_tasks, new_wave_id, placement,  # noqa: F401
                               replay_plan)
from cluster.wave.timeline import TaskRun, Timeline
from faults.base import APPLIED, CATALOG, FaultSpec
from faults.planner import drawn
from fleet.lifecycle import TASK_ENDED, TaskState
from fleet import workloads
from fleet.effects import EffectsService
from fleet.model_endpoint import ModelEndpoint
from fleet.services import CallLog
from storage.credentials import Credentials
from storage.keys import ScopedKeys
from storage.proxy import ProxyProcess
from storage.store import EmbeddedStore, StoreEndpoint, ensure_bucket


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
        self.parts = Parts(fleet=fleet)
        self.cache = ReferenceCache(self.results_root)
        self.own_fleet = fleet is None
        self.runs: dict[str, TaskRun] = {}  # filled in place: the rooms hold this dict
        self.fault_tasks: dict[str, list[asyncio.Task]] = {}
        self.zombies: list = []  # futures of abandoned attempts (PK6) still running
        self.timeline: Timeline | None = None
        self.figures: dict = {}
        self.interrupted: str | None = None
        self.resumed: dict | None = None  # what a resumed wave kept: finished tasks, attempts, fired faults
        self.prior_receipts: list[dict] = []
        # the rooms (cluster/wave/), made once the timeline is open
        self.health: Health | None = None
        self.nodes: Nodes | None = None
        self.access: Access | None = None
        self.injector: Injector | None = None

    def _rooms(self) -> None:
        self.nodes = Nodes(self.parts, self.runs, self.timeline, self.wave_id, self._all_tasks_ended)
        self.health = Health(self.cfg, self.timeline, self.parts, self.nodes, self._cancel_main)
        self.access = Access(self.parts, self.wave_id, self.private, self.plan["runner"], self.timeline)
        self.injector = Injector(self.timeline, lambda: None if self.harness_fault is None and not self.interrupted
                                 else self._stop_why())

    @property
    def harness_fault(self) -> dict | None:
        return self.health.harness_fault if self.health is not None else None

    def lost(self, part: str) -> bool:
        return self.health is not None and self.health.lost(part)

    def _cancel_main(self) -> None:
        loop, main = getattr(self, "_loop", None), getattr(self, "_main", None)
        if loop is not None and main is not None and not main.done():
            main.cancel()

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
            self.parts.endpoint = StoreEndpoint(url=s.url, creds=Credentials(s.access_key, s.secret_key))
        else:
            self.parts.store = EmbeddedStore(self.private / "store")
            self.parts.endpoint = self.parts.store.launch()
        self.parts.proxy = ProxyProcess(self.parts.endpoint.url, str(self.out.proxy_requests)).launch()
        self.parts.model = ModelEndpoint(self.parts.registry, think_ms=self.cfg.workload.think_ms,
                                   log_path=self.out.model_calls).start()
        self.parts.effects = EffectsService(self.parts.registry, log_path=self.out.effects).start()
        self.parts.fenced_log = CallLog(self.out.fenced)  # calls refused because their attempt was fenced
        self.parts.model.fenced = self.parts.effects.fenced = self.parts.fenced_log
        self.binds, self.hide = runtime_binds(self.plan["runner"], [self.results_root, self.private])
        for t in self.plan["tasks"] + self.plan["references"]:
            self.parts.registry.register(t["task_id"], t["seed"], t["steps"], t["workload"])
        if self.resumed is not None:  # the services carry on from what their logs recorded
            self.parts.model.log.preload(self.out.model_calls)
            self.parts.effects.preload(self.out.effects)
        if self.parts.fleet is None:  # a lent fleet is already running: nothing to time
            t = time.perf_counter()
            # a private Ray's temp dir is recorded in the wave's private dir: a sweep after a dead driver ends
            # that Ray's processes too (its path is short: Ray's unix socket paths must fit in 107 bytes)
            ray_tmp = f"/tmp/sfray-{hashlib.sha256(self.wave_id.encode()).hexdigest()[:10]}"
            if self.cfg.address == "local":
                (self.private / results.RAY_RECORD).write_bytes(orjson.dumps({"tmpdir": ray_tmp}))
            self.parts.fleet = FleetSession(self.cfg.address, state_dir=str(self.private / "fleet"),
                                      ray_tmpdir=ray_tmp if self.cfg.address == "local" else None,
                                      nodes=self.cfg.nodes)
            os.makedirs(self.parts.fleet.state_dir, exist_ok=self.resumed is not None)
            self.parts.fleet.start()
            self.figures["fleet_start_s"] = round(time.perf_counter() - t, 3)
        else:
            replaced = self.parts.fleet.heal()  # a lent fleet may have lost an actor in an earlier wave
            if replaced:
                self.timeline("fleet_healed", replaced=replaced)
        if self.parts.store is not None:
            self.parts.store.wait_ready()
        self.figures["store_start_s"] = round(time.perf_counter() - t_store, 3)  # from its launch until it answered
        ensure_bucket(self.parts.endpoint, self.bucket)
        self.parts.proxy.wait_ready()
        # per-attempt keys scoped to the task's prefix, at the store (embedded store only)
        if self.parts.store is not None:
            self.parts.keys = ScopedKeys(self.parts.store, self.parts.endpoint.creds)
        # the only ways out of a sandbox's network namespace: loopback listeners relayed to these services
        self.relay_targets = {PORT_S3: f"127.0.0.1:{self.parts.proxy.port}",
                              PORT_MODEL: f"127.0.0.1:{self.parts.model.server.server_address[1]}",
                              PORT_EFFECTS: f"127.0.0.1:{self.parts.effects.server.server_address[1]}"}
        self.parts.ledger, self.parts.hosts = self.parts.fleet.ledger, self.parts.fleet.hosts
        import ray

        # the sweep actor watches the wave from now on: a sandbox alive with no lease for longer than the settle
        # window is a leak it reaps (long enough for a PK6 zombie's observation and a host's clean-up)
        self.sweep_settle_s = max(10.0, 2 * self.cfg.lease_ttl_s)
        ray.get(self.parts.fleet.sweeper.watch.remote(self.wave_id, self.sweep_settle_s), timeout=60)
        self.part_pids = {"store": getattr(getattr(self.parts.store, "proc", None), "pid", None),
                          "fault proxy": self.parts.proxy.proc.pid, "driver": os.getpid(),
                          "lease ledger": ray.get(self.parts.ledger.ping.remote(), timeout=60),
                          "sandbox hosts": [i["pid"] for i in self.parts.fleet.host_info]}

    def _stop_why(self) -> str:
        if self.interrupted:
            return f"interrupted by {self.interrupted}"
        if self.harness_fault is not None:
            return f"harness fault: {self.harness_fault['part']}"
        return "stopped"

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
                shutil.rmtree(self.access.creds_dir(sid), ignore_errors=True)  # the zombie's dead key file
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

    def _all_tasks_ended(self) -> bool:
        return all(r.finished_before or r.life.state in TASK_ENDED
                   for r in self.runs.values())

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
            ctx = WaveContext(self.wave_id, self.runs, self.parts, self.access, self.nodes, self.health, self.out)
            fired = (self.resumed or {}).get("fired", set())
            for f in task["faults"]:
                fspec, arm_of = FaultSpec(**f), getattr(CATALOG[f["fault_id"]], "attempt_arm", None)
                arm = arm_of(fspec) if arm_of and f["instance"] not in fired and drawn(fspec) else None
                if arm:
                    run.arms[f["instance"]] = {"arm": dict(arm), "future": loop.create_future()}
            self.fault_tasks[tid] = [asyncio.create_task(self.injector.fire(FaultSpec(**f), ctx))
                                     for f in task["faults"] if f["instance"] not in fired]
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
                node = self.nodes.place()
                if node is None:  # every sandbox node is lost or draining: wait for one to come back
                    await asyncio.sleep(0.1)
                    continue
                host = self.parts.hosts[self.parts.fleet.node_ids.index(node)]
                self.nodes.load[node] = self.nodes.load.get(node, 0) + 1  # held from now: placements beside it spread
                try:
                    lease = await self.parts.ledger.acquire.remote(self.lease_key(tid), node, sandbox_id,
                                                             self.cfg.lease_ttl_s)
                except RayActorError as exc:
                    self.nodes.load[node] -= 1
                    self.health.part_lost("lease ledger", f"the actor died ({str(exc).strip().splitlines()[0][:200]})")
                    return
                if lease is None:
                    self.nodes.load[node] -= 1
                    tl("lease_busy", task=tid)
                    await asyncio.sleep(min(1.0, self.cfg.lease_ttl_s / 2))
                    continue
                run.attempts += 1
                attempt, fence = lease["attempt"], lease["fence"]
                sdir = self.out.sandbox(sandbox_id)
                sdir.mkdir(parents=True, exist_ok=True)
                ws = str(self.private / "ws" / sandbox_id)
                fixture = workloads.get(task["workload"]).fixture(task["seed"])
                creds_dir = await asyncio.to_thread(self.access.attempt_credentials, tid, sandbox_id)
                sbc = self.cfg.sandbox
                spec = {"wave_id": self.wave_id, "sandbox_id": sandbox_id, "task_id": tid, "attempt": attempt,
                        "argv": self.plan["runner"]["command"],
                        "env": self.access.runner_env(task, attempt, fence, sandbox_id),
                        "state_dir": str(sdir), "workspace_mb": sbc.workspace_mb,
                        "memory_mb": sbc.memory_mb, "pids_max": sbc.pids_max, "cpu_shares": sbc.cpu_shares,
                        "cpu_quota": sbc.cpu_cores, "workspace_dir": ws,
                        "files": {f"repo/{p}": text for p, text in fixture.items()},
                        "ro_binds": self.binds, "hide": self.hide, "ro_mounts": {creds_dir: CREDS_IN},
                        "relays": self.relay_targets, "backend": sbc.backend, "image": sbc.image}
                tl("attempt_start", task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, node=node,
                   lease_acquired_at=lease.get("acquired_at"), akid=self.access.akids.get(sandbox_id))
                run.current, run.node = (host, sandbox_id), node
                self.nodes.placed[sandbox_id] = node
                self.parts.registry.set_attempt(tid, attempt)
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
                    self.nodes.load[node] -= 1
                    self.parts.registry.set_attempt(tid, None)
                if Injector.settle_arms(run, sandbox_id, result.get("watches") or {}):
                    await asyncio.sleep(0)  # the fired fault records its injection before this attempt's end
                code = result.get("exit_code")
                if result.get("abandoned"):  # PK6: frozen past its lease; its lease runs out, its keys die now
                    ab = result["abandoned"]
                    await asyncio.to_thread(self.access.revoke, sandbox_id, True)
                    tl("attempt_end", task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, exit_code=None,
                       killed_by=ab["instance"], ended_at=ab["at"], node=node,
                       cause=f"killed: frozen, abandoned to run out its lease ({ab['instance']}); a zombie now")
                    on_change()
                    run.life.to(TaskState.RETRYING, f"attempt {attempt} abandoned (frozen)")
                    tl("task_retry", task=tid, after_attempt=attempt, exit_code=None)
                    run.life.to(TaskState.RUNNING, f"attempt {attempt + 1}")
                    continue
                if result.get("host_lost") and node in self.nodes.lost:
                    # PK3 took the node and this attempt with it: its lease is left to expire (no one renews it;
                    # a lost machine cannot say it is done); its key dies now
                    lost = self.nodes.lost[node]
                    tl("attempt_end", task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, exit_code=None,
                       killed_by=lost["instance"], ended_at=lost["at"], node=node,
                       cause=f"killed: node {node} lost ({lost['instance']}, {lost['mode']})")
                    await asyncio.to_thread(self.access.revoke, sandbox_id)
                    on_change()
                    run.life.to(TaskState.RETRYING, f"attempt {attempt}: node {node} lost")
                    tl("task_retry", task=tid, after_attempt=attempt, exit_code=None)
                    run.life.to(TaskState.RUNNING, f"attempt {attempt + 1}")
                    continue
                if result.get("host_lost"):
                    tl("attempt_end", task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, exit_code=None,
                       error=result["error"][:300], cause="harness fault: the sandbox host was lost")
                    self.health.part_lost(f"sandbox host {node}", "the actor died while it ran attempt "
                                    f"{sandbox_id} ({result['error'].strip().splitlines()[0][:200]})")
                    return
                if node in self.nodes.faults and not result.get("cause", "").startswith("killed"):
                    result["cause"] = (f"{result.get('cause') or f'exit {code}'} (node {node} draining for "
                                       f"preemption: {self.nodes.faults[node]})")
                try:
                    await self.parts.ledger.release.remote(self.lease_key(tid), fence, None, f"exit {code}")
                except RayActorError as exc:
                    self.health.part_lost("lease ledger", f"the actor died ({str(exc).strip().splitlines()[0][:200]})")
                await asyncio.to_thread(self.access.revoke, sandbox_id)  # the lease ended: its key is dead
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
                    self.health.part_lost(result["harness_part"], f"{why} (attempt {sandbox_id})",
                                    since=self.health.last_ok.get(result["harness_part"]))
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
        self.runs.clear()
        self.runs.update({t["task_id"]: TaskRun(plan=t) for t in self.plan["references"] + self.plan["tasks"]})
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
            applied = sum(1 for r in self.injector.receipts if r.status == APPLIED)
            progress.update(bar, completed=done, info=f"running {running}  attempts {attempts}  faults applied "
                                                      f"{applied} of {len(self.injector.receipts)} ended")

        self._loop, self._main = asyncio.get_running_loop(), asyncio.current_task()
        if self.interrupted:  # a signal came during set-up
            raise asyncio.CancelledError
        watch = asyncio.create_task(self.health.watch_parts())
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
            if self.nodes.tasks:  # a lost node still on its way back: the sweep must see every node
                await asyncio.wait(self.nodes.tasks, timeout=120)
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
        prefix = results.task_prefix(self.wave_id, ref)
        writes = 0
        self.parts.proxy.control().flush()
        for r in results.read_jsonl(self.out.proxy_requests):
            if (r.get("key") or "").startswith(prefix) and r.get("method") in ("PUT", "POST", "DELETE") \
                    and 200 <= (r.get("status") or 0) < 300:
                writes += 1
        model, effects = self.parts.model.log.snapshot(), self.parts.effects.log.snapshot()
        counts = {"model_call": sum(1 for c in model if c["task"] == ref and c.get("delivered")),
                  "effect": sum(1 for e in effects if e["task"] == ref), "store_write": writes}
        self.plan["tasks"] = enumerate_tasks(self.plan, counts, self.cfg.boundaries)
        self.plan["enumerate"] = {"pending": False, "counts": counts, "tasks": len(self.plan["tasks"]),
                                  "sampled": self.cfg.boundaries}
        self._write_json(results.PLAN, self.plan)
        self.timeline("boundaries_enumerated", counts=counts, tasks=len(self.plan["tasks"]))
        for t in self.plan["tasks"]:
            self.parts.registry.register(t["task_id"], t["seed"], t["steps"], t["workload"])

    # ------------------------------------------------------------------ teardown pieces
    def _clear_everything(self) -> None:
        """Belt and braces after the per-fault clears: no proxy rule survives the wave."""
        if self.lost("fault proxy"):
            self.timeline("proxy_rules_not_cleared", why="the fault proxy is lost; it is stopped instead")
        elif self.parts.proxy is not None and self.parts.proxy.proc is not None:
            try:
                left = self.parts.proxy.control().close_all()
                if left:
                    self.timeline("proxy_rules_force_closed", rules=[r["rule_id"] for r in left])
            except Exception as exc:  # noqa: BLE001
                self.timeline("proxy_clear_failed", error=str(exc))

    def _final_sweep(self) -> None:
        """The sweep actor's last pass for this wave (after its settle window if anything still looks leaked);
        its report is `sweeper.json`. A lost sweep actor is recorded, never fatal: the host sweep ran already."""
        import ray

        sweeper = getattr(self.parts.fleet, "sweeper", None) if self.parts.fleet is not None else None
        if sweeper is None or self.parts.ledger is None:
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
        for part, actor in [("lease ledger", self.parts.ledger)] + [(f"sandbox host {n}", h) for n, h in
                                                               zip(self.parts.fleet.node_ids, self.parts.hosts)
                                                               if n not in self.parts.fleet.down]:
            if self.lost(part):  # hung or dead: end it now rather than wait for each call's timeout
                problems.append(f"{part} lost (harness fault)")
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001
                    pass
        try:
            if self.lost("lease ledger"):
                raise RuntimeError("the lease ledger is lost")
            active = [l for l in ray.get(self.parts.ledger.active.remote(), timeout=30)
                      if l["task_id"].startswith(self.wave_id + "/")]
        except Exception as exc:  # noqa: BLE001
            problems.append(f"ledger: {type(exc).__name__}: {str(exc)[:200]}")
            active = None
        live = [l["sandbox_id"] for l in active or []]
        if stopping:  # the wave is being stopped: every sandbox of it goes and its leases end
            for n, h in zip(self.parts.fleet.node_ids, self.parts.hosts):
                if self.lost(f"sandbox host {n}") or n in self.parts.fleet.down:
                    continue
                engine = self.harness_fault["why"][:200] if self.lost("docker engine") else None
                try:
                    ray.get(h.cancel_wave.remote(self.wave_id, 20.0, engine), timeout=30)
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"cancel on host: {type(exc).__name__}")
            for lease in active or []:
                try:
                    ray.get(self.parts.ledger.release.remote(lease["task_id"], lease["fence"], None,
                                                       f"wave stopped: {stopping}"), timeout=10)
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"release {lease['task_id']}: {type(exc).__name__}")
                    break
            live = []
        reports = []
        for n, h in zip(self.parts.fleet.node_ids, self.parts.hosts):
            if self.lost(f"sandbox host {n}") or n in self.parts.fleet.down:
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
                self.parts.proxy.control().flush()
        except (RuntimeError, OSError):
            pass
        try:
            self.out.proxy_requests.stat()  # no log at all: the audit cannot match writes to writers
            log += results.read_jsonl(self.out.proxy_requests, skip_bad=True)
        except OSError:
            log = None
        creds = self.parts.endpoint.creds
        mc = client_for(self.parts.endpoint.url, creds.access_key, creds.secret_key,
                        getattr(self.parts.endpoint, "region", None) or "us-east-1")
        out = audit(mc, self.bucket, self.wave_id, sorted(self.runs), log)
        self.out.store_audit.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))

    def _write_json(self, name: str, data) -> None:
        (self.dir / name).write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str))

    def _teardown(self) -> None:
        import ray

        errors = []
        elog = getattr(getattr(self.parts.fleet, "ray_session", None), "error_log", None)
        if elog and os.path.exists(elog):  # what Ray said about the nodes it lost (PK3)
            shutil.copyfile(elog, self.out.ray_errors)
        if getattr(self, "fenced_log", None) is not None:
            self.parts.fenced_log.close()
        with open(self.out.host_load, "ab") as f:  # appended: a resumed wave keeps the first part
            f.write(b"".join(orjson.dumps(x) + b"\n" for x in self.health.load_samples))
        if self.parts.ledger is not None:
            try:
                try:
                    if self.lost("lease ledger"):
                        raise RuntimeError("the lease ledger actor is lost")
                    dump = ray.get(self.parts.ledger.dump.remote(), timeout=60)
                except Exception:  # noqa: BLE001 - read its SQLite file directly (WAL: consistent after a kill)
                    from fleet.ledger import LeaseLedger

                    led = LeaseLedger(os.path.join(self.parts.fleet.state_dir, results.LEDGER_DB))
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
            self.timeline("lease_renewals", hosts=ray.get([h.renewals.remote() for h in self.parts.hosts], timeout=10))
        except Exception:  # noqa: BLE001 - a lost host has no figures
            pass
        counts = {}
        for key, svc in (("model", self.parts.model), ("effects", self.parts.effects)):
            if svc is not None:
                per: dict = {}
                for r in svc.log.snapshot():
                    per[r["task"]] = per.get(r["task"], 0) + 1
                counts[key] = per
        if counts:
            self.timeline("service_counts", **counts)
        for svc in (self.parts.model, self.parts.effects):
            if svc is not None:
                try:
                    svc.stop()
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"stop {type(svc).__name__}: {exc}")
        for name, part in (("fault proxy", self.parts.proxy), ("store", self.parts.store)):
            if part is not None:
                # a lost part gets no grace, and neither does the wave's own store: the audit has read it back,
                # its data dir goes with the private dir below, and weed's graceful stop took 1.2-5 s per wave
                # (a SIGKILLed weed keeps its committed objects anyway: DESIGN.md, "Real parts")
                try:
                    part.stop(grace_s=0.0) if self.lost(name) or name == "store" else part.stop()
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"stop {type(part).__name__}: {exc}")
        if self.own_fleet and self.parts.fleet is not None:
            try:
                self.parts.fleet.stop()
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

        for part in (self.parts.proxy, self.parts.store):
            proc = getattr(part, "proc", None)
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(5)
        if self.parts.store is not None:
            self.parts.store.remove_sockets()
        for wid, sid in cgroups.list_sandboxes(self.wave_id):
            try:
                reap_leftover(wid, sid)
            except Exception:  # noqa: BLE001
                pass
        if self.own_fleet and self.parts.fleet is not None:
            try:
                self.parts.fleet.stop()
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
        self._rooms()
        harness_error = None
        t_wave = time.perf_counter()
        previous = self._install_signal_handlers()
        try:
            if self.resumed is None:
                self.timeline("wave_start", wave=self.wave_id, tasks=self.cfg.tasks,
                              runner=self.plan["runner"]["name"], faults=self.cfg.faults, seed=self.cfg.seed)
            self._setup()
            self._install_signal_handlers()  # again: ray.init installs its own SIGTERM handler (it aborts)
            p = self.parts
            self.timeline("parts_ready", store=p.endpoint.url, proxy=p.proxy.url, model=p.model.url,
                          effects=p.effects.url, pids=self.part_pids, **self.figures)
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
            elif self.harness_fault is not None or self.health.diagnose(exc):
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
                    if self.parts.ledger is not None:
                        self._sweep()
                except Exception as exc:  # noqa: BLE001
                    harness_error = harness_error or f"sweep failed: {exc}"
                    self.timeline("harness_error", error=f"sweep: {exc}")
                self._final_sweep()
                try:
                    if self.parts.endpoint is not None and self.runs and not self.lost("store"):
                        self._snapshot_store()  # (a lost store has nothing to read back: the fault says so)
                except Exception as exc:  # noqa: BLE001
                    harness_error = harness_error or f"store snapshot failed: {exc}"
                    self.timeline("harness_error", error=f"store snapshot: {exc}")
                self._write_json(results.FAULTS, self.prior_receipts + [r.to_dict() for r in self.injector.receipts])
                self._teardown()
                self.figures["wave_wall_s"] = round(time.perf_counter() - t_wave, 3)
                self.timeline("wave_end", harness_error=harness_error, interrupted=self.interrupted,
                              **self.figures)
                self.timeline.close()
            self._restore_signal_handlers(previous)
        result = grade.grade_wave(self.dir, secrets=self.access.issued_secrets() if self.access else ())
        report.write_summary(self.dir, result)
        try:
            self._cache_references(result)
        except OSError as exc:
            result.setdefault("notes", []).append(f"reference cache not written: {exc}")
        if harness_error:
            result["harness_error"] = harness_error
        return result
