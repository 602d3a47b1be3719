"""PK3's node bookkeeping (cluster/wave/nodes.py) with a stand-in fleet: a PK3 that meets the last live sandbox node
while another node is on its way back waits (bounded) for it instead of being `not_applied`."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from cluster.wave.nodes import Nodes


def _nodes() -> Nodes:
    fleet = SimpleNamespace(node_ids=["node-1", "node-2"], down=set())
    return Nodes(SimpleNamespace(fleet=fleet, hosts=[None, None]), {}, lambda *a, **k: None, "w", lambda: False)


def test_a_pk3_that_meets_the_last_live_node_waits_for_a_lost_one_to_come_back():
    async def go():
        n = _nodes()
        n.out.add("node-2")
        n.lost["node-2"] = {"instance": "t000-PK3", "mode": "abrupt", "at": time.time()}
        n.events["node-2"] = asyncio.Event()

        async def back_later():
            await asyncio.sleep(0.3)  # what _bring_back does once the node is restored
            n.out.discard("node-2")
            n.lost.pop("node-2")
            n.events["node-2"].set()

        asyncio.get_running_loop().create_task(back_later())
        waited = await n._wait_for_another_node("node-1")
        return waited, n._live_besides("node-1")

    waited, live = asyncio.run(go())
    assert waited >= 0.25 and live == ["node-2"]


def test_no_wait_when_another_node_is_live_or_none_is_coming_and_the_wait_is_bounded():
    async def go():
        n = _nodes()
        assert await n._wait_for_another_node("node-1") == 0.0  # node-2 is live
        n.out.add("node-2")
        assert await n._wait_for_another_node("node-1") == 0.0  # draining, not lost: nothing is coming back
        n.lost["node-2"] = {"instance": "t000-PK3", "mode": "abrupt", "at": time.time()}
        n.events["node-2"] = asyncio.Event()  # lost and never back
        n.BACK_WAIT_S = 0.3
        t0 = time.monotonic()
        waited = await n._wait_for_another_node("node-1")
        return waited, time.monotonic() - t0, n._live_besides("node-1")

    waited, took, live = asyncio.run(go())
    assert 0.25 <= waited and took < 5 and live == []


def test_a_node_that_did_not_come_back_is_not_counted_live():
    n = _nodes()
    n.fleet.down.add("node-2")
    assert n._live_besides("node-1") == []
