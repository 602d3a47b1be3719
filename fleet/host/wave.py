"""A wave's handle on the fleet's hosts: a per-sandbox call takes the wave's sandbox id and reaches the host with
the sandbox's key (`<wave>/<sandbox>`), so a wave names only its own sandboxes on a host other waves share."""
from __future__ import annotations

from fleet.sandbox import sandbox_key

PER_SANDBOX = frozenset({"started", "kill", "watch_checkpoints", "notify", "freeze_attempt", "thaw_attempt",
                         "is_running", "terminate", "fill_workspace", "drain_workspace"})


class WaveHost:
    """One wave's handle on a host actor that other waves may share (a `sandfleet up` fleet's): a per-sandbox call
    takes the wave's sandbox id and reaches the host with the sandbox's key, so a wave names only its own
    sandboxes. Every other call goes to the actor as it is."""

    __slots__ = ("actor", "wave_id")

    def __init__(self, actor, wave_id: str):
        self.actor, self.wave_id = actor, wave_id

    def __getattr__(self, name: str):
        method = getattr(self.actor, name)
        return _Keyed(method, self.wave_id) if name in PER_SANDBOX else method


class _Keyed:
    __slots__ = ("method", "wave_id")

    def __init__(self, method, wave_id: str):
        self.method, self.wave_id = method, wave_id

    def remote(self, sandbox_id: str, *args, **kwargs):
        return self.method.remote(sandbox_key(self.wave_id, sandbox_id), *args, **kwargs)


class WaveHosts:
    """The wave's view of the fleet's host list (by node index, as `fleet.node_ids`); a host the fleet replaced
    (a healed node) is seen at once."""

    def __init__(self, hosts: list, wave_id: str):
        self.hosts, self.wave_id = hosts, wave_id

    def __getitem__(self, i: int) -> WaveHost:
        return WaveHost(self.hosts[i], self.wave_id)

    def __len__(self) -> int:
        return len(self.hosts)

    def __iter__(self):
        return (WaveHost(h, self.wave_id) for h in self.hosts)
