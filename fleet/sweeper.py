"""The sweep actor: reconciles what runs on the machine with the lease ledger, during a wave and after it.

Every `period_s` it lists the wave's sandboxes by the project's markers (the same finder `sandfleet sweep` uses:
sandbox cgroups, the environment marker of every sandbox process, workspace mounts) and the wave's leases, and
reports three things:

- leaked sandbox: something of a sandbox is alive (processes, cgroup, mount) and no active lease covers it;
- dangling lease: an active lease whose sandbox has nothing alive (its node was lost, or it has not started);
- expired but running: a sandbox whose lease expired (or was released) while its processes still run.

A leak is reaped only once it has been a leak for `settle_s` (a sandbox between its lease's release and its
host's clean-up is not one), and again checked against the ledger right before; a sandbox under an active lease
is never touched, and nothing without the wave's marker is ever listed. When the sandbox nodes are other machines
(isolated nodes, a real cluster), the actor does not look at its own machine: each node's host scans its node and
reaps there (`NodeScans`), the answers are merged with the ledger, and a node whose scan did not answer is named
in the report (`unanswered_nodes`: the wave cannot say nothing leaked there). `SweepActor` is the plain class;
`start_sweep_actor` makes it a detached Ray actor at the edge (named per wave, pinned to the head).
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from fleet.refs import awaitable


def _alive_parts(entry: dict) -> dict[str, dict]:
    """sandbox id -> what of it is alive: {"pids": [...], "cgroup": bool, "mounts": [...]}."""
    out: dict[str, dict] = {}

    def one(sid: str) -> dict:
        return out.setdefault(sid, {"pids": [], "cgroup": False, "mounts": [], "container": None})

    for p in entry.get("processes", []):
        if p.get("sandbox"):
            one(p["sandbox"])["pids"].append(p["pid"])
    for sid in entry.get("cgroups", []):
        one(sid)["cgroup"] = True
    for m, sid in (entry.get("mount_sandboxes") or {}).items():
        one(sid)["mounts"].append(m)
    for c in entry.get("containers", []):
        if c.get("sandbox"):
            one(c["sandbox"])["container"] = c["name"] + (" (running)" if c["running"] else " (stopped)")
    return out


def scan_here(wave_ids: list[str], engine_lost: str | None = None) -> dict:
    """What carries the markers of `wave_ids` on this machine (or this node: an isolated node's /proc, mounts and
    cgroups are its own), and what could not be listed. A sandbox node's host answers this for the sweep actor."""
    from fleet import markers as finder

    errors: list = []
    waves, _ = finder.markers(errors, engine_lost)
    return {"waves": {w: waves[w] for w in wave_ids if w in waves}, "errors": errors}


def reap_here(wave_id: str, sid: str) -> dict:
    """Kill and remove one leaked sandbox on this machine: its cgroup (every member) and mount, then any process
    that still carries its marker outside the cgroup (checked again by its environment right before the kill)."""
    from fleet import markers as finder
    from fleet.backends import reap_leftover

    out = reap_leftover(wave_id, sid)
    killed = []
    for p in finder.markers()[0].get(wave_id, {}).get("processes", []):
        if p.get("sandbox") != sid:
            continue
        m = finder.SANDBOX_MARK.search(finder.proc_environ(str(p["pid"])))
        if m and m.group(1).decode() == wave_id and m.group(2).decode() == sid:
            try:
                os.kill(p["pid"], signal.SIGKILL)
                killed.append(p["pid"])
            except ProcessLookupError:
                pass
    out["killed_outside_cgroup"] = killed
    return out


def merge_scans(answers: dict[str, dict]) -> tuple[dict, dict, list]:
    """Node name -> that node's `scan_here`, as one listing: (waves, {(wave, sandbox): node}, errors). A pid is
    its node's (never signalled from here): each process entry keeps its node."""
    waves: dict[str, dict] = {}
    where: dict[tuple, str] = {}
    errors: list = []
    for node, ans in sorted(answers.items()):
        errors += [e for e in ans.get("errors", []) if e not in errors]
        for w, e in ans.get("waves", {}).items():
            into = waves.setdefault(w, {"processes": [], "cgroups": [], "mounts": [], "containers": [],
                                        "mount_sandboxes": {}})
            into["processes"] += [dict(p, node=node) for p in e.get("processes", [])]
            into["cgroups"] += [c for c in e.get("cgroups", []) if c not in into["cgroups"]]
            into["mounts"] += [f"{node}:{m}" for m in e.get("mounts", [])]
            into["mount_sandboxes"].update({f"{node}:{m}": sid for m, sid in (e.get("mount_sandboxes") or {}).items()})
            into["containers"] += [c for c in e.get("containers", []) if c not in into["containers"]]
            sids = ([p.get("sandbox") for p in e.get("processes", [])] + list(e.get("cgroups", []))
                    + list((e.get("mount_sandboxes") or {}).values())
                    + [c.get("sandbox") for c in e.get("containers", [])])
            for sid in sids:
                if sid:
                    where.setdefault((w, sid), node)
    return waves, where, errors


