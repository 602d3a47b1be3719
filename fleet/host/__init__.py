"""The sandbox host: one async actor per node that owns many sandboxes (`SandboxHost`, a thin shell composed of
the rooms below; `start_host_actor` makes it remote at the edge). Rooms:

- `actor`: `SandboxHost` (attempts, faults aimed at a sandbox, shutdown), `HollowHost`, `start_host_actor`.
- `leases`: the held leases, renewed in one batched ledger call per tick.
- `relay`: the watch on the compiled sandbox relay, and the probe of the head's services through the gate.
- `nodedir`: the host's own dir on its node (remote attempts: staged code, credentials, runner logs).
- `volumes`: a task's kept volume (keep, move, the crash modes).
- `watches`: kills at the runner's Nth disk boundary or named window.
- `sweep`: the node's sandboxes no lease covers; the sweep actor's scan and reap here.
- `workspace_io`: what the host writes into or reads from a hostile workspace.
- `wave`: a wave's handle on hosts other waves share (`WaveHost`, `WaveHosts`).
"""
from fleet.host.actor import HollowHost, SandboxHost, start_host_actor
from fleet.host.nodedir import LOG_CAP
from fleet.host.relay import PROBE_PATHS, RELAY_ANSWER_S, RELAY_CHECK_S
from fleet.host.wave import PER_SANDBOX, WaveHost, WaveHosts
from fleet.host.workspace_io import BALLAST, CheckpointReader

__all__ = ["BALLAST", "LOG_CAP", "PER_SANDBOX", "PROBE_PATHS", "RELAY_ANSWER_S", "RELAY_CHECK_S", "CheckpointReader",
           "HollowHost", "SandboxHost", "WaveHost", "WaveHosts", "start_host_actor"]
