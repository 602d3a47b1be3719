"""The sandbox backends of a host behind one interface, and the reaper of a sandbox known only by its markers.

The factory makes the docker backend on first use (its SDK is imported only then); the reaper removes a
sandbox's cgroup, workspace mount and container without a handle. Both sit above fleet/sandbox/ and
fleet/docker_backend.py so that neither of those imports the other.
"""
from __future__ import annotations

from pathlib import Path

from fleet import cgroups
from fleet.dockerapi import list_containers, remove_container
from fleet.sandbox import ProcessBackend, SandboxBackend, SandboxError, SandboxSpec, unmount_workspace


class Backends:
    """Every sandbox backend of a host behind the one backend interface: each call goes to the backend the
    sandbox's spec names (`process`, or `docker`, made on first use)."""

    def __init__(self):
        self.by_name: dict[str, SandboxBackend] = {"process": ProcessBackend()}

    def get(self, name: str) -> SandboxBackend:
        if name not in self.by_name:
            if name != "docker":
                raise SandboxError(f"unknown sandbox backend {name!r}; valid: process, docker")
            from fleet.docker_backend import DockerBackend

            self.by_name[name] = DockerBackend()
        return self.by_name[name]

    @property
    def sandboxes(self) -> dict:
        out: dict = {}
        for b in self.by_name.values():
            out.update(b.sandboxes)
        return out

    def command_problem(self, spec: SandboxSpec) -> str | None:
        return self.get(spec.backend).command_problem(spec)

    def relayed_by(self, key: str):
        return next((f for b in self.by_name.values() if (f := b.relayed_by(key)) is not None), None)

    async def start(self, spec: SandboxSpec):
        return await self.get(spec.backend).start(spec)

    async def kill(self, sb, grace_s: float = 0.0, reason: str = "kill") -> bool:
        return await self.get(sb.spec.backend).kill(sb, grace_s, reason=reason)

    async def wait(self, sb) -> int:
        return await self.get(sb.spec.backend).wait(sb)

    async def remove(self, sb) -> None:
        return await self.get(sb.spec.backend).remove(sb)

    async def collect(self, sb, subdir: str) -> dict:
        return await self.get(sb.spec.backend).collect(sb, subdir)

    async def freeze(self, sb) -> bool:
        return await self.get(sb.spec.backend).freeze(sb)

    async def thaw(self, sb) -> bool:
        return await self.get(sb.spec.backend).thaw(sb)

    async def terminate(self, sb) -> bool:
        return await self.get(sb.spec.backend).terminate(sb)


def reap_leftover(wave_id: str, sandbox_id: str) -> dict:
    """Kill and remove a sandbox found only by its cgroup marker (no handle in this process)."""
    cg = cgroups.SandboxCgroup(wave_id, sandbox_id)
    pids = cg.pids()
    cg.thaw()
    emptied = cg.kill_all()
    cg.remove()
    source = f"sandfleet-ws.{wave_id}.{sandbox_id}"
    containers = [c for c in list_containers(wave_id) or [] if c["sandbox"] == sandbox_id]
    for c in containers:  # a docker sandbox: its container goes (force: killed if it runs)
        remove_container(c["id"])
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[1].split()[1:2] == [source]:
            unmount_workspace(line.split()[4])
    return {"wave_id": wave_id, "sandbox_id": sandbox_id, "pids": pids, "emptied": emptied,
            "removed": not cg.exists(), "containers": [c["name"] for c in containers]}