class WaveSweep:
    """The sweep of one wave: its findings, what it reaped, its timings."""

    def __init__(self, wave_id: str, ledger: Any, settle_s: float, clock=time.time, period_s: float = 1.0,
                 lister=None):
        self.wave_id = wave_id
        # the sandbox nodes are other machines: `lister([wave], engine_lost)` gathers their scans (NodeScans: (waves,
        # {(wave, sandbox): node}, errors, {node: why it did not answer})), and a leak is reaped by its own node
        self.lister = lister
        self.where: dict[tuple, str] = {}
        self.unanswered: dict[str, str] = {}  # at the last pass: node -> why its scan did not answer
        self.scan_failures: dict[str, int] = {}  # node -> passes its scan did not answer
        self.ledger = ledger
        self.prefix = wave_id + "/"
        self.settle_s = settle_s
        self.clock = clock
        self.period_s = period_s
        self.first_seen: dict[str, float] = {}  # sandbox id -> when it was first seen leaked
        self.seen_alive: set[str] = set()  # sandboxes seen alive under their lease at some pass
        self.dangling_since: dict[str, float] = {}
        self.scans = 0
        self.scan_ms: list[float] = []
        self._lock: asyncio.Lock | None = None
        self.reaped: list[dict] = []
        self.findings: dict[str, dict] = {}  # "<kind>:<sandbox>" -> first finding of that kind for that sandbox
        self.engine_lost: str | None = None  # the driver found the docker engine gone: containers are not listed
        self.errors: list[str] = []

    async def _leases(self) -> tuple[dict, dict]:
        """(active leases by sandbox id, every lease row of the wave by sandbox id (latest fence))."""
        rows = await awaitable(self.ledger.leases_of.remote(self.prefix))
        now = self.clock()
        active = {r["sandbox_id"]: r for r in rows if r["state"] == "active" and r["expires_at"] > now}
        latest: dict[str, dict] = {}
        for r in rows:
            latest[r["sandbox_id"]] = r
        return active, latest

    async def scan(self, waves: dict | None = None, reap: bool = True) -> dict:
        """One pass: list, reconcile, and reap what has been a leak for `settle_s`. Returns this pass's report.
        `waves`: the finder's markers when the caller already listed them for several waves. Passes of one wave
        never overlap (the actor's own loop and `final` both scan): two reaps of one sandbox at once raced on its
        cgroup, and a reap lost that way went missing from the report."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            return await self._scan(waves, reap)

    async def _scan(self, waves: dict | None, reap: bool) -> dict:
        """One pass: what is alive against the leases (leaks, expired but running), leases with nothing alive
        (dangling), and the reap of leaks past the settle window."""
        from fleet import markers as finder

        t0 = time.perf_counter()
        if waves is None and self.lister is not None:
            waves, self.where, listing, self.unanswered = await self.lister([self.wave_id], self.engine_lost)
            self.errors += [e for e in listing if e not in self.errors]
        elif waves is None:
            listing: list = []
            waves, _ = await asyncio.to_thread(finder.markers, listing, self.engine_lost)
            self.errors += [e for e in listing if e not in self.errors]
        for n in self.unanswered:
            self.scan_failures[n] = self.scan_failures.get(n, 0) + 1
        alive = _alive_parts(waves.get(self.wave_id, {}))
        for sid, parts in alive.items():
            if (self.wave_id, sid) in self.where:
                parts["node"] = self.where[(self.wave_id, sid)]
        active, latest = await self._leases()
        now = self.clock()
        for sid in [x for x in self.first_seen if x not in alive]:  # gone by itself: it was not a leak
            del self.first_seen[sid]
        leaked, expired_running = self._unleased(alive, active, latest, now)
        dangling = self._dangling(alive, active, now)
        reaped = await self._reap_due(leaked, now) if reap else []
        self.scans += 1
        self.scan_ms.append(round((time.perf_counter() - t0) * 1000, 3))
        return {"at": now, "leaked": leaked, "expired_but_running": expired_running, "dangling_leases": dangling,
                "reaped": reaped, "scan_ms": self.scan_ms[-1]}

    def _unleased(self, alive: dict, active: dict, latest: dict, now: float) -> tuple[list, list]:
        """Sandboxes alive with no active lease (leaks), and those of them whose lease ended while their processes
        run on."""
        leaked, expired_running = [], []
        for sid, parts in sorted(alive.items()):
            if sid in active:
                self.first_seen.pop(sid, None)
                if parts["pids"] or parts["cgroup"] or parts["container"]:
                    self.seen_alive.add(sid)
                continue
            # the listing and the lease read are not one atomic view (an attempt can end and release its lease
            # between them): a finding counts once it held on two passes in a row
            since = self.first_seen.setdefault(sid, now)
            held = now - since >= 0.9 * self.period_s
            row = latest.get(sid)
            if row is not None and parts["pids"]:
                expired_running.append({"sandbox_id": sid, "lease_state": row["state"], "fence": row["fence"],
                                        "pids": parts["pids"]})
                if held:
                    self._note("expired_but_running", sid, expired_running[-1])
            leaked.append({"sandbox_id": sid, "leaked_for_s": round(now - since, 3), **parts})
            if held:
                self._note("leaked", sid, leaked[-1])
        return leaked, expired_running

    def _dangling(self, alive: dict, active: dict, now: float) -> list:
        """Active leases with nothing alive: dangling once the sandbox, seen alive before, stays gone for a pass
        (an attempt's end is followed by its release in ms), or none ever came within the settle window (a lease
        is taken just before its sandbox starts)."""
        dangling = []
        for sid, row in sorted(active.items()):
            if row.get("holder") in self.unanswered:  # its node could not be looked at this pass
                continue
            if sid in alive and (alive[sid]["pids"] or alive[sid]["cgroup"] or alive[sid]["container"]):
                self.dangling_since.pop(sid, None)
                continue
            since = self.dangling_since.setdefault(sid, now)
            if (sid in self.seen_alive and now - since >= 0.9 * self.period_s) or now - since >= self.settle_s:
                dangling.append({"sandbox_id": sid, "task_id": row["task_id"], "fence": row["fence"],
                                 "holder": row["holder"], "expires_in_s": round(row["expires_at"] - now, 3),
                                 "sandbox_seen_before": sid in self.seen_alive})
                self._note("dangling_lease", sid, dangling[-1])
        return dangling

    async def _reap_due(self, leaked: list, now: float) -> list:
        """Reap every leak past the settle window that still has no lease (read again right before)."""
        reaped = []
        due = [x["sandbox_id"] for x in leaked if x["leaked_for_s"] >= self.settle_s]
        if not due:
            return reaped
        active, _ = await self._leases()  # again, right before touching anything
        for sid in due:
            if sid in active:
                continue
            try:
                r = await self._reap_on_its_node(sid)
            except Exception as exc:  # noqa: BLE001 - one sandbox's failed reap must not lose the others'
                self.errors.append(f"reap {sid}: {type(exc).__name__}: {exc}"[:300])
                continue
            r["leaked_for_s"] = round(self.clock() - self.first_seen.pop(sid, now), 3)
            reaped.append(r)
            self.reaped.append(r)  # recorded at once: a later failure in this pass cannot drop it
        return reaped

    def _note(self, kind: str, sid: str, what: dict) -> None:
        self.findings.setdefault(f"{kind}:{sid}", {"kind": kind, "first_at": self.clock(), **what})

    def _reap(self, sid: str) -> dict:
        return reap_here(self.wave_id, sid)

    async def _reap_on_its_node(self, sid: str) -> dict:
        """Reap where the sandbox is: on this machine, or by the host of the node whose scan found it."""
        node = self.where.get((self.wave_id, sid))
        if node is None or self.lister is None:
            return await asyncio.to_thread(self._reap, sid)
        host = self.lister.hosts().get(node)
        if host is None:
            raise RuntimeError(f"node {node} is not a sandbox node of the fleet any more")
        return dict(await asyncio.wait_for(awaitable(host.reap_marked.remote(self.wave_id, sid)), 30), node=node)

    def report(self, last: dict | None = None) -> dict:
        kinds: dict[str, list] = {}
        for f in self.findings.values():
            kinds.setdefault(f["kind"], []).append(f)
        ms = sorted(self.scan_ms) or [0.0]
        return {"wave_id": self.wave_id, "scans": self.scans, "settle_s": self.settle_s,
                "scan_ms_p50": ms[len(ms) // 2], "scan_ms_max": ms[-1],
                "leaked": kinds.get("leaked", []), "dangling_leases": kinds.get("dangling_lease", []),
                "expired_but_running": kinds.get("expired_but_running", []), "reaped": self.reaped,
                "left_at_end": (last or {}).get("leaked", []), "errors": self.errors,
                **({"nodes_scanned": sorted(self.lister.hosts()), "unanswered_nodes": self.unanswered,
                    "node_scan_failures": self.scan_failures} if self.lister is not None else {})}


class NodeScans:
    """The sandbox nodes of a fleet whose nodes are other machines (isolated nodes, a real cluster): each pass asks
    every node's host for its own scan (`SandboxHost.scan_markers`), in parallel, bounded. A node lost on purpose
    (PK3) is not asked: its sandboxes went with it. One that does not answer is named, never taken as empty."""

    def __init__(self, timeout_s: float = 10.0):
        self.timeout_s = timeout_s
        self.nodes: dict[str, Any] = {}  # node name -> its host actor
        self.down: dict[str, str] = {}  # node name -> why it is not asked (lost, not back yet)

    def hosts(self) -> dict[str, Any]:
        return {n: h for n, h in self.nodes.items() if n not in self.down}

    async def __call__(self, waves: list[str], engine_lost: str | None = None) -> tuple[dict, dict, list, dict]:
        hosts = self.hosts()

        async def one(n: str, h) -> dict:
            return await asyncio.wait_for(awaitable(h.scan_markers.remote(waves, engine_lost)), self.timeout_s)

        got = await asyncio.gather(*(one(n, h) for n, h in hosts.items()), return_exceptions=True)
        answers, unanswered = {}, {}
        for n, r in zip(hosts, got):
            if isinstance(r, BaseException):
                unanswered[n] = f"{type(r).__name__}: {str(r)[:160]}" if str(r) else type(r).__name__
            else:
                answers[n] = r
        merged, where, errors = merge_scans(answers)
        return merged, where, errors, unanswered


class SweepActor:
    """One per fleet (reused by every wave): sweeps every wave it watches, every `period_s`."""

    def __init__(self, ledger: Any, period_s: float = 1.0, clock=time.time):
        self.ledger = ledger
        self.period_s = period_s
        self.clock = clock
        self.waves: dict[str, WaveSweep] = {}
        self._loop_task: asyncio.Task | None = None
        self.node_scans: NodeScans | None = None  # set when the sandbox nodes are other machines

    async def set_nodes(self, nodes: dict, down: dict | None = None) -> list[str]:
        """The fleet's sandbox nodes are other machines: scan each through its host (name -> host actor);
        `down` (name -> why) are lost and not asked. Called again whenever a node is lost, back or replaced."""
        if self.node_scans is None:
            self.node_scans = NodeScans()
        self.node_scans.nodes = dict(nodes)
        self.node_scans.down = dict(down or {})
        return sorted(self.node_scans.hosts())

    async def ping(self) -> int:
        return len(self.waves)

    async def pid(self) -> int:
        """This actor's process id (the wave records each part's, for a user and for the sweeps)."""
        import os

        return os.getpid()

    async def watch(self, wave_id: str, settle_s: float = 10.0) -> bool:
        self.waves[wave_id] = WaveSweep(wave_id, self.ledger, settle_s, self.clock, self.period_s,
                                        lister=self.node_scans)
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
        return True

    async def _run(self) -> None:
        from fleet import markers as finder

        while self.waves:
            listing: list = []
            waves = None
            try:
                if self.node_scans is None:  # else each wave's pass asks the nodes itself
                    waves, _ = await asyncio.to_thread(finder.markers, listing)
            except Exception:  # noqa: BLE001
                waves = None
            for w in list(self.waves.values()):
                w.errors += [e for e in listing if e not in w.errors]  # e.g. a docker engine that did not answer
                try:
                    await w.scan(waves)
                except Exception as exc:  # noqa: BLE001 - a lost ledger or a racing sandbox: report, go on
                    w.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            await asyncio.sleep(self.period_s)
        self._loop_task = None

    async def scan(self, wave_id: str, reap: bool = True) -> dict:
        return await self.waves[wave_id].scan(reap=reap)

    async def final(self, wave_id: str, engine_lost: str | None = None) -> dict:
        """The wave is over: wait out the settle window if anything still looks leaked, reap what still is,
        report, and stop watching the wave. `engine_lost`: the driver found the docker engine gone (its
        containers are not listed: the report says so, and the wave's leak check is unknown)."""
        w = self.waves[wave_id]
        w.engine_lost = engine_lost
        last: dict = {}
        try:
            last = await w.scan(reap=False)
            if last["leaked"]:
                wait = max(0.0, w.settle_s - min(x["leaked_for_s"] for x in last["leaked"]))
                await asyncio.sleep(wait)
                await w.scan()
                last = await w.scan(reap=False)
        except Exception as exc:  # noqa: BLE001
            w.errors.append(f"final: {type(exc).__name__}: {exc}"[:300])
        self.waves.pop(wave_id, None)
        return w.report(last)


def start_sweep_actor(ledger, period_s: float = 1.0, resources: dict | None = None, name: str | None = None,
                      strategy=None):
    """The fleet's sweep actor: detached (it outlives a driver that dies on a shared cluster)."""
    import ray

    from fleet.ledger import actor_options

    opts = actor_options(8, name, resources, strategy, lifetime="detached")
    return ray.remote(SweepActor).options(**opts).remote(ledger, period_s)
