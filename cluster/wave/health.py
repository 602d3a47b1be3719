"""Health: every part a wave started or uses is watched until the wave ends.

Processes and services are probed every 0.5 s (the store, the proxy, the services and the wave's own Ray: its GCS,
each live node's raylet and the agents a raylet starts; a dead process at once; one that does not answer HTTP within
`health.answer_s`, `health.strikes` times in a row), actors every 1 s (dead at once; no answer to a ping within
`health.actor_timeout_s`, `health.actor_strikes` times), and every process of this machine the wave started or
depends on (the store, the proxy, its own Ray, its actors' workers) is looked at for being stopped (SIGSTOP: it
answers nothing, and calls to it wait): stopped `health.strikes` probes in a row, it is lost, and the wave ends it
by its pid (a Ray GCS or raylet left stopped would hold every later Ray call, the teardown's too). A lost part is a
harness fault: it is recorded, no task starts after it, and the wave ends; the tasks it touched are graded
`unknown`, never `fail`. The watch runs in a thread of its own from the first attempt until the teardown stops the
parts, so a part lost while the wave ends is found too. The host's load is sampled beside (a runner silent while
the host was overloaded is starved, not provably hung).
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

from cluster.wave.errors import first_line
from cluster.wave.parts import exit_text
from cluster.wave.timeline import Event
from fleet.markers import proc_cmdline, proc_start_time
from fleet.records import HarnessFault
from storage.proxy.handler import RELAY_LOST_EXIT

HINTS = {"store": "the embedded S3 store (weed mini) failed: re-run the wave",
         "sweep actor": "the sweep actor failed, so leaks could no longer be seen: re-run the wave (check Ray's "
                        "logs for why; `sandfleet sweep` removes what the wave left)",
         "fault proxy": "the fault proxy failed: re-run the wave",
         "lease ledger": "the lease ledger actor failed: re-run the wave (check Ray's logs for why)",
         "model endpoint": "the model endpoint failed: re-run the wave",
         "effects service": "the effects service failed: re-run the wave",
         "Ray GCS": "the wave's Ray GCS died: Ray could no longer place or find actors, so nothing after it can be "
                    "trusted: re-run the wave (`sandfleet sweep` ends the Ray processes it left)",
         "raylet": "a raylet of the wave's Ray died: re-run the wave (check Ray's logs for why)",
         "Ray dashboard agent": "a Ray agent died (its raylet goes with it): re-run the wave",
         "Ray runtime-env agent": "a Ray agent died (its raylet goes with it): re-run the wave",
         "docker engine": "the docker engine stopped answering (a runner still running was ended by pid): "
                          "check `docker info` (infra/dockerd-up starts it); once it answers, `sandfleet "
                          "sweep` removes the wave's containers; then re-run the wave"}


class Health:
    PROBE_S = 0.5  # processes and services: dead at once; not answering HTTP in health.answer_s, strikes times
    ACTOR_PROBE_S = 1.0  # actors: dead at once; no answer to a ping in health.actor_timeout_s, actor_strikes times

    def __init__(self, cfg, timeline, parts, nodes, on_lost: Callable[[], None]):
        """`nodes`: the wave's Nodes (a draining or lost node's host is not probed); `on_lost`: called once when a
        part is found lost (the wave cancels its main task)."""
        self.cfg = cfg
        self.timeline = timeline
        self.parts = parts
        self.nodes = nodes
        self.on_lost = on_lost
        self.harness_fault: HarnessFault | None = None
        self.last_ok: dict[str, float] = {}  # each watched part: when it last answered a probe
        self.load_samples: list[dict] = []  # host-load.jsonl
        self.ray_procs: dict[str, tuple[str, int, str]] = {}  # part -> (node, pid, start time): the wave's own Ray
        # part -> (pid, start time): processes of this machine the wave owns beside its Ray (its actors' workers);
        # one found stopped is ended by pid
        self.own_pids: dict[str, tuple[int, str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pids_lock = threading.RLock()  # the watch's thread and the wave's loop both read and update the pids

    def own(self, part: str, pid: int | None) -> None:
        """Watch `pid` (a process of this machine the wave owns) for being stopped, as `part`."""
        since = proc_start_time(pid) if pid else None
        if since:
            with self._pids_lock:
                self.own_pids[part] = (pid, since)

    def own_actors(self, pids: dict) -> None:
        """The wave's actors whose workers run on this machine (checked by their process title), from the driver's
        `parts_ready` pids: watched for being stopped. Not a `sandfleet up` fleet's (they serve other waves), nor a
        host on another machine (its pid is that machine's)."""
        fleet = self.parts.fleet
        if fleet is None or getattr(fleet, "attached", False):
            return
        found = [("lease ledger", pids.get("lease ledger"), "LeaseLedger"),
                 ("sweep actor", pids.get("sweep actor"), "SweepActor")]
        if not getattr(fleet, "remote", False):
            found += [(f"sandbox host {n}", (i or {}).get("pid"), "SandboxHost")
                      for n, i in zip(fleet.node_ids, getattr(fleet, "host_info", None) or [])]
        for part, pid, cls in found:
            if isinstance(pid, int) and proc_cmdline(str(pid)).startswith(f"ray::{cls}"):
                self.own(part, pid)

    def start_watch(self) -> None:
        """The watch, in a thread of its own with its own event loop, until `stop_watch` (the teardown, before it
        stops the parts): a part lost while the wave ends (its last tasks, its sweeps, its audit) is found too."""
        def run():
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self._watch_until_stopped())
            finally:  # (a probe stuck in an executor thread is not waited for)
                loop.close()

        self._stop.clear()
        self._thread = threading.Thread(target=run, name="sf-health", daemon=True)
        self._thread.start()

    async def _watch_until_stopped(self) -> None:
        watch = asyncio.ensure_future(self.watch_parts())
        while not self._stop.is_set() and not watch.done():
            await asyncio.sleep(0.05)
        watch.cancel()
        await asyncio.wait({watch}, timeout=5)  # bounded: a probe never holds the wave's end

    def stop_watch(self, timeout_s: float = 5.0) -> None:
        """The watch ends (the parts are about to stop); a process found stopped at this last look is lost at once
        (no strikes are left to wait for: stopping the parts would wait on it) and ended by its pid."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.harness_fault is None:
            stopped = {part: bad for part, bad in self.stopped_now().items() if bad}
            for part, (why, _) in stopped.items():
                self.part_lost(part, f"{why} (seen as the wave stopped its parts)")

    def part_lost(self, part: str, why: str, since: float | None = None) -> None:
        """A part of the harness died or stopped answering: record it, stop starting tasks, end the wave.

        Tasks it touched (any not ended before the part's last good probe) are graded `unknown`, never `fail`."""
        if self.harness_fault is not None:
            return
        # a dead (or stopped) raylet takes its actors (hosts, ledger) with it: name the cause
        root = self.dead_ray_process() or self.stopped_ray_process()
        if root is not None and root[0] != part:
            part, why = root[0], f"{root[1]} (seen as {part}: {why})"
        ended = self.end_stopped(part)
        if ended:
            why = f"{why}; {ended}"
        hint = HINTS.get(part) or HINTS.get(part.rsplit(" node-", 1)[0], f"{part} failed: re-run the wave (check "
                                                                        "Ray's logs for why)")
        self.harness_fault = HarnessFault(part, why, since or time.time(), hint)
        self.timeline(Event.HARNESS_FAULT, **self.harness_fault.to_dict())
        self.on_lost()

    def _watched_pids(self) -> dict[str, tuple[int, str]]:
        """part -> (pid, start time) of every process of this machine the wave owns and watches."""
        p = self.parts
        with self._pids_lock:
            out = {part: (pid, since) for part, (_, pid, since) in self.ray_procs.items()}
            own = dict(self.own_pids)
        lent = getattr(p, "store_lent", False)  # a lent store (a fleet's) outlives the wave: never ended by it
        for part, proc in (("store", None if lent else getattr(getattr(p, "store", None), "proc", None)),
                           ("fault proxy", getattr(getattr(p, "proxy", None), "proc", None))):
            if proc is not None and proc.poll() is None and proc_start_time(proc.pid):
                out[part] = (proc.pid, proc_start_time(proc.pid))
        gone = self.nodes.out | set(getattr(p.fleet, "down", ()) or ())
        out.update({part: v for part, v in own.items()
                    if not (part.startswith("sandbox host ") and part.rsplit(" ", 1)[1] in gone)})
        return out

    async def probe_stopped(self) -> dict[str, tuple[str, bool] | None]:
        """{part: None, or (why, False) when stopped (state T or t)} for each watched process: a stopped one
        answers nothing and every call to it waits; `health.strikes` of these in a row and it is lost."""
        return self.stopped_now()

    def stopped_now(self) -> dict[str, tuple[str, bool] | None]:
        out: dict[str, tuple[str, bool] | None] = {}
        for part, (pid, since) in self._watched_pids().items():
            state = _state(pid)
            stopped = state in ("T", "t") and proc_start_time(pid) == since
            out[part] = (f"pid {pid} is stopped (state {state}: SIGSTOP, or a debugger holds it)", False) \
                if stopped else None
        return out

    def end_stopped(self, part: str) -> str | None:
        """A lost part that is a stopped process the wave owns is ended now (SIGKILL by its pid, checked by its
        start time): left stopped, it would hold every call to it (a stopped GCS every Ray call) until the wave's
        bounds ran out one by one. Returns what was done, or None."""
        pid, since = self._watched_pids().get(part, (None, None))
        if pid is None or _state(pid) not in ("T", "t") or proc_start_time(pid) != since:
            return None
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return f"ended by the wave (SIGKILL to pid {pid})"

    def lost(self, part: str) -> bool:
        """Is `part` the one a harness fault named (calls to it would only wait for their timeouts)?"""
        return self.harness_fault is not None and self.harness_fault.part.startswith(part)

    def error_text(self) -> str:
        return self.harness_fault.text()

    @staticmethod
    async def answers_http(host: str, port: int, timeout: float, path: str = "/") -> str | None:
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
            try:
                w.close()
            except RuntimeError:  # its loop closed under it (the watch stopped mid-probe): the socket goes with it
                pass

    def track_ray(self) -> dict[str, int]:
        """Start watching the wave's own Ray processes (at set-up, before any task runs); returns part -> pid."""
        self.dead_ray_process()
        return {part: pid for part, (_, pid, _) in self.ray_procs.items()}

    def dead_ray_process(self) -> tuple[str, str] | None:
        """A process of the wave's own Ray that died (the GCS, a raylet, a raylet's agents), by the pid and start
        time it was first seen with; a lost or draining node's are not watched (PK3 takes them on purpose), and
        a node that came back is watched again from its new processes."""
        with self._pids_lock:
            return self._dead_ray_process()

    def _dead_ray_process(self) -> tuple[str, str] | None:
        session = getattr(self.parts.fleet, "ray_session", None)
        if session is None:
            return None
        gone = self.nodes.out | set(getattr(self.parts.fleet, "down", ()) or ())
        for part in [k for k, (node, _, _) in self.ray_procs.items() if node in gone]:
            del self.ray_procs[part]
        for part, node, pid in session.core_processes():
            if node not in gone and part not in self.ray_procs and proc_start_time(pid):
                self.ray_procs[part] = (node, pid, proc_start_time(pid))
        dead = [(part, pid) for part, (_, pid, since) in self.ray_procs.items() if proc_start_time(pid) != since]
        if not dead:
            return None
        # the first in the order they were listed (the GCS, then each raylet before its agents); a raylet and its
        # agents go together whichever died first, so every dead one is named
        also = "; also gone: " + ", ".join(f"{p} (pid {pid})" for p, pid in dead[1:]) if dead[1:] else ""
        return dead[0][0], f"pid {dead[0][1]} exited{also}"

    def stopped_ray_process(self) -> tuple[str, str] | None:
        """A process of the wave's own Ray that is stopped (the GCS marks a stopped raylet's node dead, and its
        actors with it, before the stopped-process probe strikes out: the raylet is the cause)."""
        with self._pids_lock:
            procs = list(self.ray_procs.items())
        for part, (_, pid, since) in procs:
            state = _state(pid)
            if state in ("T", "t") and proc_start_time(pid) == since:
                return part, f"pid {pid} is stopped (state {state}: SIGSTOP, or a debugger holds it)"
        return None

    def dead_process(self) -> tuple[str, str] | None:
        ray_dead = self.dead_ray_process()
        if ray_dead is not None:
            return ray_dead
        p = self.parts
        for part, proc in (("store", getattr(p.store, "proc", None)), ("fault proxy", p.proxy.proc)):
            if proc is not None and proc.poll() is not None:
                if part == "fault proxy" and proc.returncode == RELAY_LOST_EXIT:
                    return part, (f"its compiled relay (sandfleet-relay, which owns the proxy's port) exited, and "
                                  f"the proxy (pid {proc.pid}) ended with it")
                return part, f"pid {proc.pid} exited ({exit_text(proc.returncode)})"
        for part, svc in (("model endpoint", p.model), ("effects service", p.effects)):
            if not svc.thread.is_alive():
                return part, "its server thread ended"
        return None

    async def probe_services(self) -> dict[str, tuple[str, bool] | None]:
        """{part: None (healthy) or (why, certain)} for the store, proxy, model endpoint, effects service."""
        from urllib.parse import urlsplit

        dead = self.dead_process()
        if dead is not None:
            return {dead[0]: (dead[1], True)}
        p = self.parts
        u = urlsplit(p.endpoint.url)
        targets = {"store": (u.hostname, u.port or 80, "/"),
                   "fault proxy": ("127.0.0.1", p.proxy.control_port, "/stats"),  # answers 401 itself
                   "model endpoint": ("127.0.0.1", p.model.server.server_address[1], "/v1/models"),
                   "effects service": ("127.0.0.1", p.effects.server.server_address[1], "/")}
        got = await asyncio.gather(*(self.answers_http(h, port, self.cfg.health.answer_s, path)
                                     for h, port, path in targets.values()))
        out = {part: (why, False) if why else None for part, why in zip(targets, got)}
        if self.cfg.sandbox.backend == "docker":  # the engine every container of the wave depends on
            out["docker engine"] = await self.docker_answers()
        return out

    async def docker_answers(self) -> tuple[str, bool] | None:
        def ping():
            from fleet.dockerapi import docker_client

            docker_client(self.cfg.health.answer_s).ping()

        try:
            await asyncio.wait_for(asyncio.to_thread(ping), self.cfg.health.answer_s + 1)
            return None
        except Exception as exc:  # noqa: BLE001 - refused, gone, or hung
            return f"no answer from the docker engine ({type(exc).__name__}: {str(exc)[:150]})", False

    async def probe_actors(self) -> dict[str, tuple[str, bool] | None]:
        from ray.exceptions import RayActorError

        from fleet.refs import awaitable

        p = self.parts
        actors = [("lease ledger", p.ledger)] + [(f"sandbox host {n}", h) for n, h in
                                                 zip(p.fleet.node_ids, p.hosts) if n not in self.nodes.out]
        if getattr(p.fleet, "sweeper", None) is not None:  # the sweep actor: without it no leak would be seen
            actors.append(("sweep actor", p.fleet.sweeper))

        async def one(actor):
            try:
                await asyncio.wait_for(awaitable(actor.ping.remote()), self.cfg.health.actor_timeout_s)
                return None
            except RayActorError as exc:
                return f"the actor died ({first_line(exc)})", True
            except asyncio.TimeoutError:
                return f"no answer to a ping within {self.cfg.health.actor_timeout_s:g} s (hung?)", False

        got = await asyncio.gather(*(one(a) for _, a in actors))
        return {part: r for (part, _), r in zip(actors, got)}

    async def probe_node_paths(self) -> dict[str, tuple[str, bool] | None]:
        """Sandbox nodes that are other machines: from each live node, the head's services through its gate, end
        to end (`SandboxHost.probe_head`). A broken path is that node's harness fault: `path node-1 -> head`."""
        from fleet.refs import awaitable

        p = self.parts
        gw = getattr(p, "gateway", None)
        if gw is None:
            return {}
        targets = {s: gw.target(s) for s in ("s3", "model", "effects")}
        gone = self.nodes.out | set(getattr(p.fleet, "down", ()) or ())
        live = [(n, h) for n, h in zip(p.fleet.node_ids, p.hosts) if n not in gone]
        timeout = self.cfg.health.answer_s

        async def one(h):
            try:
                return await asyncio.wait_for(awaitable(h.probe_head.remote(targets, gw.token.decode(), timeout)),
                                              timeout + self.cfg.health.actor_timeout_s)
            except Exception:  # noqa: BLE001 - the host itself not answering is probe_actors' to say
                return None

        out: dict[str, tuple[str, bool] | None] = {}
        for (n, _), got in zip(live, await asyncio.gather(*(one(h) for _, h in live))):
            if got is None:
                continue
            bad = [f"{svc}: {why}" for svc, why in got.items() if why]
            out[f"path {n} -> head"] = ("; ".join(bad), False) if bad else None
        return out

    async def watch(self, probe, every: float, strikes_needed: int, vouches: bool = True) -> None:
        """Run `probe` every `every` s; a part certainly lost, or failing `strikes_needed` probes in a row, is a
        harness fault. Strikes and the last good time are kept per part (`vouches`: a good probe is proof the part
        answers; a process that is not stopped is none)."""
        strikes: dict[str, int] = {}
        t0 = time.time()
        while self.harness_fault is None:
            await asyncio.sleep(every)
            try:
                got = await probe()
            except Exception as exc:  # noqa: BLE001 - one probe round that failed in itself: the next one runs
                self.timeline(Event.PART_PROBE_FAILED, part=probe.__name__, why=f"the probe failed: "
                              f"{type(exc).__name__}: {str(exc)[:200]}", strike=0)
                continue
            for part, bad in got.items():
                if bad is None:
                    strikes[part] = 0
                    if vouches:
                        self.last_ok[part] = time.time()
                    continue
                why, certain = bad
                strikes[part] = strikes.get(part, 0) + 1
                self.timeline(Event.PART_PROBE_FAILED, part=part, why=why, strike=strikes[part])
                if certain or strikes[part] >= strikes_needed:
                    self.part_lost(part, why, since=self.last_ok.get(part, t0))
                    return

    async def watch_parts(self) -> None:
        """Every part the wave started or uses, watched until the wave ends; and the host's load."""
        await asyncio.gather(self.watch(self.probe_services, self.PROBE_S, self.cfg.health.strikes),
                             self.watch(self.probe_actors, self.ACTOR_PROBE_S, self.cfg.health.actor_strikes),
                             self.watch(self.probe_node_paths, self.ACTOR_PROBE_S, self.cfg.health.strikes),
                             self.watch(self.probe_stopped, self.PROBE_S, self.cfg.health.strikes, vouches=False),
                             self.sample_load())

    async def sample_load(self) -> None:
        """Runnable tasks on the host every 0.5 s (`procs_running` of /proc/stat), for the grader: a runner silent
        while the host was overloaded is starved, not provably hung (`liveness` is then unknown)."""
        cores = os.cpu_count() or 1
        if getattr(self.parts.fleet, "remote", False):  # other machines: each node's own, by its host
            return await self._sample_node_loads()
        while self.harness_fault is None:
            try:
                line = next(x for x in Path("/proc/stat").read_text().splitlines() if x.startswith("procs_running"))
                self.load_samples.append({"t": round(time.time(), 3), "running": int(line.split()[1]) - 1,
                                          "cores": cores})  # minus this sampler itself
            except (OSError, StopIteration, ValueError):
                pass
            await asyncio.sleep(0.5)

    async def _sample_node_loads(self) -> None:
        from fleet.refs import awaitable

        while self.harness_fault is None:
            p = self.parts
            gone = self.nodes.out | set(getattr(p.fleet, "down", ()) or ())
            live = [h for n, h in zip(p.fleet.node_ids, p.hosts) if n not in gone]
            got = await asyncio.gather(*(asyncio.wait_for(awaitable(h.load.remote()), 2.0) for h in live),
                                       return_exceptions=True)
            self.load_samples += [r for r in got if isinstance(r, dict)]
            await asyncio.sleep(0.5)

    def diagnose(self, exc: BaseException) -> bool:
        """An unexpected error in the wave loop: if a part is dead, it is the cause (a harness fault)."""
        dead = self.dead_process() if self.parts.proxy is not None and self.parts.model is not None else None
        if dead is None:
            return False
        self.part_lost(dead[0], f"{dead[1]} (seen as {type(exc).__name__}: {str(exc)[:200]})")
        return True



def _state(pid: int) -> str | None:
    """A process's state letter (/proc/<pid>/stat: R, S, D, T stopped, t traced, Z...), or None if it is gone."""
    try:
        raw = open(f"/proc/{pid}/stat", "rb").read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2:][:1].decode() or None
