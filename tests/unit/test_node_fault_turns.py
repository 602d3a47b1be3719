"""Node-level faults take turns (issue 45): a task that plans PK3 or NP1 owns a node of its own for its turn, with one
fewer turns than sandbox nodes, so two of them never take or cut the same node; a task that needs more turns than the
cluster has is refused with the config (exit 254)."""
import asyncio
from types import SimpleNamespace

import pytest

from cluster.wave.nodes import Nodes, node_faults


def _nodes(n: int) -> tuple[Nodes, list]:
    events: list = []
    fleet = SimpleNamespace(node_ids=[f"node-{i}" for i in range(1, n + 1)], down=set())
    return Nodes(SimpleNamespace(fleet=fleet), {}, lambda ev, **kw: events.append((ev, kw)), "w", lambda: False), events


def _run(tid: str, *fids: str):
    return SimpleNamespace(plan=SimpleNamespace(task_id=tid, faults=[{"fault_id": f} for f in fids]))


def test_a_task_counts_its_node_level_faults_only():
    assert node_faults(_run("t0", "PK3").plan) == 1
    assert node_faults(_run("t0", "PK3", "NP1", "PK1").plan) == 2
    assert node_faults(_run("t0", "PK1", "ST1", "NP2").plan) == 0


def test_two_sandbox_nodes_give_one_turn_and_its_task_owns_its_node():
    async def main():
        nodes, events = _nodes(2)
        order: list = []
        release = asyncio.Event()

        async def holder(tid: str, wait: asyncio.Event | None):
            async with nodes.turn(_run(tid, "PK3")):
                order.append(("in", tid, nodes.owned[tid]))
                own = nodes.owned[tid]
                assert nodes.place(task_id=tid) == own  # its attempts go to its own node
                nodes.load["node-1"] = 5  # (a busier node does not move it)
                assert nodes.place(task_id=tid) == own
                nodes.load.clear()
                if wait is not None:
                    await wait.wait()
                order.append(("out", tid))

        async def plain():
            async with nodes.turn(_run("t9", "PK1")):  # no node-level fault: no turn, no wait
                order.append(("plain", "t9"))

        first = asyncio.create_task(holder("t0", release))
        await asyncio.sleep(0)
        second = asyncio.create_task(holder("t1", None))
        await asyncio.wait_for(plain(), 5)
        for _ in range(20):
            await asyncio.sleep(0)
        assert [o[:2] for o in order] == [("in", "t0"), ("plain", "t9")]  # t1 waits for the one turn
        release.set()
        await asyncio.wait_for(asyncio.gather(first, second), 5)
        assert [o[:2] for o in order] == [("in", "t0"), ("plain", "t9"), ("out", "t0"), ("in", "t1"), ("out", "t1")]
        assert nodes.turns_held == 0 and not nodes.owner and not nodes.owned
        assert [kw["task"] for ev, kw in events if ev == "node_fault_turn"] == ["t0", "t1"]

    asyncio.run(main())


def test_turns_own_distinct_nodes_and_a_moved_attempt_avoids_the_other_turns_node():
    async def main():
        nodes, _ = _nodes(3)  # two turns
        inside, go = asyncio.Event(), asyncio.Event()

        async def holder(tid: str):
            async with nodes.turn(_run(tid, "NP1")):
                if len(nodes.owned) == 2:
                    inside.set()
                await go.wait()

        tasks = [asyncio.create_task(holder(t)) for t in ("t0", "t1")]
        await asyncio.wait_for(inside.wait(), 5)
        a, b = nodes.owned["t0"], nodes.owned["t1"]
        assert a != b
        nodes.out.add(a)  # t0's fault took its node: its next attempt goes to the node no turn owns
        free = ({"node-1", "node-2", "node-3"} - {a, b}).pop()
        nodes.load[free] = 9
        assert nodes.place(task_id="t0") == free
        assert nodes.place() == b  # a task with no turn: least loaded over every live node
        go.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)

    asyncio.run(main())


def test_a_task_with_two_node_level_faults_holds_two_turns():
    async def main():
        nodes, _ = _nodes(3)
        go, order = asyncio.Event(), []

        async def holder(tid: str, *fids: str):
            async with nodes.turn(_run(tid, *fids)):
                order.append(tid)
                await go.wait()

        big = asyncio.create_task(holder("t0", "PK3", "NP1"))
        await asyncio.sleep(0)
        small = asyncio.create_task(holder("t1", "PK3"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert order == ["t0"] and nodes.turns_held == 2
        go.set()
        await asyncio.wait_for(asyncio.gather(big, small), 5)
        assert order == ["t0", "t1"] and nodes.turns_held == 0

    asyncio.run(main())


def test_two_node_level_faults_on_one_task_need_a_fourth_node():
    from cluster.config import ConfigError, build_config

    with pytest.raises(ConfigError) as err:
        build_config({"faults": ["PK3+NP1"], "nodes": 3, "node_isolation": "namespaces"})
    msg = str(err.value)
    assert "'PK3+NP1'" in msg and "nodes >= 4" in msg and "--nodes 4" in msg and "got nodes 3" in msg, msg
    build_config({"faults": ["PK3+NP1"], "nodes": 4, "node_isolation": "namespaces"})
    build_config({"faults": ["PK3", "NP1"], "nodes": 3, "node_isolation": "namespaces"})  # one per task: fits


def test_the_cli_refuses_two_node_level_faults_on_one_task_before_anything_starts(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    cfg = tmp_path / "w.yaml"
    cfg.write_text("tasks: 2\nfaults: [PK3+NP1]\n")
    p = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--nodes", "3",
                        "--isolated-nodes", "--results", str(tmp_path / "r"), "--no-progress"],
                       cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=60)
    assert p.returncode == 254, (p.stdout, p.stderr)
    assert "'PK3+NP1'" in p.stderr and "--nodes 4" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_a_reference_never_goes_to_a_node_a_turn_owns_and_a_turn_takes_a_node_without_one():
    """A loaded suite's NP1 came out `not_applied` (the cut waits for a reference on its node, the positive control
    is never cut, and the task ended meanwhile): a reference is placed beside the turn's node, and a turn takes a
    node no reference runs on when there is one."""
    async def main():
        nodes, _ = _nodes(2)
        ref = SimpleNamespace(plan=SimpleNamespace(task_id="ref-t0", role="reference", faults=[]), current=None,
                              node=None)
        nodes.runs["ref-t0"] = ref
        ref.current, ref.node = ("a", "sb"), "node-1"  # a reference runs on node-1, the less loaded by number
        async with nodes.turn(_run("t0", "NP1")):
            assert nodes.owned["t0"] == "node-2"
            ref.current = None
            nodes.load.clear()
            assert nodes.place(task_id="ref-t0") == "node-1"  # never the turn's node-2
            nodes.load["node-1"] = 9
            assert nodes.place(task_id="ref-t0") == "node-1"  # however loaded
            assert nodes.place(task_id="t5") == "node-2"  # a plain task goes least-loaded, as ever

    asyncio.run(main())
