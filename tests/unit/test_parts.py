"""What a wave runs on (issue 44's seams): `Parts` is a record of typed fields, and preflight runs once per wave (the
CLI checks the machine before it writes anything, and the wave's set-up, which checks for a wave made elsewhere: a
league's, a campaign's, a test's, does not check again)."""
from __future__ import annotations

import dataclasses

import pytest

from cluster.config import build_config


class Stop(Exception):
    pass


def test_parts_is_a_record_of_typed_fields():
    from cluster.wave.parts import Parts

    fields = dataclasses.fields(Parts)
    assert len(fields) >= 14
    untyped = [f.name for f in fields if "Any" in str(f.type) or str(f.type) in ("object", "")]
    assert not untyped, f"Parts fields typed Any: {untyped}"
    p = Parts()
    assert p.fleet is None and p.store is None and p.bucket == "" and p.store_lent is False


def test_a_wave_checks_the_machine_once_though_its_set_up_asks_again(monkeypatch, tmp_path):
    from cluster import driver
    from fleet import cgroups

    calls = []
    monkeypatch.setattr(driver, "preflight", lambda cfg: calls.append(cfg))
    wave = driver.WaveRun(build_config({}), tmp_path / "results", progress=False)
    wave.preflight()
    wave.preflight()
    assert len(calls) == 1
    wave.plan = {"manifest": {}}  # (set-up's first steps: the manifest is there; it stops at the harness cgroup)
    monkeypatch.setattr(cgroups, "join_harness", lambda name: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        wave._setup()
    assert len(calls) == 1
    assert not (tmp_path / "results").exists()  # nothing written by any of it


def test_a_wave_made_elsewhere_is_checked_by_its_set_up(monkeypatch, tmp_path):
    from cluster import driver
    from fleet import cgroups

    calls = []
    monkeypatch.setattr(driver, "preflight", lambda cfg: calls.append(cfg))
    wave = driver.WaveRun(build_config({}), tmp_path / "results", progress=False)
    wave.plan = {"manifest": {}}
    monkeypatch.setattr(cgroups, "join_harness", lambda name: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        wave._setup()
    assert len(calls) == 1


def test_the_cli_checks_before_it_writes_and_the_wave_does_not_check_again(monkeypatch):
    from cluster.cli import wave as wave_cmd

    order = []

    class Wave:
        def preflight(self):
            order.append("preflight")

        def run(self):
            order.append("run")
            raise Stop()

    with pytest.raises(Stop):
        wave_cmd.run_wave(build_config({}), Wave, before=lambda: order.append("before"))
    assert order == ["preflight", "before", "run"]
