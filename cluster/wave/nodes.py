"""Nodes: where attempts run, and PK3's node loss.

Placement is least-loaded: each attempt goes to the live sandbox node with the fewest attempts running (ties: the
lowest number); a draining or lost node gets none. PK3 takes a node ('drain': the GCS is asked to drain it for
preemption with a deadline, every sandbox there gets the notice and SIGTERM, and at the deadline the node is lost;
'abrupt': lost at once) and brings it back `down_s` later as a new Ray node, or as soon as every task of the wave
has ended.

Node-level faults (PK3, NP1: `takes_node`) take turns: a task that plans k of them waits, before its slot, for k of
the turns (one fewer than sandbox nodes, so one node always runs the wave), and owns a node of its own that no other
turn's task is placed on; its attempts go there until a fault took it, then to nodes no other turn owns. It gives its
turns back when it ended and its faults cleared (a lost node back), so two node-level faults never pre-empt each other
on one node. A task that needs more turns than there are is refused with the config (cluster/config.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Callable

from cluster.wave.timeline import Event
from faults.base import CATALOG


def node_faults(task) -> int:
    """How many node-level faults (PK3, NP1) the planned task (a PlannedTask) has."""
    return sum(1 for f in task.faults if getattr(CATALOG.get(f["fault_id"]), "takes_node", False))


class Nodes:
    def __init__(self, parts, runs: dict, timeline, wave_id: str, all_ended: Callable[[], bool]):
        """`runs`: the wave's task runs by task id (the same dict the wave fills); `all_ended()`: every task of the
        wave has ended."""
        self.parts = parts
        self.runs = runs
        self.timeline = timeline
        self.wave_id = wave_id
        self.all_ended = all_ended
        self.load: dict[str, int] = {}  # node -> attempts running there now (placement)
        self.placed: dict[str, str] = {}  # sandbox id -> its node
        self.out: set[str] = set()  # draining or lost: no new attempt goes there
        self.lost: dict[str, dict] = {}  # node -> how PK3 took it (its attempts end as killed, not as a fault)
        self.events: dict[str, asyncio.Event] = {}  # node -> set when it is back
        self.back_info: dict[str, dict] = {}
        self.faults: dict[str, str] = {}  # node -> the PK3 instance draining or taking it
        # `move` disks (set by the attempts' room): (node, instance, its running sandboxes) -> what was detached,
        # called right before PK3 takes the node, so a task's volume outlives it as a network disk does
        self.detach: Callable | None = None
        self.tasks: list[asyncio.Task] = []  # nodes on their way back
        self.owner: dict[str, str] = {}  # node -> the task whose node-level fault turn owns it
        self.owned: dict[str, str] = {}  # task id -> the node it owns for its turn
        self._turns: asyncio.Condition | None = None
        self.turns_held = 0  # of one fewer than the sandbox nodes

    @property
    def fleet(self):
        return self.parts.fleet

    def place(self, prefer: str | None = None, task_id: str | None = None) -> str | None:
        """Least-loaded: the live sandbox node with the fewest attempts running (ties: the lowest number); `prefer`
        when it is live (a task's kept disk is on its last node). A task holding a node-level fault turn goes to
        the node it owns while that is live, and never to a node another turn owns while one is left."""
        live = [n for n in self.fleet.node_ids if n not in self.out and n not in self.fleet.down]
        if not live:
            return None
        own = self.owned.get(task_id) if task_id is not None else None
        if own in live:
            return own
        if prefer in live:
            return prefer
        run = self.runs.get(task_id) if task_id is not None else None
        if own is not None or getattr(getattr(run, "plan", None), "role", None) == "reference":
            # a reference (the positive control) never goes where a node-level fault will land: a cut or loss waits
            # for it to end first, and the faulted task may end meanwhile (its fault then `not_applied`)
            live = [n for n in live if n not in self.owner] or live
        return min(live, key=lambda n: (self.load.get(n, 0), self.fleet.node_ids.index(n)))

    TURN_NODE_WAIT_S = 120.0  # how long a turn waits for a live node no other turn owns (one lost may come back)

    @contextlib.asynccontextmanager
    async def turn(self, run):
        """A task with k node-level faults holds k turns while it runs (see the module's doc); any other task goes at
        once."""
        need = node_faults(run.plan)
        if not need:
            yield
            return
        if self._turns is None:
            self._turns = asyncio.Condition()
        turns = max(1, len(self.fleet.node_ids) - 1)
        need = min(need, turns)  # (more is refused with the config; a wave lent fewer nodes still runs, in turn)
        tid, t0 = run.plan.task_id, time.monotonic()
        async with self._turns:
            await self._turns.wait_for(lambda: self.turns_held + need <= turns)
            self.turns_held += need
        node = None
        try:
            while time.monotonic() - t0 < self.TURN_NODE_WAIT_S:
                node = self._free_node()
                if node is not None:
                    break
                await asyncio.sleep(0.1)
            if node is not None:
                self.owner[node], self.owned[tid] = tid, node
            self.timeline(Event.NODE_FAULT_TURN, task=tid, node=node, turns=need,
                          waited_s=round(time.monotonic() - t0, 3),
                          **({} if node else {"why": "no live sandbox node was free of another turn, with another "
                                                     f"live beside it, within {self.TURN_NODE_WAIT_S:.0f} s"}))
            yield
        finally:
            self.owned.pop(tid, None)
            if node is not None and self.owner.get(node) == tid:
                del self.owner[node]
            async with self._turns:
                self.turns_held -= need
                self._turns.notify_all()

    def _free_node(self) -> str | None:
        """A live sandbox node no turn owns, with another live node beside it; the least loaded."""
        live = [n for n in self.fleet.node_ids if n not in self.out and n not in self.fleet.down]
        free = [n for n in live if n not in self.owner]
        if not free or len(live) < 2:
            return None
        return min(free, key=lambda n: (self._reference_on(n), self.load.get(n, 0), self.fleet.node_ids.index(n)))

    def host(self, node: str):
        return self.parts.hosts[self.fleet.node_ids.index(node)]

    def _reference_on(self, node: str) -> bool:
        return any(r.current is not None and r.node == node and r.plan.role == "reference"
                   for r in self.runs.values())

    async def lose(self, node: str, mode: str, grace_s: float, down_s: float, instance: str, task_id: str) -> dict:
        """PK3. Lost = its host process SIGKILLed (the sandboxes die with it) and its raylet killed; what the dead
        host could not remove (workspace mounts, cgroups) goes with the machine. The node comes back `down_s`
        later."""
        if node in self.out:
            return {"applied": False, "why": f"node {node} was already draining or lost"}
        waited = await self._wait_for_another_node(node)
        if node in self.out:
            return {"applied": False, "why": f"node {node} was taken by another fault while this one waited for a "
                                             "node to come back"}
        if not self._live_besides(node):
            return {"applied": False, "why": f"node {node} is the last live sandbox node; a wave keeps one to finish "
                                             "its tasks on" + (f" (waited {waited:.1f} s for a lost node to come "
                                                               "back)" if waited else "")}
        self.out.add(node)  # from now on no attempt is placed there
        host = self.host(node)
        t_wait = time.monotonic()
        while time.monotonic() - t_wait < 60 and self._reference_on(node):  # a positive control: never interrupted
            await asyncio.sleep(0.05)
        if self._reference_on(node):
            self.out.discard(node)
            return {"applied": False, "why": f"a reference run (the positive control) still ran on {node} after 60 s"}
        own = self.runs[task_id]
        if not (own.current is not None and own.node == node):
            self.out.discard(node)  # the task moved on or ended while this fault waited
            waits = [f"waited {waited:.1f} s for a lost node to come back"] if waited else []
            if time.monotonic() - t_wait >= 0.05:
                waits.append(f"waited {time.monotonic() - t_wait:.1f} s for a reference run there")
            return {"applied": False, "why": f"the task's attempt was no longer on {node} when the node could go "
                                             f"(it ended or moved while this fault {' and '.join(waits) or 'waited'})",
                    **({"waited_for_a_node_back_s": round(waited, 3)} if waited else {})}
        on_node = sorted(sid for sid, n in self.placed.items() if n == node and
                         any(r.current is not None and r.current[1] == sid for r in self.runs.values()))
        out: dict = {"node": node, "mode": mode, "sandboxes": on_node,
                     "waited_for_references_s": round(time.monotonic() - t_wait, 3)}
        if waited:
            out["waited_for_a_node_back_s"] = round(waited, 3)
        t0 = time.time()
        if mode == "drain":
            self.faults[node] = instance  # attempts that end now end because of the drain
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
        if self.detach is not None:
            out["moved"] = await self.detach(node, instance, on_node)
        self.lost[node] = {"instance": instance, "mode": mode, "at": time.time()}
        self.events[node] = asyncio.Event()
        self.timeline(Event.NODE_LOST, node=node, fault=instance, mode=mode, sandboxes=on_node)
        out.update(await asyncio.to_thread(self.fleet.lose_node, node))
        out["reaped"] = await asyncio.to_thread(self.reap, node)
        out["applied"] = True
        self.tasks.append(asyncio.get_running_loop().create_task(self._bring_back(node, down_s, instance)))
        return out

    # -- the node's link to the head (NP1, NP2: isolated nodes only) ----------------------------------------------

    def _link_refusal(self, node: str, fid: str) -> str | None:
        if getattr(getattr(self.fleet, "ray_session", None), "isolated", None) is None:
            return (f"{fid} needs isolated nodes (--isolated-nodes): a simulated node shares the machine's loopback "
                    "and has no link of its own")
        if node in self.out:
            return f"node {node} was already cut off, draining or lost"
        return None

    def _on(self, node: str) -> list[str]:
        return sorted(sid for sid, n in self.placed.items() if n == node and
                      any(r.current is not None and r.current[1] == sid for r in self.runs.values()))

    async def partition(self, node: str, cut_s: float, instance: str, task_id: str, fencing: bool) -> dict:
        """NP1. The node's link goes down for `cut_s`. Nothing is placed there meanwhile, its host is not probed,
        and every attempt running there is given up (as a driver must when a machine stops answering: it cannot
        tell a cut from a death) with its keys revoked, unless `fencing` is off (the negative control). Then the
        link heals and the node is used again once its host answers (bounded)."""
        from fleet.refs import awaitable

        why = self._link_refusal(node, "NP1")
        if why:
            return {"applied": False, "why": why}
        t_other = time.monotonic()
        while not self._live_besides(node) and self.faults and time.monotonic() - t_other < self.BACK_WAIT_S:
            await asyncio.sleep(0.05)  # another node is cut off or lost and on its way back
        waited = round(time.monotonic() - t_other, 3) if time.monotonic() - t_other >= 0.05 else 0.0
        if node in self.out or not self._live_besides(node):
            return {"applied": False, "why": f"node {node} is the last live sandbox node; its tasks would have "
                                             "nowhere to go while it is cut off"
                                             + (f" (waited {waited:.1f} s for another node)" if waited else "")}
        self.out.add(node)
        t_wait = time.monotonic()
        while time.monotonic() - t_wait < 60 and self._reference_on(node):  # a positive control: never cut
            await asyncio.sleep(0.05)
        own = self.runs[task_id]
        if self._reference_on(node) or not (own.current is not None and own.node == node):
            self.out.discard(node)
            return {"applied": False, "why": f"the task's attempt was no longer on {node} when its link could be cut"
                                             if not self._reference_on(node) else
                                             f"a reference run (the positive control) still ran on {node} after 60 s"}
        on_node = self._on(node)
        self.faults[node] = instance
        try:
            cut = await asyncio.to_thread(self.fleet.link, node, "cut")
        except Exception as exc:  # noqa: BLE001
            self.out.discard(node)
            self.faults.pop(node, None)
            return {"applied": False, "why": f"the link could not be cut: {type(exc).__name__}: {str(exc)[:200]}"}
        try:
            self.timeline(Event.LINK_CUT, node=node, fault=instance, link=cut["link"], sandboxes=on_node,
                          fencing=fencing)
            cause = (f"cut off: node {node}'s link to the head went down ({instance}); abandoned, a zombie now"
                     + ("" if fencing else " (fencing off: its keys were left valid)"))
            for r in self.runs.values():
                if r.current is not None and r.node == node and r.abandon_ev is not None:
                    r.abandon = {"instance": instance, "at": cut["at"], "fence": fencing, "cause": cause}
                    r.abandon_ev.set()
            await asyncio.sleep(max(0.0, cut["at"] + cut_s - time.time()))
        finally:  # a cut link is always healed, whatever happened meanwhile
            healed = await asyncio.to_thread(self.fleet.link, node, "heal")
        self.timeline(Event.LINK_HEALED, node=node, fault=instance, **healed)
        out = {"applied": True, "node": node, "link": cut["link"], "at": cut["at"], "healed_at": healed.get("at"),
               "cut_s": round((healed.get("at") or time.time()) - cut["at"], 3), "sandboxes": on_node}
        host, t0 = self.host(node), time.monotonic()
        while time.monotonic() - t0 < 60:  # its Ray reconnects (gRPC backs off): seconds
            try:
                await asyncio.wait_for(awaitable(host.ping.remote()), 5)
                out.update(host_back=True, back_after_heal_s=round(time.monotonic() - t0, 3))
                break
            except Exception as exc:  # noqa: BLE001
                out["why_not_back"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                await asyncio.sleep(0.2)
        self.faults.pop(node, None)
        if out.get("host_back"):
            self.out.discard(node)
            out.pop("why_not_back", None)
        else:  # Ray gave the node up for dead: it stays out of the wave (nothing is left there to sweep)
            self.fleet.down.add(node)
            self.timeline(Event.NODE_LOST, node=node, fault=instance, mode="partition", sandboxes=on_node)
        return out

    async def degrade(self, node: str, window_s: float, instance: str, **knobs) -> dict:
        """NP2. The node's link carries less (loss, rate, delay, jitter) for `window_s`, then as before."""
        why = self._link_refusal(node, "NP2")
        if why:
            return {"applied": False, "why": why}
        on_node = self._on(node)
        try:
            got = await asyncio.to_thread(self.fleet.link, node, "degrade", **knobs)
        except Exception as exc:  # noqa: BLE001
            return {"applied": False, "why": f"the link could not be degraded: {type(exc).__name__}: {str(exc)[:200]}"}
        if not [k for k in ("loss_pct", "rate_kbit", "delay_ms") if k in got]:
            restored = await asyncio.to_thread(self.fleet.link, node, "restore")
            return {"applied": False, "node": node, "why": f"nothing could be applied: {'; '.join(got['not_applied'])}",
                    "restored": restored}
        self.timeline(Event.LINK_DEGRADED, node=node, fault=instance, **{k: v for k, v in got.items() if k != "at"})
        await asyncio.sleep(max(0.0, got["at"] + window_s - time.time()))
        restored = await asyncio.to_thread(self.fleet.link, node, "restore")
        self.timeline(Event.LINK_RESTORED, node=node, fault=instance, **restored)
        return dict(got, applied=True, node=node, sandboxes=on_node, restored=restored)

    def _live_besides(self, node: str) -> list[str]:
        return [n for n in self.fleet.node_ids if n != node and n not in self.out and n not in self.fleet.down]

    BACK_WAIT_S = 120.0  # how long a PK3 that would take the last live node waits for a lost one to come back

    async def _wait_for_another_node(self, node: str) -> float:
        """When `node` is the last live sandbox node but another is lost and on its way back, wait (bounded) until
        one is back, so the fault can apply instead of being `not_applied`; returns the seconds waited (0: no
        wait was needed or possible)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.BACK_WAIT_S:
            if self._live_besides(node):
                break
            coming = [self.events[n] for n in self.lost if n != node and n in self.events
                      and not self.events[n].is_set()]
            if not coming:
                break
            waits = {asyncio.ensure_future(e.wait()) for e in coming}
            try:
                await asyncio.wait(waits, timeout=max(0.01, self.BACK_WAIT_S - (time.monotonic() - t0)),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        return time.monotonic() - t0 if time.monotonic() - t0 >= 0.001 else 0.0

    def reap(self, node: str) -> list[str]:
        """The lost machine's leftovers on this (shared) machine: its sandboxes' cgroups and workspace mounts (an
        isolated node left none here: its mounts went with its namespace, its cgroups with its subtree)."""
        if getattr(self.fleet, "remote", False):
            return []
        from fleet import cgroups
        from fleet.backends import reap_leftover
        from fleet.dockerapi import list_containers

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

    async def _bring_back(self, node: str, down_s: float, instance: str) -> None:
        """The node comes back `down_s` after it was lost, or as soon as every task of the wave has ended: from
        then on nothing can run on it or miss it, and the wave would only wait (the node_back event says so)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + down_s
        while loop.time() < until and not self.all_ended():
            await asyncio.sleep(min(0.1, max(0.0, until - loop.time())))
        early = loop.time() < until
        try:
            back = await asyncio.to_thread(self.fleet.restore_node, node)
            back["down_s"] = round(time.time() - self.lost[node]["at"], 3)
            back["planned_down_s"] = round(down_s, 3)
            if early:
                back["cut_short"] = "every task of the wave had ended: nothing was left to run or to miss the node"
            self.back_info[node] = back
            self.timeline(Event.NODE_BACK, fault=instance, **back)
        except Exception as exc:  # noqa: BLE001
            self.back_info[node] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            self.timeline(Event.NODE_NOT_BACK, node=node, fault=instance, **self.back_info[node])
        finally:
            self.out.discard(node)
            self.lost.pop(node, None)
            self.faults.pop(node, None)
            self.events[node].set()

    async def back(self, node: str) -> dict:
        """Wait (bounded) until the lost node is back; the task that planned the fault ending meanwhile (which
        cancels its fault) does not cut the wait short: the fault's receipt says when the node came back."""
        ev = self.events.get(node)
        deadline = time.monotonic() + 120
        while ev is not None and not ev.is_set() and time.monotonic() < deadline:
            try:
                await asyncio.wait_for(ev.wait(), max(0.01, deadline - time.monotonic()))
            except (asyncio.CancelledError, asyncio.TimeoutError):
                continue
        return dict(self.back_info.get(node, {}), back=node not in self.fleet.down)
