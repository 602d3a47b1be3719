"""A host's paths to the head: the watch on its compiled sandbox relay (fleet/netns.py) and the probe of the head's
services through the gate, run where the sandboxes are."""
from __future__ import annotations

import asyncio

from fleet.wire import preface

RELAY_CHECK_S = 1.0  # how often a host asks its compiled sandbox relay whether it still serves
RELAY_ANSWER_S = 5.0  # and how long it waits for the answer before it calls the relay hung
PROBE_PATHS = {"s3": "/.sandfleet/health", "model": "/v1/models", "effects": "/"}  # (the proxy's: unlogged)


class RelayWatch:
    """Runs while sandboxes run on the host (`ensure` starts it; it ends when none is left)."""

    def __init__(self, host):
        self.host = host
        self.task: asyncio.Task | None = None

    def ensure(self) -> None:
        if self.task is None:
            self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        """While sandboxes run here: the compiled relay their loopback listeners were handed to (fleet/netns.py)
        still answers, or every sandbox it relayed has lost its network and is ended as the harness's fault
        (`harness_part`: the wave ends on it, and no runner is blamed). A dead or hung relay is replaced for the
        sandboxes that start after."""
        from fleet import netns

        try:
            while self.host.backend.sandboxes or self.host.in_flight:
                await asyncio.sleep(RELAY_CHECK_S)
                lost = await asyncio.to_thread(netns.forwarder_lost, RELAY_ANSWER_S)
                if lost is None:
                    continue
                fwd, why = lost
                part = f"sandbox relay {self.host.node_id}"
                for key, sb in list(self.host.backend.sandboxes.items()):
                    if self.host.backend.relayed_by(key) is fwd:
                        sb.extra["harness_part"] = part
                        asyncio.create_task(self.host.backend.kill(sb, 0.0, reason=f"{part} lost: {why}"))
        finally:
            self.task = None


async def probe_head(targets: dict[str, str], token: str, timeout_s: float,
                 paths: dict[str, str] | None = None) -> dict[str, str | None]:
    """From this node, each of the head's services through its gate, end to end as a sandbox's relay goes
    (`host:port/service`, the relay token line, then an HTTP request): service -> None (it answered) or why
    not. Run where the sandboxes are, so a broken node-to-head path is seen as that node's."""
    async def one(service: str, target: str) -> str | None:
        addr, _, name = target.partition("/")
        host, _, port = addr.rpartition(":")
        w = None
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout_s)
            w.write(preface(token, name) + f"GET {(paths or PROBE_PATHS).get(service, '/')} HTTP/1.0\r\n"
                                           f"Host: {host}\r\n\r\n".encode())
            await w.drain()
            got = await asyncio.wait_for(r.read(1), timeout_s)
            return None if got else f"the gate at {addr} closed the {name} connection without an answer"
        except asyncio.TimeoutError:
            return f"no answer from the {name} service through the gate at {addr} within {timeout_s:g} s"
        except OSError as exc:
            return f"no connection to the gate at {addr} ({exc.strerror or exc})"
        finally:
            if w is not None:
                w.close()

    got = await asyncio.gather(*(one(s, t) for s, t in targets.items()))
    return dict(zip(targets, got))
