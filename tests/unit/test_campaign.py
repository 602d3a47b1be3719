import pytest

from cluster.campaign import _config, bracket, parse_range, plan_waves
from cluster.config import ConfigError
from faults.planner import plan_faults


def test_range_and_fault_are_checked_before_anything_runs():
    assert parse_range("0.5-300") == (0.5, 300.0)
    for bad in ("300-0.5", "x-1", "0-5", "5"):
        with pytest.raises(ConfigError, match="--window"):
            parse_range(bad)
    with pytest.raises(ConfigError, match="--fault 'PK1'"):
        plan_waves("PK1", ["durable"], 1, 2, {})
    with pytest.raises(ConfigError, match="runner"):
        plan_waves("ST1", ["no-such-runner"], 1, 2, {})


@pytest.mark.parametrize("fault,strength,check", [
    ("ST1", 42.0, lambda s: s.window_s == 42.0),
    ("ST2", 300.0, lambda s: s.params["latency_ms"] == [300, 450]),
    ("ST3", 0.8, lambda s: s.params["ratio"] == 0.8),
    ("ST7", 2.5, lambda s: s.params["lag_s"] == 2.5),
    ("ST8", 6.0, lambda s: s.params["max_hits"] == 6),
    ("CR1", 1.25, lambda s: s.params["delay_s"] == 1.25),
])
def test_the_strength_knob_reaches_the_planned_fault(fault, strength, check):
    cfg = _config(fault, "durable", strength, {"tasks": 2, "seed": 3})
    specs = plan_faults(cfg.seed, ["t000", "t001"], cfg.faults, cfg.fault_params())
    mine = [s for ss in specs.values() for s in ss if s.fault_id == fault]
    assert len(mine) == 2 and all(check(s) for s in mine), mine


def test_bracket_names_the_strongest_survived_and_weakest_failed():
    rows = [{"runner": "d", "strength": x, "outcome": o} for x, o in
            ((1, "survived"), (100, "failed"), (10, "survived"), (31.6, "failed"), (17.8, "inconclusive"))]
    assert bracket(rows, "d") == "survives up to 10, fails at 31.6"
    assert bracket([{"runner": "d", "strength": 1, "outcome": "failed"}], "d").startswith("fails even")
    assert bracket([{"runner": "d", "strength": 1, "outcome": "survived"}], "d").startswith("survives the whole")
    assert bracket([{"runner": "d", "strength": 1, "outcome": "inconclusive"}], "d").startswith("inconclusive")


def test_a_strength_outside_the_faults_scale_is_refused():
    with pytest.raises(ConfigError, match="ST3: strength 5.0 is a share"):
        plan_waves("ST3", ["durable"], 0.5, 5, {})


def test_the_league_reports_dcp_columns_with_an_honest_interval():
    from cluster.league import dcp_lines, wilson

    lo, hi = wilson(8, 8)
    assert hi == 1.0 and 0.6 < lo < 0.7  # 8 of 8 is not "100 %, certainly"
    assert wilson(0, 0) == (0.0, 1.0)
    rows = [{"runner": "durable", "survived": 8, "interrupted": 8, "interruptions": 8, "wasted_tokens": 40,
             "resume_s": [0.5, 0.7], "write_ms_per_step": [3.0, 4.0, 5.0]},
            {"runner": "naive", "survived": 0, "interrupted": 0, "interruptions": 0, "wasted_tokens": 0,
             "resume_s": [], "write_ms_per_step": []}]
    text = "\n".join(dcp_lines(rows))
    assert "| durable | 100.0% (8/8) | 68%-100% |" in text and "5 (n=8)" in text and "4.0 ms" in text
    assert "| naive | n/a (0 interrupted) | n/a |" in text
    for w in ("PROMPT", "EXEC", "WRITE", "VERIFY"):
        assert f"- {w}: " in text
