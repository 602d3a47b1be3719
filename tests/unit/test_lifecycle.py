import pytest

from fleet.lifecycle import (LEASE_TRANSITIONS, SANDBOX_TRANSITIONS, TASK_TRANSITIONS, InvalidTransition,
                             Lifecycle)


@pytest.mark.parametrize("table", [SANDBOX_TRANSITIONS, LEASE_TRANSITIONS, TASK_TRANSITIONS])
def test_every_edge_is_walkable_and_recorded(table):
    ticks = iter(range(10_000))
    for src, dests in table.items():
        for dst in dests:
            life = Lifecycle(table, src, clock=lambda: next(ticks))
            life.to(dst, "why")
            assert life.state == dst
            assert life.history[-1][1:] == (src.value, dst.value, "why")


@pytest.mark.parametrize("table", [SANDBOX_TRANSITIONS, LEASE_TRANSITIONS, TASK_TRANSITIONS])
def test_edges_not_in_the_table_are_refused(table):
    for src, dests in table.items():
        for dst in set(table) - set(dests):
            life = Lifecycle(table, src)
            with pytest.raises(InvalidTransition, match=src.value):
                life.to(dst)
            assert life.state == src and life.history == []
