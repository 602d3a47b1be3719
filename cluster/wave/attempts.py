"""Attempts: one task's attempt loop, with an explicit outcome per attempt.

A task runs attempts until one ends it (the runner exited 0, the sandbox could not start, the deadline passed),
it is out of attempts or past its deadline, or a part of the harness is lost (then it gets no end and is graded
`unknown`). Each attempt is placed on a node (`Nodes`), holds the task's lease with the next fence, gets its own
keys (`Access`), and runs in a sandbox on that node's host, with the watches its faults armed. How it ended is one
`Outcome`:

- `WAIT`: no attempt ran (every sandbox node out, or the lease still held by an earlier attempt);
- `RETRY`: it ended without ending the task (killed, crashed, abandoned by PK6, its node lost to PK3);
- `END`: it ended the task, in the state it says;
- `PART_LOST`: a part of the harness was lost under it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import enum
import shutil
import time
from dataclasses import dataclass

from cluster import results
from cluster.artifacts import write_artifact
from cluster.wave.access import CREDS_IN
from cluster.wave.errors import first_line
from cluster.wave.injector import Injector
from cluster.wave.logstream import LogStream
from cluster.wave.silence import CHECK_EVERY_S, Activity
from cluster.wave.taskdisk import TaskDisks, instance_of
from cluster.wave.timeline import Event, TaskRun
from faults.base import CATALOG, FaultSpec
from faults.planner import derive, drawn
from fleet import workloads
from fleet.lifecycle import TaskState
from fleet.records import AttemptResult, PlannedTask
from fleet.refs import awaitable
from fleet.sandbox import SandboxSpec


class Outcome(enum.Enum):
    WAIT = "wait"
    RETRY = "retry"
    END = "end"
    PART_LOST = "part_lost"


@dataclass(frozen=True)
class AttemptEnd:
    outcome: Outcome
    state: TaskState | None = None  # with END: the task's final state
    why: str = ""


WAIT, RETRY, PART_LOST = AttemptEnd(Outcome.WAIT), AttemptEnd(Outcome.RETRY), AttemptEnd(Outcome.PART_LOST)


# what each crash mode does to a kept volume before the next attempt (fleet/lazyfs/: drop = a power loss)
CRASH = {"lose-unsynced": "drop", "torn": "tear"}



STARTING = 128  # attempts between their key and their sandbox's start at once (see Attempts.attempt)


class _Gate:
    """A place among the `STARTING` attempts, left once (by the first `leave`)."""

    def __init__(self, sem: asyncio.Semaphore):
        self.sem, self.held = sem, False

    async def enter(self) -> None:
        await self.sem.acquire()
        self.held = True

    def leave(self) -> None:
        if self.held:
            self.held = False
            self.sem.release()


class Attempts:
    def __init__(self, cfg, plan: dict, wave_id: str, out: results.ResultsDir, private, parts, access, nodes, health,
                 injector: Injector, timeline, launch: dict, stop_why, context, resumed: dict | None):
        """`launch`: what every sandbox of the wave gets (`ro_binds`, `hide`, `relays`); `stop_why()`: why the
        wave is stopping; `context`: the WaveContext its faults touch; `resumed`: what a resumed wave kept."""
        self.cfg = cfg
        self.plan = plan
        self.wave_id = wave_id
        self.out = out
        self.private = private
        self.parts = parts
        self.access = access
        self.nodes = nodes
        self.health = health
        self.injector = injector
        self.timeline = timeline
        self.launch = launch
        self.stop_why = stop_why
        self.context = context
        self.starting = asyncio.Semaphore(STARTING)  # (made in the wave's loop: Attempts lives in it)
        self.fired = (resumed or {}).get("fired", set())
        self.fault_tasks: dict[str, list[asyncio.Task]] = {}
        self.zombies: list = []  # futures of abandoned attempts (PK6) still running
        self.zombie_sids: set[str] = set()  # their sandboxes, until they end
        self.activity = Activity(parts.registry, out.proxy_requests if parts.proxy is not None else None)
        self.logs = LogStream(wave_id, out)  # remote attempts' runner logs, pulled from their nodes as they run
        self.disks = TaskDisks(cfg, wave_id, nodes, injector, context, self.fleet_down)
        if "move" in cfg.disk_modes():
            nodes.detach = self.disks.detach

    # ------------------------------------------------------------------ a task
    async def run_task(self, run: TaskRun, sem: asyncio.Semaphore, on_change) -> None:
        if run.finished_before:
            return
        task, tid, tl = run.plan, run.plan.task_id, self.timeline
        async with self.nodes.turn(run), sem:  # (a node-level fault's turn first: a waiting task holds no slot)
            loop = asyncio.get_running_loop()
            launched = loop.time()
            deadline = launched + self.cfg.deadline_s
            run.life.to(TaskState.RUNNING, "launched")
            tl(Event.TASK_START, task=tid, seed=task.seed, runner=task.runner)
            self._start_faults(run, loop)
            final, why = TaskState.FAILED, ""
            while True:
                if self.health.harness_fault is not None:
                    return  # the wave is ending on a harness fault: this task gets no end (graded unknown)
                if loop.time() >= deadline:
                    final, why = TaskState.DEADLINE, f"deadline {self.cfg.deadline_s}s"
                    break
                if run.attempts >= self.cfg.max_attempts:
                    final, why = TaskState.FAILED, f"max_attempts {self.cfg.max_attempts} reached"
                    break
                end = await self.attempt(run, deadline, on_change)
                if end.outcome is Outcome.PART_LOST:
                    return
                if end.outcome is Outcome.END:
                    final, why = end.state, end.why
                    break
            run.life.to(final, why)
            if self.access.has_ahead(unused := results.sandbox_id(tid, run.attempts + 1)):  # its lease stayed busy
                await asyncio.to_thread(self.access.drop_ahead, unused)
            await self.disks.drop(run)
            for ft in self.fault_tasks[tid]:
                ft.cancel()
            await asyncio.gather(*self.fault_tasks[tid], return_exceptions=True)
            tl(Event.TASK_END, task=tid, state=final.value, why=why, attempts=run.attempts,
               duration_s=round(loop.time() - launched, 3))
            on_change()

    def fleet_down(self) -> set:
        return set(getattr(self.parts.fleet, "down", ()) or ())

    def _start_faults(self, run: TaskRun, loop) -> None:
        """The task's faults: each fired by the injector as its own task; a fault that watches attempts
        (`attempt_arm`) gets its watch armed with each attempt until it fires."""
        tid = run.plan.task_id
        for f in run.plan.faults:
            fspec, arm_of = FaultSpec(**f), getattr(CATALOG[f["fault_id"]], "attempt_arm", None)
            arm = arm_of(fspec) if arm_of and f["instance"] not in self.fired and drawn(fspec) else None
            if arm:
                run.arms[f["instance"]] = {"arm": dict(arm), "future": loop.create_future()}
        self.fault_tasks[tid] = [asyncio.create_task(self.injector.fire(FaultSpec(**f), self.context))
                                 for f in run.plan.faults if f["instance"] not in self.fired]

    async def _renewed(self, lease):
        """The lease renewed now (its host renews it from when it gets it); as it was if the ledger refuses (it
        expired meanwhile: the host's first renewal is refused too, and the attempt is fenced) or cannot answer.
        At 4,000 sandboxes starting at once, attempts waited up to 30 s for their store keys and 113 were fenced
        before their host's first renewal (issue 45)."""
        from ray.exceptions import RayActorError

        try:
            [(ok, version)] = await self.parts.ledger.renew_many.remote(
                [(lease.task_id, lease.fence, lease.version, self.cfg.lease_ttl_s, lease.holder)])
        except (RayActorError, ValueError, TypeError):
            return lease
        return dataclasses.replace(lease, version=version) if ok else lease

    # ------------------------------------------------------------------ an attempt
    async def attempt(self, run: TaskRun, deadline: float, on_change) -> AttemptEnd:
        """One attempt of the task. At most `STARTING` attempts are between their key and their sandbox's start at
        once: past that they wait before they take a lease, so a lease's TTL never runs while the driver's loop,
        busy with thousands of starts, gets round to it (10,000 hollow sandboxes: leases 40-80 s old when their
        attempt was handed to its host)."""
        gate = _Gate(self.starting)
        await gate.enter()
        try:
            return await self._attempt(run, deadline, on_change, gate)
        finally:
            gate.leave()

    async def _attempt(self, run: TaskRun, deadline: float, on_change, gate: "_Gate") -> AttemptEnd:
        from ray.exceptions import RayActorError

        tid, loop = run.plan.task_id, asyncio.get_running_loop()
        sandbox_id = results.sandbox_id(tid, run.attempts + 1)
        disk = self.disks.next(run)
        node = self.nodes.place(prefer=run.node if disk and disk["mode"] == "keep" else None, task_id=tid)
        if node is None:  # every sandbox node is lost or draining: wait for one to come back
            gate.leave()
            await asyncio.sleep(0.1)
            return WAIT
        host = self.nodes.host(node)
        self.nodes.load[node] = self.nodes.load.get(node, 0) + 1  # held from now: placements beside it spread
        try:  # its store key first: the lease's TTL runs from when the attempt can start, not while keys queue
            await asyncio.to_thread(self.access.issue_ahead, tid, sandbox_id)
        except BaseException:
            self.nodes.load[node] -= 1
            raise
        try:
            lease = await self.parts.ledger.acquire.remote(results.lease_key(self.wave_id, tid), node, sandbox_id,
                                                           self.cfg.lease_ttl_s)
        except RayActorError as exc:
            self.nodes.load[node] -= 1
            await asyncio.to_thread(self.access.drop_ahead, sandbox_id)
            self.health.part_lost("lease ledger", f"the actor died ({first_line(exc)})")
            return PART_LOST
        if lease is None:  # its key is kept for the next try (the same sandbox id): a busy lease (a PK6 zombie's,
            self.nodes.load[node] -= 1  # running out) is tried each second, and each key is two identity writes
            self.timeline(Event.LEASE_BUSY, task=tid)
            gate.leave()
            await asyncio.sleep(min(1.0, self.cfg.lease_ttl_s / 2))
            return WAIT
        run.attempts += 1
        attempt, fence = lease.attempt, lease.fence
        acquired = loop.time()
        spec = await self._sandbox_spec(run.plan, sandbox_id, attempt, fence)
        if loop.time() - acquired > self.cfg.lease_ttl_s / 4:  # its key took long to issue (many attempts starting
            lease = await self._renewed(lease)  # at once): its host gets it renewed, not near its end
        if disk is not None:
            moved = self.disks.moved.pop(tid, None) if disk["mode"] == "move" and run.attempts > 1 else None
            kept = disk["mode"] != "wipe" and run.attempts > 1 and (node == run.node or moved is not None)
            disk = dict(disk, kept=kept, **({} if kept or disk["mode"] == "wipe" or run.attempts == 1 else
                                            {"why": f"its node {run.node} is gone"}))
            if moved is not None:
                disk["moved"] = {"from": moved["node"], "to": node, "files": moved["files"], "bytes": moved["bytes"]}
            crash = CRASH.get(disk["mode"]) if kept else None
            spec = dataclasses.replace(spec, volume=tid, volume_fresh=not kept, volume_lazy=self.cfg.lazy_volumes(),
                                       volume_crash=crash, volume_image=moved["image"] if moved else None,
                                       volume_seed=derive(self.plan["seed"], tid, "disk", attempt).randrange(2**31))
            self.disks.receipt(disk)
        self.timeline(Event.ATTEMPT_START, task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, node=node,
                      lease_acquired_at=lease.acquired_at, akid=self.access.akids.get(sandbox_id),
                      **({"disk": disk} if disk is not None else {}))
        run.current, run.node = (host, sandbox_id), node
        self.nodes.placed[sandbox_id] = node
        self.parts.registry.set_attempt(tid, attempt)
        arms = [a["arm"] for a in run.arms.values() if not a["future"].done()]
        ref = host.run_attempt.remote(spec, lease, self.cfg.lease_ttl_s, "repo", arms)
        gate.leave()  # handed to its host: the next attempt may start
        if spec.remote:
            self.logs.watch(sandbox_id, node, host)
        result = AttemptResult()
        run.abandon, run.abandon_ev = None, asyncio.Event()
        try:
            result = await self._await(run, ref, sandbox_id, max(0.1, deadline - loop.time()))
        except asyncio.CancelledError:  # the wave is stopping: the sweep ends this attempt's sandbox
            await self.logs.last(sandbox_id)  # (what its log gained since the last pull, while its host has it)
            self.timeline(Event.ATTEMPT_END, task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, exit_code=None,
                          killed_by="wave stopped", ended_at=time.time(), cause=f"the wave stopped ({self.stop_why()})")
            raise
        except asyncio.TimeoutError:
            try:
                await host.kill.remote(sandbox_id, 1.0, "deadline")
                result = await ref
            except RayActorError as exc:
                result = AttemptResult(error=f"sandbox host lost: {exc}", host_lost=True)
        except RayActorError as exc:
            result = AttemptResult(error=f"sandbox host lost: {exc}", host_lost=True)
        finally:
            run.current = None
            self.nodes.load[node] -= 1
            self.parts.registry.set_attempt(tid, None)
        result = await self._keep_log(sandbox_id, result)
        if Injector.settle_arms(run, sandbox_id, result.watches or {}):
            await asyncio.sleep(0)  # the fired fault records its injection before this attempt's end
        return await self._ended(run, node, sandbox_id, attempt, fence, result, on_change)

    async def _sandbox_spec(self, task: PlannedTask, sandbox_id: str, attempt: int, fence: int) -> SandboxSpec:
        """What the host needs to start the attempt's sandbox (it crosses Ray as itself)."""
        sdir = self.out.sandbox(sandbox_id)
        sdir.mkdir(parents=True, exist_ok=True)
        fixture = workloads.get(task.workload).fixture(task.seed)
        sbc = self.cfg.sandbox
        if self.launch.get("remote"):  # the host is on another machine: no path of this one crosses
            creds = await asyncio.to_thread(self.access.remote_credentials, task.task_id, sandbox_id)
            return SandboxSpec(
                wave_id=self.wave_id, sandbox_id=sandbox_id, task_id=task.task_id, attempt=attempt,
                argv=list(self.plan["runner"]["command"]), env=self.access.runner_env(task, attempt, fence, sandbox_id),
                state_dir="", workspace_mb=sbc.workspace_mb, memory_mb=sbc.memory_mb, pids_max=sbc.pids_max,
                cpu_shares=sbc.cpu_shares, cpu_quota=sbc.cpu_cores,
                files={f"repo/{p}": text for p, text in fixture.items()}, ro_binds=list(self.launch["ro_binds"]),
                hide=list(self.launch["hide"]), relays=dict(self.launch["relays"]),
                relay_token=self.launch["relay_token"],
                backend=sbc.backend, image=sbc.image, remote=True, credentials=creds, code=self.launch["code"])
        creds_dir = await asyncio.to_thread(self.access.attempt_credentials, task.task_id, sandbox_id)
        return SandboxSpec(
            wave_id=self.wave_id, sandbox_id=sandbox_id, task_id=task.task_id, attempt=attempt,
            argv=list(self.plan["runner"]["command"]), env=self.access.runner_env(task, attempt, fence, sandbox_id),
            state_dir=str(sdir), workspace_mb=sbc.workspace_mb, memory_mb=sbc.memory_mb, pids_max=sbc.pids_max,
            cpu_shares=sbc.cpu_shares, cpu_quota=sbc.cpu_cores, workspace_dir=str(self.private / "ws" / sandbox_id),
            files={f"repo/{p}": text for p, text in fixture.items()}, ro_binds=list(self.launch["ro_binds"]),
            hide=list(self.launch["hide"]), ro_mounts={creds_dir: CREDS_IN}, relays=dict(self.launch["relays"]),
            backend=sbc.backend, image=sbc.image)

    async def _keep_log(self, sandbox_id: str, result: AttemptResult) -> AttemptResult:
        """A remote attempt's runner log, shipped in its result, kept where a local one is written (over what was
        pulled while it ran: cluster/wave/logstream.py); an abandoned attempt's is pulled on until it ends."""
        if result.abandoned:
            return result
        self.logs.finish(sandbox_id, None)  # (no pull appends from here on)
        if result.log is None:
            return result
        path = self.out.runner_log(sandbox_id)

        def write():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(result.log)
        await asyncio.to_thread(write)
        return dataclasses.replace(result, log=None, _keys=tuple(k for k in result._keys if k != "log"))

    async def _await(self, run: TaskRun, ref, sandbox_id: str, timeout: float) -> AttemptResult:
        """The attempt's result, or {"abandoned": ...} when a fault gave up on it first (the attempt then runs on
        as a zombie: its end is recorded as `zombie_end` when it comes). Raises asyncio.TimeoutError at the
        deadline and what the host raised (RayActorError) as before."""
        fut = awaitable(ref)  # (an error after the wave gave up on it is not printed as never retrieved)
        ab = asyncio.ensure_future(run.abandon_ev.wait())
        loop = asyncio.get_running_loop()
        until, started = loop.time() + timeout, time.time()
        try:
            while True:  # at most CHECK_EVERY_S at a time: a silent attempt is ended, not waited for
                left = until - loop.time()
                if left <= 0:
                    break
                done, _ = await asyncio.wait({fut, ab}, timeout=min(left, CHECK_EVERY_S),
                                             return_when=asyncio.FIRST_COMPLETED)
                if done:
                    break
                await self._end_if_silent(run, sandbox_id, started)
        finally:
            ab.cancel()
        if fut.done():
            return fut.result()
        if run.abandon is not None:
            def ended(f, sid=sandbox_id, task=run.plan.task_id):
                self.zombie_sids.discard(sid)
                shutil.rmtree(self.access.creds_dir(sid), ignore_errors=True)  # the zombie's dead key file
                try:
                    r = f.result()
                    self.logs.finish(sid, r.log)
                    self.timeline(Event.ZOMBIE_END, task=task, sandbox=sid, exit_code=r.exit_code,
                                  killed_by=r.killed_by, ended_at=r.ended_at)
                except BaseException as exc:  # noqa: BLE001
                    self.logs.finish(sid, None)
                    self.timeline(Event.ZOMBIE_END, task=task, sandbox=sid, error=f"{type(exc).__name__}"[:100])
            self.zombie_sids.add(sandbox_id)
            fut.add_done_callback(ended)
            self.zombies.append(fut)
            return AttemptResult(abandoned=run.abandon)
        raise asyncio.TimeoutError

    async def _end_if_silent(self, run: TaskRun, sandbox_id: str, started: float) -> None:
        """Kill the attempt when it did nothing observable (a model call, an effect, a store request) for longer
        than `liveness_s`: `killed: silent for N s`; the task goes on to its next attempt."""
        bound = float(self.cfg.liveness_s)
        if run.current is None or run.silenced == sandbox_id:
            return
        seen = self.activity.last_seen(sandbox_id, self._keys_it_may_sign_with(run, sandbox_id), started, bound)
        quiet = time.time() - seen
        if quiet <= bound:
            return
        run.silenced = sandbox_id
        host = run.current[0]
        self.timeline(Event.ATTEMPT_SILENT, task=run.plan.task_id, sandbox=sandbox_id, silent_s=round(quiet, 2),
                      bound_s=bound)
        from ray.exceptions import RayActorError

        try:
            await host.kill.remote(sandbox_id, 1.0, f"silent for {quiet:.0f} s (liveness_s {bound:g})")
        except RayActorError:
            pass  # the host's loss is seen through the attempt's own result

    def _keys_it_may_sign_with(self, run: TaskRun, sandbox_id: str) -> list[str]:
        """Every key id a store request of the running attempt can carry: each key it was given (rotated away by CR1
        too), and the dead keys of the task's earlier attempts that have ended (not a zombie still running): a runner
        that kept one in its durable state is refused with it, and only this attempt can have sent it now."""
        akids = list(self.access.akids_of(sandbox_id))
        for n in range(1, run.attempts):
            sid = results.sandbox_id(run.plan.task_id, n)
            if sid != sandbox_id and sid not in self.zombie_sids:
                akids += self.access.akids_of(sid)
        return akids

    def _retry(self, run: TaskRun, attempt: int, code, why: str) -> AttemptEnd:
        run.life.to(TaskState.RETRYING, why)
        self.timeline(Event.TASK_RETRY, task=run.plan.task_id, after_attempt=attempt, exit_code=code)
        run.life.to(TaskState.RUNNING, f"attempt {attempt + 1}")
        return RETRY

    async def _ended(self, run: TaskRun, node: str, sandbox_id: str, attempt: int, fence: int,
                     result: AttemptResult, on_change) -> AttemptEnd:
        """Record how the attempt ended and say what it means for its task."""
        tid, tl = run.plan.task_id, self.timeline
        code = result.exit_code
        if result.abandoned:  # PK6 (frozen), NP1 (cut off): its lease runs out, its keys die now
            ab = result.abandoned
            run.last_killed_by = ab["instance"]
            if ab.get("fence", True):  # (NP1's negative control leaves them valid)
                await asyncio.to_thread(self.access.revoke, sandbox_id, True)
            tl(Event.ATTEMPT_END, task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, exit_code=None,
               killed_by=ab["instance"], ended_at=ab["at"], node=node,
               cause=ab.get("cause") or f"killed: frozen, abandoned to run out its lease ({ab['instance']}); "
                                        "a zombie now")
            on_change()
            return self._retry(run, attempt, None, f"attempt {attempt} abandoned ({ab['instance']})")
        if result.host_lost and node in self.nodes.lost:
            # PK3 took the node and this attempt with it: its lease is left to expire (no one renews it; a lost
            # machine cannot say it is done); its key dies now
            lost = self.nodes.lost[node]
            run.last_killed_by = lost["instance"]
            tl(Event.ATTEMPT_END, task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, exit_code=None,
               killed_by=lost["instance"], ended_at=lost["at"], node=node,
               cause=f"killed: node {node} lost ({lost['instance']}, {lost['mode']})")
            await asyncio.to_thread(self.access.revoke, sandbox_id)
            on_change()
            return self._retry(run, attempt, None, f"attempt {attempt}: node {node} lost")
        if result.host_lost:
            tl(Event.ATTEMPT_END, task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id, exit_code=None,
               error=result.error[:300], cause="harness fault: the sandbox host was lost")
            self.health.part_lost(f"sandbox host {node}", f"the actor died while it ran attempt {sandbox_id} "
                                  f"({first_line(result.error)})")
            return PART_LOST
        result = await self._close(run, node, sandbox_id, attempt, fence, result)
        on_change()
        if result.harness_part:  # the backend's engine failed under this attempt: the harness's fault
            why = (result.start_error or result.cause or "")[:300]
            self.health.part_lost(result.harness_part, f"{why} (attempt {sandbox_id})",
                                  since=self.health.last_ok.get(result.harness_part))
        if self.health.harness_fault is not None:
            return PART_LOST  # this attempt may have ended because of the fault: no verdict from it
        if result.start_error:
            return AttemptEnd(Outcome.END, TaskState.FAILED, result.start_error)
        if code == 0:
            return AttemptEnd(Outcome.END, TaskState.DONE, "runner exited 0")
        if result.killed_by == "deadline":
            return AttemptEnd(Outcome.END, TaskState.DEADLINE, f"deadline {self.cfg.deadline_s}s")
        return self._retry(run, attempt, code, f"attempt {attempt} exit {code}")

    async def _close(self, run: TaskRun, node: str, sandbox_id: str, attempt: int, fence: int,
                     result: AttemptResult) -> AttemptResult:
        """An attempt that ended on its host: its lease released, its keys revoked, its workspace stored; returns
        the result as recorded (a draining node named in its cause)."""
        from ray.exceptions import RayActorError

        tid = run.plan.task_id
        code = result.exit_code
        if result.disk:  # the crash the last attempt's end left, done to the volume before this attempt started
            self.disks.receipt({"after": run.last_killed_by, "done": result.disk})
        run.last_killed_by = instance_of(run, result.killed_by)  # a crash loop's `<instance>#<n>`: its instance
        if result.disk_ops is not None:  # the lazy layer's count of the volume's writes, fsyncs, renames so far
            run.disk_ops = dict(result.disk_ops)
        if node in self.nodes.faults and not (result.cause or "").startswith("killed"):
            result = result.but(cause=f"{result.cause or f'exit {code}'} (node {node} draining for "
                                      f"preemption: {self.nodes.faults[node]})")
        try:
            await self.parts.ledger.release.remote(results.lease_key(self.wave_id, tid), fence, None, f"exit {code}")
        except RayActorError as exc:
            self.health.part_lost("lease ledger", f"the actor died ({first_line(exc)})")
        await asyncio.to_thread(self.access.revoke, sandbox_id)  # the lease ended: its key is dead
        captured = None
        if result.artifact is not None:
            captured = self.store_artifact(tid, attempt, result.artifact)
        self.timeline(Event.ATTEMPT_END, task=tid, attempt=attempt, fence=fence, sandbox=sandbox_id,
                      exit_code=code, killed_by=result.killed_by, start_ms=result.start_ms,
                      started_at=result.started_at, ended_at=result.ended_at,
                      error=result.error, start_error=result.start_error, artifact=captured,
                      cause=result.start_error or result.cause or result.error,
                      events=result.events, outlived=result.outlived, **({"disk": result.disk} if result.disk else {}))
        return result

    def store_artifact(self, tid: str, attempt: int, captured: dict) -> dict:
        """Write what the host read back from the workspace into a fresh `artifacts/<task>/`."""
        if captured.get("files") is None:
            return {"captured": False, "why": captured.get("why", "nothing captured")}
        meta = {"task_id": tid, "attempt": attempt, "skipped": captured.get("skipped", [])}
        if captured.get("capped"):  # a cap of the read-back left files out: the artifact is not the whole workspace
            meta["capped"] = captured["capped"]
        m = write_artifact(self.out.artifact(tid), captured["files"], meta)
        out = {"captured": True, "digest": m["digest"], "files": len(m["files"]), "skipped": m["skipped"]}
        if captured.get("capped"):
            out["capped"] = captured["capped"]
        return out
