"""The wave driver: plan, start the real parts, run every task's attempts under
leases in sandboxes, fire the planned faults, clear them, sweep, snapshot the
store, and hand the stored history to the grader.

Everything the grader needs is written under `results/<wave>/` before grading
starts, so `sandfleet grade RESULTS_DIR` re-grades a finished wave without
running anything.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import time
from pathlib import Path

import orjson

from cluster import grade, report, results
from cluster.artifacts import ReferenceCache, cache_passed_references, seed_cached_references
from cluster.config import WaveConfig
from cluster.grade.evidence import redact_runner_logs
from cluster.raycluster import FleetSession
from cluster.wave.access import (CONTRACT_VERSION, CREDS_IN, PORT_EFFECTS, PORT_MODEL, PORT_S3,  # noqa: F401
                                 RUNNERS_DIR, Access, runtime_binds)
from cluster.wave.attempts import Attempts
from cluster.wave.confirm import references_after, second_references
from cluster.wave.context import WaveContext
from cluster.wave.errors import HarnessError
from cluster.wave.health import Health
from cluster.wave.injector import Injector
from cluster.wave.nodes import Nodes
from cluster.wave.parts import Parts, check_ray_address, preflight  # noqa: F401
from cluster.wave.remote import nodes_record, remote_launch
from cluster.wave.progress import NARROW_COLUMNS, WaveProgress, progress_bar, progress_info  # noqa: F401
from cluster.wave.plan import (REF, boundary_counts, build_plan, enumerate_tasks, new_wave_id, placement,  # noqa: F401
                               replay_plan)
from cluster.wave.resume import prepare_resume
from cluster.wave.signals import Signals
from cluster.wave.teardown import Teardown
from cluster.wave.timeline import Event, TaskRun, Timeline
from faults.base import CATALOG
from fleet.host import WaveHosts
from fleet.lifecycle import TASK_ENDED, TaskState
from fleet.records import HarnessFault, PlannedTask


WAVE_THREADS = 256  # the wave loop's thread pool (asyncio.to_thread): store keys, credential files, revokes


class WaveRun:
    """One wave, from its plan to its verdict. `run()` reads as its phases; the work is done by the rooms of
    `cluster/wave/` (plan, parts, access, health, nodes, injector, attempts, teardown, signals, resume), which this
    class makes and hands to each other."""

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
        self.show_progress = progress
        self.preflighted = False  # `preflight()` ran (once per wave)
        self.parts = Parts(fleet=fleet, bucket=results.bucket_name(self.wave_id))
        self.cache = ReferenceCache(self.results_root)
        self.own_fleet = fleet is None
        self.runs: dict[str, TaskRun] = {}  # filled in place: the rooms hold this dict
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
        self.attempts: Attempts | None = None
        self.harness_cg = None  # the driver's own harness cgroup (set-up joins it)
        # the sweep actor watches the wave: a sandbox alive with no lease for longer than this settle window is a
        # leak it reaps (long enough for a PK6 zombie's observation and a host's clean-up)
        self.sweep_settle_s = max(10.0, 2 * cfg.lease_ttl_s)

    def _rooms(self) -> None:
        self.nodes = Nodes(self.parts, self.runs, self.timeline, self.wave_id, self._all_tasks_ended)
        self.health = Health(self.cfg, self.timeline, self.parts, self.nodes, self._cancel_main)
        self.access = Access(self.parts, self.wave_id, self.private, self.plan["runner"], self.timeline)
        self.injector = Injector(self.timeline, lambda: None if self.harness_fault is None and not self.interrupted
                                 else self._stop_why())

    @property
    def harness_fault(self) -> HarnessFault | None:
        return self.health.harness_fault if self.health is not None else None

    def lost(self, part: str) -> bool:
        return self.health is not None and self.health.lost(part)

    def _cancel_main(self) -> None:
        loop, main = getattr(self, "_loop", None), getattr(self, "_main", None)
        if loop is not None and main is not None and not main.done():
            try:
                loop.call_soon_threadsafe(main.cancel)  # (called from the health watch's thread)
            except RuntimeError:  # the loop closed meanwhile: the wave is ending already
                pass

    def _write_json(self, name: str, data) -> None:
        (self.dir / name).write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str))

    def lease_key(self, task_id: str) -> str:
        return results.lease_key(self.wave_id, task_id)

    # ------------------------------------------------------------------ setup
    def preflight(self) -> None:
        """What this machine lacks for the wave (`cluster/wave/parts.py`), checked once: the CLI calls it before it
        writes anything, and the set-up's own call is then a no-op (a league's, campaign's or test's wave is checked
        by its set-up)."""
        if not self.preflighted:
            preflight(self.cfg)  # (the module's function: a test stubs cluster.driver.preflight)
            self.preflighted = True

    def _setup(self) -> None:
        self.preflight()
        if "manifest" not in self.plan:  # what the wave runs on (a resumed wave keeps what it started on)
            from cluster import manifest
            from cluster.artifacts import reference_key

            runner = self.plan["runner"]
            self.plan["manifest"] = manifest.build(self.cfg, runner, reference_key(runner, "", 0, 0))
            self._write_json(results.PLAN, self.plan)
        from fleet import cgroups

        # the driver (services, relays of the model and effects calls) runs beside the sandboxes, not above
        self.harness_cg = cgroups.join_harness(f"driver-{os.getpid()}")
        self.private.mkdir(parents=True, exist_ok=True)
        os.chmod(self.private, 0o700)
        from cluster.sweep import record_driver

        record_driver(self.private)  # a later `sandfleet sweep` knows this wave is dead once this pid is
        # the store and the proxy are processes that take a while to come up: both are launched first, and the
        # services and the fleet start while they do (a wave's fixed cost is the longest of them, not their sum)
        if self.parts.fleet is None and self.cfg.address == "fleet":  # the fleet of `sandfleet up`: attach to it
            from cluster import fleetrecord

            t = time.perf_counter()
            try:
                self.parts.fleet = FleetSession.attach(fleetrecord.require(), self.wave_id)
            except fleetrecord.FleetError as exc:
                raise HarnessError(str(exc)) from None
            self.figures["fleet_attach_s"] = round(time.perf_counter() - t, 3)
        if self.parts.fleet is not None:  # a lent fleet may have lost an actor or its store in an earlier wave
            replaced = self.parts.fleet.heal()  # (an attached one is not mended: a lost part is a harness error)
            if replaced:
                self.timeline(Event.FLEET_HEALED, replaced=replaced)
        t_store = time.perf_counter()
        self.parts.launch_store(self.cfg, self.private)
        self.parts.start_services(self.cfg, self.out)
        binds, hide = runtime_binds(self.plan["runner"], [self.results_root, self.private])
        for t in self.plan["tasks"] + self.plan["references"]:
            self.parts.registry.register(t["task_id"], t["seed"], t["steps"], t["workload"])
        if self.resumed is not None:  # the services carry on from what their logs recorded
            self.parts.model.log.preload(self.out.model_calls)
            self.parts.effects.preload(self.out.effects)
        if self.parts.fleet is None:  # a lent fleet is already running: nothing to time
            t = time.perf_counter()
            self.parts.start_fleet(self.cfg, self.wave_id, self.private, resuming=self.resumed is not None)
            self.figures["fleet_start_s"] = round(time.perf_counter() - t, 3)
            for warning in self.parts.fleet.warnings:
                sys.stderr.write(f"warning: {warning}\n")
                self.timeline(Event.FLEET_WARNING, warning=warning)
        store_s = self.parts.wait_ready(t_store)
        if store_s is not None:
            self.figures["store_start_s"] = store_s
        # the only ways out of a sandbox's network namespace: loopback listeners relayed to these services
        p = self.parts
        relays = {PORT_S3: f"127.0.0.1:{p.proxy.port}", PORT_MODEL: f"127.0.0.1:{p.model.server.server_address[1]}",
                  PORT_EFFECTS: f"127.0.0.1:{p.effects.server.server_address[1]}"}
        self.launch = {"ro_binds": binds, "hide": hide, "relays": relays}
        self.parts.ledger, self.parts.hosts = self.parts.fleet.ledger, WaveHosts(self.parts.fleet.hosts, self.wave_id)
        import ray

        if self.parts.fleet.remote:
            self.launch.update(remote_launch(self.parts, self.plan["runner"], binds, [self.results_root, self.private],
                                             gate_port=self.cfg.gateway.port))
            if self.launch.get("shipped"):
                self.timeline(Event.CODE_SHIPPED, **self.launch.pop("shipped"))
        self._write_json(results.NODES, nodes_record(self.parts.fleet))

        # the sweep actor watches the wave from now on
        ray.get(self.parts.fleet.sweeper.watch.remote(self.wave_id, self.sweep_settle_s), timeout=60)
        store_proc = getattr(self.parts.store, "proc", None)  # an attached store (a fleet's): its recorded pid
        self.part_pids = {"store": store_proc.pid if store_proc is not None else getattr(self.parts.store, "pid", None),
                          "fault proxy": self.parts.proxy.proc.pid, "driver": os.getpid(),
                          "lease ledger": ray.get(self.parts.ledger.ping.remote(), timeout=60),
                          "sweep actor": ray.get(self.parts.fleet.sweeper.pid.remote(), timeout=60),
                          "sandbox hosts": [i["pid"] for i in self.parts.fleet.host_info],
                          "ray": self.health.track_ray()}
        self.health.own_actors(self.part_pids)  # (watched for being stopped, with the store, proxy and Ray)

    def _stop_why(self) -> str:
        if self.interrupted:
            return f"interrupted by {self.interrupted}"
        if self.harness_fault is not None:
            return f"harness fault: {self.harness_fault.part}"
        return "stopped"

    def _all_tasks_ended(self) -> bool:
        return all(r.finished_before or r.life.state in TASK_ENDED
                   for r in self.runs.values())

    async def _run_all(self) -> None:
        # `concurrency` tasks at once; a reference run (a seed's uninterrupted positive control, when the cache
        # has none) takes a slot of its own beside them, so it runs alongside its task rather than before it
        # (not in a wave with a fault that takes a node: a node is never lost under a reference, so there the
        # references run first, in the tasks' slots)
        # attempt keys, credential files and revokes run in threads that mostly wait on the store: the loop's
        # default pool (cores + 4 threads) queued attempt keys ~30 s at 4,000 sandboxes, past their leases' TTL
        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(
            max_workers=WAVE_THREADS, thread_name_prefix="sf-wave"))
        sem = asyncio.Semaphore(self.cfg.concurrency)
        beside = not any(getattr(CATALOG[f["fault_id"]], "takes_node", False)
                         for t in self.plan["tasks"] for f in t["faults"])
        slots = {"task": sem, "reference": asyncio.Semaphore(self.cfg.concurrency) if beside else sem}
        self.runs.clear()
        self.runs.update({t["task_id"]: TaskRun(plan=PlannedTask.of(t))
                          for t in self.plan["references"] + self.plan["tasks"]})
        for tid, run in self.runs.items():
            if self.resumed is not None:
                run.finished_before = tid in self.resumed["finished"]
                run.attempts = self.resumed["attempts"].get(tid, 0)
        bar = WaveProgress(self.wave_id, self.runs, self.injector, self.show_progress)
        on_change = bar.on_change
        context = WaveContext(self.wave_id, self.runs, self.parts, self.access, self.nodes, self.health, self.out)
        context.stopping = self.injector.stopping
        self.attempts = Attempts(self.cfg, self.plan, self.wave_id, self.out, self.private, self.parts, self.access,
                                 self.nodes, self.health, self.injector, self.timeline, self.launch, self._stop_why,
                                 context, self.resumed)
        run_task = self.attempts.run_task
        self._loop, self._main = asyncio.get_running_loop(), asyncio.current_task()
        if self.interrupted:  # a signal came during set-up
            raise asyncio.CancelledError
        self.health.start_watch()  # its own thread: it watches the teardown too, until the parts stop
        try:
            if (self.plan.get("enumerate") or {}).get("pending"):
                await asyncio.gather(*(run_task(r, slots[r.plan.role], on_change)
                                       for r in self.runs.values()))
                self._plan_boundaries()
                for t in self.plan["tasks"]:
                    self.runs[t["task_id"]] = TaskRun(plan=PlannedTask.of(t))
                bar.retotal()
            await asyncio.gather(*(run_task(r, slots[r.plan.role], on_change)
                                   for r in self.runs.values() if r.life.state == TaskState.PENDING))
            await self._references_after(run_task, slots, on_change, bar.retotal)
            await self._second_references(run_task, slots, on_change, bar.retotal)
        finally:
            fault_tasks = [ft for fts in self.attempts.fault_tasks.values() for ft in fts]
            for ft in fault_tasks:
                ft.cancel()
            await asyncio.gather(*fault_tasks, return_exceptions=True)
            if self.nodes.tasks:  # a lost node still on its way back: the sweep must see every node
                await asyncio.wait(self.nodes.tasks, timeout=120)
            if self.attempts.zombies:  # abandoned attempts end with their fault (bounded: the sweep ends any left)
                await asyncio.wait(self.attempts.zombies, timeout=30)
            bar.stop()

    async def _references_after(self, run_task, slots, on_change, retotal) -> int:
        """A task planned as its own reference (no fault planned: `cluster/grade/selfref.py`) that turns out no
        uninterrupted run (a second attempt, an attempt the harness ended, a failure) gets its reference now, after
        the tasks, as a task with a fault has one beside it (cluster/wave/confirm.py `references_after`). Returns
        how many it ran."""
        if self.interrupted or self.harness_fault is not None:
            return 0
        receipts = self.prior_receipts + [r.to_dict() for r in self.injector.receipts]
        extra, why_of = references_after(self.plan, self.out.timeline, receipts)
        if not extra:
            return 0
        return await self._run_references(extra, run_task, slots, on_change, retotal, Event.REFERENCES_AFTER,
                                          run=why_of)

    async def _second_references(self, run_task, slots, on_change, retotal) -> int:
        """Where a task a fault met left an artifact that differs from its reference's, a second uninterrupted run of
        the seed (cluster/wave/confirm.py), so the grader can tell the runner's own noise from damage. Returns how
        many it ran."""
        if self.interrupted or self.harness_fault is not None:
            return 0
        done = {tid for tid, r in self.runs.items() if r.life.state == TaskState.DONE or r.finished_before}
        extra = second_references(self.plan, self.out, self.cache, done)
        cached = sorted({t["reference"]["second"]["task_id"] for t in self.plan["tasks"]
                         if (t["reference"].get("second") or {}).get("cached")})
        if not extra and not cached:
            return 0
        return await self._run_references(extra, run_task, slots, on_change, retotal, Event.SECOND_REFERENCES,
                                          run=[t["task_id"] for t in extra], from_cache=cached)

    async def _run_references(self, extra, run_task, slots, on_change, retotal, event, **fields) -> int:
        """Add reference runs planned after the tasks to the plan (plan.json written again, the timeline told), and
        run them in the references' slots. Returns how many it ran."""
        self.plan["references"] = list(self.plan["references"]) + extra
        self._write_json(results.PLAN, self.plan)
        self.timeline(event, **fields)
        for t in extra:
            self.parts.registry.register(t["task_id"], t["seed"], t["steps"], t["workload"])
            self.runs[t["task_id"]] = TaskRun(plan=PlannedTask.of(t))
        retotal()
        await asyncio.gather(*(run_task(self.runs[t["task_id"]], slots["reference"], on_change) for t in extra))
        return len(extra)

    def _plan_boundaries(self) -> None:
        """Phase 2 of an enumerated wave: count the reference run's boundaries from what the harness logged."""
        ref = self.plan["references"][0]["task_id"]
        g = self.runs[ref]
        if g.life.state != TaskState.DONE and not g.finished_before:
            raise HarnessError(f"the uninterrupted run {ref} did not complete ({g.life.state.value}): there are "
                               "no boundaries to enumerate; see its runner.log")
        self.parts.proxy.control().flush()
        logged = results.read_jsonl(self.out.proxy_requests)
        counts = boundary_counts(ref, results.task_prefix(self.wave_id, ref), logged, self.parts.model.log.snapshot(),
                                 self.parts.effects.log.snapshot(), g.disk_ops)
        self.plan["tasks"] = enumerate_tasks(self.plan, counts, self.cfg.boundaries)
        self.plan["enumerate"] = {"pending": False, "counts": counts, "tasks": len(self.plan["tasks"]),
                                  "sampled": self.cfg.boundaries}
        self._write_json(results.PLAN, self.plan)
        self.timeline(Event.BOUNDARIES_ENUMERATED, counts=counts, tasks=len(self.plan["tasks"]))
        for t in self.plan["tasks"]:
            self.parts.registry.register(t["task_id"], t["seed"], t["steps"], t["workload"])

    # ------------------------------------------------------------------ signals
    def _stop_in_order(self, name: str) -> None:
        """A first SIGINT/SIGTERM: the wave stops in order (kill sandboxes, release leases, clear faults, stop the
        parts, grade what finished)."""
        self.interrupted = name
        sys.stderr.write(f"\n{name}: stopping wave {self.wave_id} in order (again to stop at once)...\n")
        loop, main = getattr(self, "_loop", None), getattr(self, "_main", None)
        if loop is not None and main is not None and not loop.is_closed():
            loop.call_soon_threadsafe(main.cancel)

    def _stop_at_once(self, name: str) -> None:
        """A second one: everything the wave started ends now, by PID and marker, and the process exits."""
        self._teardown_room().stop_at_once(name)

    def _teardown_room(self) -> Teardown:
        return Teardown(self.parts, self.health, self.timeline, self.out, self.wave_id, self.runs, self.private,
                        self.own_fleet, self.sweep_settle_s, lambda: self.interrupted, self.harness_cg)

    # ------------------------------------------------------------------ main
    def run(self) -> dict:
        """Run the wave; returns the wave verdict summary. Raises HarnessError on set-up failure."""
        self._plan()  # 1. the plan (or, resuming, what the dead driver recorded)
        self._rooms()  # 2. the rooms, which hold each other from here on
        harness_error = None
        t_wave = time.perf_counter()
        signals = Signals(self._stop_in_order, self._stop_at_once)
        previous = signals.install()
        try:
            if self.resumed is None:
                self.timeline(Event.WAVE_START, wave=self.wave_id, tasks=self.cfg.tasks,
                              runner=self.plan["runner"]["name"], faults=self.cfg.faults, seed=self.cfg.seed)
            self._setup()  # 3. the parts start (or are lent)
            signals.install()  # again: ray.init installs its own SIGTERM handler (it aborts)
            p = self.parts
            self.timeline(Event.PARTS_READY, store=p.endpoint.url, bucket=p.bucket, store_lent=p.store_lent,
                          proxy=p.proxy.url, model=p.model.url,
                          effects=p.effects.url, pids=self.part_pids, **self.figures)
            asyncio.run(self._run_all())  # 4. every task runs its attempts; the faults fire; every part is watched
        except asyncio.CancelledError:
            if self.harness_fault is not None and not self.interrupted:
                harness_error = self.health.error_text()
            else:
                self.timeline(Event.WAVE_INTERRUPTED, signal=self.interrupted)
        except Exception as exc:  # noqa: BLE001
            if self.interrupted:
                self.timeline(Event.WAVE_INTERRUPTED, signal=self.interrupted, during=f"{type(exc).__name__}: {exc}")
            elif self.harness_fault is not None or self.health.diagnose(exc):
                harness_error = self.health.error_text()
            else:
                harness_error = f"{type(exc).__name__}: {exc}"
                self.timeline(Event.HARNESS_ERROR, error=harness_error)
        finally:
            if harness_error is None and self.harness_fault is not None and not self.interrupted:
                harness_error = self.health.error_text()  # the loop ended by itself after the fault: its cause
            if self.timeline:
                harness_error = self._end(harness_error, t_wave)  # 5. faults cleared, sweeps, audit, parts stop
            Signals.restore(previous)
        picture = report.start_timeline_png(self.dir)  # (the timeline is closed: drawn while the wave grades)
        try:
            secrets = self.access.issued_secrets() if self.access else ()
            redact_runner_logs(self.out, secrets)  # 6. no secret left in results/, then grade and report
            try:
                result = grade.grade_wave(self.dir, secrets=secrets)
            except Exception as exc:  # noqa: BLE001 - a wave is always graded and reported (exit 2, named)
                result = grade.ungraded_wave(self.plan, f"{type(exc).__name__}: {str(exc)[:300]}")
        except BaseException:
            if picture is not None:
                picture.kill()
                picture.wait()
            raise
        report.write_summary(self.dir, result, picture)
        try:  # 7. the folder sealed: `sandfleet verify` checks that it is the one this wave wrote
            from cluster.seal import SealError, seal

            result["seal"] = seal(self.dir)["fingerprint"]
        except (SealError, OSError) as exc:
            result.setdefault("notes", []).append(f"not sealed: {exc}")
        try:
            cache_passed_references(self.cache, self.wave_id, self.out, result)
        except OSError as exc:
            result.setdefault("notes", []).append(f"reference cache not written: {exc}")
        if harness_error:
            result["harness_error"] = harness_error
        return result

    def _plan(self) -> None:
        if self.resume_plan is not None:
            self.plan = self.resume_plan
            self.resumed, self.prior_receipts, self.timeline = prepare_resume(self.out, self.plan, self.wave_id)
            return
        self.dir.mkdir(parents=True, exist_ok=False)
        results.link_latest(self.results_root, self.dir)
        self.plan = (replay_plan(self.replay[0], self.replay[1], self.wave_id, self.cache) if self.replay
                     else build_plan(self.cfg, self.wave_id, self.cache))
        self._write_json(results.PLAN, self.plan)
        seed_cached_references(self.cache, self.plan, self.out)
        self.timeline = Timeline(self.out.timeline)

    def _end(self, harness_error: str | None, t_wave: float) -> str | None:
        """The wave's end, in order; returns the harness error (the first one, if the end adds one)."""
        td = self._teardown_room()
        td.clear_faults()
        try:
            if self.parts.ledger is not None:
                td.sweep()
        except Exception as exc:  # noqa: BLE001
            harness_error = harness_error or f"sweep failed: {exc}"
            self.timeline(Event.HARNESS_ERROR, error=f"sweep: {exc}")
        td.sweep_actor_report()
        try:
            if self.parts.endpoint is not None and self.runs and not self.lost("store"):
                # (a lost store has nothing to read back: the fault says so)
                td.audit_store(self.cfg.store.audit_max_objects, self.cfg.seed)
        except Exception as exc:  # noqa: BLE001
            harness_error = harness_error or f"store snapshot failed: {exc}"
            self.timeline(Event.HARNESS_ERROR, error=f"store snapshot: {exc}")
        self._write_json(results.FAULTS, self.prior_receipts + [r.to_dict() for r in self.injector.receipts])
        td.stop_parts()
        if harness_error is None and self.harness_fault is not None and not self.interrupted:
            harness_error = self.health.error_text()  # a part lost while the wave ended (the watch runs to here)
        self.figures["wave_wall_s"] = round(time.perf_counter() - t_wave, 3)
        self.timeline(Event.WAVE_END, harness_error=harness_error, interrupted=self.interrupted, **self.figures)
        self.timeline.close()
        return harness_error
