"""The health watch names the part that died: a fault proxy that ended because its compiled relay (the process that
owns the proxy's port) exited is named by the relay, not as an exit of the proxy (a hostile review's find)."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from cluster.wave.health import Health
from storage.proxy.handler import RELAY_LOST_EXIT


def _health(proxy_exit: int) -> tuple[Health, subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({proxy_exit})"])
    proc.wait(30)
    alive = SimpleNamespace(is_alive=lambda: True)
    parts = SimpleNamespace(fleet=SimpleNamespace(), store=SimpleNamespace(proc=None),
                            proxy=SimpleNamespace(proc=proc), model=SimpleNamespace(thread=alive),
                            effects=SimpleNamespace(thread=alive))
    return Health(SimpleNamespace(), lambda *a, **k: None, parts, SimpleNamespace(out=set()), lambda: None), proc


def test_a_proxy_that_ended_with_its_relay_names_the_relay():
    h, proc = _health(RELAY_LOST_EXIT)
    part, why = h.dead_process()
    assert part == "fault proxy" and "compiled relay (sandfleet-relay" in why and str(proc.pid) in why


def test_a_proxy_that_died_itself_is_named_by_its_exit():
    h, proc = _health(1)
    part, why = h.dead_process()
    assert part == "fault proxy" and why.startswith(f"pid {proc.pid} exited") and "relay" not in why
