"""Hostile review finds in the disk-mode config: a check across fields named `(top level)` (or an unrelated field)
instead of the field it is about; a boundary's count accepted `true` and strings (cast to 1 and 3); and a
crash-mode disk (`sandbox.disk: torn`) accepted beside faults that never kill a sandbox that could keep it."""
from __future__ import annotations

import pytest

from cluster.config import ConfigError, build_config

TORN = {"sandbox": {"disk": "torn"}, "faults": ["PK1"]}


@pytest.mark.parametrize("data, field", [
    ({"faults": ["PK1"], "fault_timing": {"PK1": {"after_disk_writes": [1, 2]}}},
     "field `fault_timing.PK1.after_disk_writes`: value [1, 2]"),
    ({"faults": ["ST1"], "fault_timing": {"ST1": {"disk": "torn"}}}, "field `fault_timing.ST1.disk`: value 'torn'"),
    ({"sandbox": {"disk": "torn"}, "faults": ["PK3"], "nodes": 3}, "field `sandbox.disk`: value 'torn'"),
    (dict(TORN, fault_timing={"ST1": {"after_disk_fsyncs": [1, 1]}}),
     "field `fault_timing.ST1.after_disk_fsyncs`: value [1, 1]"),
])
def test_a_disk_mode_error_names_its_field_not_the_top_level(data, field):
    with pytest.raises(ConfigError) as exc:
        build_config(data)
    assert field in str(exc.value) and "(top level)" not in str(exc.value), str(exc.value)


@pytest.mark.parametrize("kind", ["after_disk_writes", "after_disk_fsyncs", "after_disk_renames",
                                  "after_model_calls"])
@pytest.mark.parametrize("bad", [[True, 2], [1, True], ["1", "3"], [1.0, 2], [0, 2], [3, 2], [1], "1-2", True])
def test_a_boundary_count_is_a_strict_int_range(kind, bad):
    with pytest.raises(ConfigError) as exc:
        build_config(dict(TORN, fault_timing={"PK1": {kind: bad}}))
    assert f"fault_timing.PK1.{kind}" in str(exc.value), str(exc.value)
    assert build_config(dict(TORN, fault_timing={"PK1": {kind: [1, 2]}})).fault_timing["PK1"].model_dump()[kind] \
        == (1, 2)


@pytest.mark.parametrize("mode", ["torn", "lose-unsynced"])
@pytest.mark.parametrize("faults", [["ST1"], ["ST3", "CR1"], ["DF1"], []])
def test_a_crash_mode_disk_needs_an_interruption_that_kills_the_sandbox(mode, faults):
    with pytest.raises(ConfigError) as exc:
        build_config({"sandbox": {"disk": mode}, "faults": faults})
    msg = str(exc.value)
    assert f"field `sandbox.disk`: value {mode!r}" in msg and "kills the sandbox" in msg and "PK1" in msg, msg
    build_config({"sandbox": {"disk": mode}, "faults": faults + ["PK1"]})  # with a kill it is a wave
    build_config({"sandbox": {"disk": mode}, "enumerate_boundaries": True})  # PK1 at every boundary
