"""A task's disk across its attempts, when the wave keeps disks (`sandbox.disk` or a fault's `disk` other than
`wipe`): the mode its next attempt starts on, the volume a PK3 `move` detaches from a node about to go, the receipt
that names what became of the disk, and the volume dropped when the task ends. `Attempts` holds one."""
from __future__ import annotations

import asyncio

from cluster.wave.errors import first_line
from cluster.wave.timeline import TaskRun


def instance_of(run: TaskRun, killed_by: str | None) -> str | None:
    """The planned fault instance a kill came from: a fault that kills more than once (PK4) names each kill
    `<instance>#<n>`. Anything else (a deadline, a silence) is returned as it is and matches no fault."""
    if not killed_by:
        return killed_by
    for f in run.plan.faults:
        inst = f.get("instance")
        if inst and (killed_by == inst or (killed_by.startswith(f"{inst}#") and killed_by[len(inst) + 1:].isdigit())):
            return inst
    return killed_by


class TaskDisks:
    def __init__(self, cfg, wave_id: str, nodes, injector, context, fleet_down):
        """`fleet_down()`: the nodes whose host is gone (no volume to drop there)."""
        self.cfg = cfg
        self.wave_id = wave_id
        self.nodes = nodes
        self.injector = injector
        self.context = context
        self.fleet_down = fleet_down
        self.moved: dict[str, dict] = {}  # task id -> its volume detached from a lost node (`move`), for its next

    def next(self, run: TaskRun) -> dict | None:
        """The task's disk for its next attempt, when the wave keeps disks: {"mode", "after"}: the mode its last
        attempt's end leaves (the fault that ended it: fault_timing.<id>.disk, else sandbox.disk)."""
        if not self.cfg.keeps_disks():
            return None
        by = run.last_killed_by
        fid = next((f["fault_id"] for f in run.plan.faults if f.get("instance") == by), None)
        return {"mode": self.cfg.disk_after(fid) if run.attempts else "wipe", "after": by if run.attempts else None}

    async def detach(self, node: str, instance: str, sandboxes: list[str]) -> dict:
        """PK3 with `move`: right before the node goes, each of its running tasks whose disk this loss moves has its
        volume detached by the node's host (its processes stopped, volume read back) and kept here for its next attempt,
        on another node: only Ray carries it. Returns what was detached, per task."""
        from ray.exceptions import RayActorError

        host, out = self.nodes.host(node), {}
        for tid, run in self.context.runs.items():
            if run.current is None or run.current[1] not in sandboxes:
                continue
            fid = next((f["fault_id"] for f in run.plan.faults if f.get("instance") == instance), None)
            if self.cfg.disk_after(fid) != "move":
                continue
            try:
                got = await asyncio.wait_for(host.detach_volume.remote(self.wave_id, run.current[1], tid), 60)
            except (RayActorError, asyncio.TimeoutError) as exc:
                out[tid] = {"moved": False, "why": f"its host could not read the volume back: {first_line(exc)}"}
                continue
            if got.get("image") is None:
                out[tid] = {"moved": False, "why": got.get("why")}
                continue
            self.moved[tid] = dict(got, node=node)
            out[tid] = {"moved": True, "files": got["files"], "bytes": got["bytes"], "stopped": got["stopped"]}
        return out

    def receipt(self, disk: dict) -> None:
        """The receipt of the fault that ended the last attempt names what became of the disk (a crash mode: what
        it dropped, or kept of a torn write, once the next attempt's host did it), whether or not that receipt is kept
        yet."""
        if disk.get("after"):
            self.injector.add_evidence(disk["after"], "disk", {k: v for k, v in disk.items() if k != "after"})

    async def drop(self, run: TaskRun) -> None:
        """The task ended: its kept volume goes (bounded; one left is dropped by the hosts' end-of-wave sweep)."""
        if not self.cfg.keeps_disks() or run.node is None or run.node in self.fleet_down():
            return
        try:
            await asyncio.wait_for(self.nodes.host(run.node).drop_volume.remote(self.wave_id, run.plan.task_id), 30)
        except Exception:  # noqa: BLE001 - the teardown's sweep drops what is left
            pass
