"""PK3's and NP1's side of the fleet: a sandbox node lost at once and brought back (an autoscaler replacing a spot
VM), and an isolated node's link cut, degraded or healed. `FleetSession` (`cluster/raycluster.py`) has these."""
from __future__ import annotations

import os


def drop_harness_dir(info: dict, timeout_s: float = 5.0) -> None:
    """Remove a (killed) host's harness cgroup once its process is gone; its parent too when empty."""
    import time
    from pathlib import Path

    d = Path(info.get("cgroup") or "")
    deadline = time.monotonic() + timeout_s
    while d.name and d.is_dir():
        try:
            d.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
            continue
        try:
            d.parent.rmdir()
        except OSError:
            pass


class NodeChanges:
    """What a fleet does to its sandbox nodes for a node-level fault; a `FleetSession` holds the state it uses
    (`node_ids`, `hosts`, `host_info`, `down`, `ray_session`, `remote`, `on_restore`)."""

    def lose_node(self, name: str) -> dict:
        """A sandbox node goes away at once, with every sandbox on it: its host process is SIGKILLed (bubblewrap's
        --die-with-parent takes the sandboxes with it), then its raylet and Ray's other processes for it."""
        import signal
        import time

        if self.nodes == 1:
            raise RuntimeError("a one-node fleet has no node to lose (the head holds the harness)")
        i = self.node_ids.index(name)
        t = time.time()
        self.down.add(name)
        if self.remote:  # the whole node goes at once (its pid namespace); its host's pid means nothing here
            try:
                self._tell_sweeper()  # before it goes: its scan not answering is no finding
            except Exception:  # noqa: BLE001 - a lost sweep actor is the wave's to notice, not this fault's
                pass
            self.ray_session.remove_node(name)
            return {"node": name, "at": t}
        try:
            os.kill(self.host_info[i]["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.ray_session.remove_node(name)
        drop_harness_dir(self.host_info[i])
        return {"node": name, "host_pid": self.host_info[i]["pid"], "at": t}

    def restore_node(self, name: str) -> dict:
        """Bring a lost node back as a new Ray node with the same name (an autoscaler replacing a spot VM)."""
        import time

        import ray


        i = self.node_ids.index(name)
        t = time.time()
        self.ray_session.add_node(name)
        if self.remote:
            self.node_placement[name] = self.ray_session.node_id(name)
        h = self._start_host(name)
        self.host_info[i] = ray.get(h.join_harness.remote(), timeout=120)
        if self.on_restore is not None:  # what the wave gives every node (its runner's code) before it is used
            self.on_restore(name, h)
        self.hosts[i] = h
        self.down.discard(name)
        if self.remote:
            self._tell_sweeper()
        out = {"node": name, "back_after_s": round(time.time() - t, 3)}
        return out if self.remote else dict(out, host_pid=self.host_info[i]["pid"])

    def link(self, name: str, action: str, **knobs) -> dict:
        """NP1 and NP2 on a sandbox node's link to the head: `cut`, `heal`, `degrade` (loss_pct, rate_kbit,
        delay_ms, jitter_ms) or `restore`. Only isolated nodes have a link of their own: elsewhere a RuntimeError
        (the fault is then not applied)."""
        iso = self.ray_session.isolated
        if not self.remote or iso is None:
            raise RuntimeError("network faults need isolated nodes (--isolated-nodes): a simulated node shares the "
                               "machine's loopback and has no link to cut")
        if name not in iso.nodes:
            raise RuntimeError(f"node {name} is not a sandbox node of this fleet")
        return getattr(iso, action)(name, **knobs)
