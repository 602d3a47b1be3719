"""Boundary enumeration on a kept disk: the runner's own writes, fsyncs and renames (counted by the lazy file
system) are boundaries beside its model answers, effects and store writes; a seeded sample keeps some of each."""
from __future__ import annotations

import pytest

from cluster.config import ConfigError, build_config
from cluster.wave.plan import build_plan, enumerate_tasks
from faults import CATALOG
from faults.base import FaultSpec

COUNTS = {"model_call": 5, "effect": 1, "store_write": 6, "disk_write": 40, "disk_fsync": 12, "disk_rename": 6}


def _plan(seed: int = 5, **extra) -> dict:
    return build_plan(build_config({"faults": ["PK1"], "seed": seed, "enumerate_boundaries": True,
                                    "sandbox": {"disk": "keep"}, **extra}), "w-x")


def test_every_disk_boundary_is_a_task_when_no_sample_is_asked():
    tasks = enumerate_tasks(_plan(), COUNTS, None)
    kinds = [t["boundary"]["kind"] for t in tasks]
    assert len(tasks) == 5 + 1 + 12 + 40 + 12 + 6
    assert [(t["boundary"]["kind"], t["boundary"]["n"]) for t in tasks if t["boundary"]["kind"] == "disk_rename"] \
        == [("disk_rename", n) for n in range(1, 7)]
    assert {"disk_write", "disk_fsync", "disk_rename", "model_call"} <= set(kinds)


def test_a_disk_boundary_arms_pk1_on_the_attempts_host():
    t = next(t for t in enumerate_tasks(_plan(), COUNTS, None) if t["boundary"]["kind"] == "disk_fsync")
    spec = FaultSpec(**t["faults"][0])
    assert CATALOG["PK1"].attempt_arm(spec) == {"kind": "disk", "op": "fsync", "nth": 1, "reason": spec.instance}


@pytest.mark.parametrize("limit", [1, 3, 5, 8])
def test_a_sample_gives_the_disk_half_and_one_of_each_kind_first_the_same_for_a_seed(limit):
    tasks = enumerate_tasks(_plan(), COUNTS, limit)
    assert len(tasks) == limit
    disk = [t["boundary"]["kind"] for t in tasks if t["boundary"]["kind"].startswith("disk_")]
    assert len(disk) == (limit + 1) // 2
    assert set(disk) == {"disk_write", "disk_fsync", "disk_rename"} if limit >= 5 else len(set(disk)) == len(disk)
    again = enumerate_tasks(_plan(), COUNTS, limit)
    assert [t["boundary"] for t in again] == [t["boundary"] for t in tasks]
    assert [t["boundary"] for t in enumerate_tasks(_plan(seed=6), COUNTS, 8)] != \
        [t["boundary"] for t in enumerate_tasks(_plan(), COUNTS, 8)]


def test_without_disk_boundaries_the_sample_is_the_one_it_always_was():
    counts = {"model_call": 5, "effect": 1, "store_write": 6}
    tasks = enumerate_tasks(_plan(), counts, 4)
    import random

    from faults.planner import derive

    points = [("model_call", n) for n in range(1, 6)] + [("effect", 1)] + \
        [("store_write", n) for n in range(1, 7) for _ in (0, 1)]
    keep = sorted(derive(5, "boundaries").sample(range(len(points)), 4))
    assert [(t["boundary"]["kind"], t["boundary"]["n"]) for t in tasks] == [points[i] for i in keep]
    assert isinstance(derive(5, "boundaries"), random.Random)


def test_a_disk_boundary_on_keep_is_served_by_the_lazy_layer_and_wipe_is_refused():
    keep = build_config({"faults": ["PK1"], "sandbox": {"disk": "keep"},
                         "fault_timing": {"PK1": {"after_disk_renames": [1, 2]}}})
    assert keep.lazy_volumes() and not keep.lazy_disks()
    assert build_config({"faults": ["PK1"], "enumerate_boundaries": True, "sandbox": {"disk": "keep"}}).lazy_volumes()
    assert not build_config({"faults": ["PK1"], "sandbox": {"disk": "keep"}}).lazy_volumes()
    assert not build_config({"faults": ["PK1"], "enumerate_boundaries": True}).lazy_volumes()
    with pytest.raises(ConfigError, match="fault_timing.PK1.after_disk_writes"):
        build_config({"faults": ["PK1"], "fault_timing": {"PK1": {"after_disk_writes": [1, 2]}}})
