"""Manifests: what differs between two waves is named field by field; the runner and the seed are not compared."""
from __future__ import annotations

import copy

from cluster.config import build_config
from cluster.league import manifest_warnings
from cluster.manifest import build, differences, git_revision


def _manifest(runner="durable"):
    cfg = build_config({"runner": runner})
    return build(cfg, cfg.runner_spec(), "digest-of-" + runner)


def test_the_same_machine_and_config_give_the_same_manifest_but_the_runner():
    a, b = _manifest("durable"), _manifest("naive")
    assert a["runner"]["name"] == "durable" and a["runner"]["python"]["packages"] > 0
    assert differences(a, b) == []  # a league varies the runner on purpose
    assert differences(a, b, ignore=()) and all(d.startswith("runner.") for d in differences(a, b, ignore=()))
    assert a["harness"]["git"] == git_revision() and a["nodes"] == {"count": 1, "kind": "local"}


def test_a_different_kernel_or_limit_is_named_and_warned_about():
    a = _manifest()
    b = copy.deepcopy(a)
    b["machine"]["kernel"] = "5.10.0-other"
    b["sandbox"]["memory_mb"] = 128
    diff = differences(a, b)
    assert diff == [f"machine.kernel: {a['machine']['kernel']!r} != '5.10.0-other'", "sandbox.memory_mb: 512 != 128"]
    rows = [{"wave_id": "w-a", "runner": "durable", "manifest": a}, {"wave_id": "w-b", "runner": "naive", "manifest": b},
            {"wave_id": "w-c", "runner": "old", "manifest": None}]
    warn = manifest_warnings(rows)
    assert "different things" in warn[1] and "w-b" in warn[3] and "machine.kernel" in warn[3]
    assert "no manifest" in warn[4]
    assert manifest_warnings(rows[:1]) == []
