"""A kill is traced to the planned fault that made it, a crash loop's numbered kills too."""
from types import SimpleNamespace

from cluster.wave.taskdisk import instance_of


def test_a_kill_names_its_fault_instance_numbered_or_not():
    run = SimpleNamespace(plan=SimpleNamespace(faults=[{"instance": "t000-PK4"}, {"instance": "t000-PK1"}]))
    assert instance_of(run, "t000-PK4#2") == "t000-PK4"
    assert instance_of(run, "t000-PK1") == "t000-PK1"
    assert instance_of(run, "t000-PK4#x") == "t000-PK4#x"  # not a numbered kill: matches no fault
    assert instance_of(run, "deadline") == "deadline" and instance_of(run, None) is None
