"""Bad input: exit 254 with a message naming the field, the value and what is allowed."""
from __future__ import annotations

import subprocess
import sys

import pytest

from faults.base import CATALOG


# "billion laughs": 1.5 KB whose aliases expand to 9^9 values
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")) + "tasks: 2\n"


def sandfleet(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


@pytest.mark.parametrize("args, needles", [
    (["--faults", "PK1,PK9"], ["faults", "PK9", ", ".join(sorted(CATALOG))]),
    (["--runner", "clever"], ["runner", "clever", "durable, durable-local, naive"]),
    (["--tasks", "0"], ["tasks", "0", "greater than or equal to 1"]),
])
def test_bad_option_exits_254_naming_field_value_and_choices(tmp_path, args, needles):
    r = sandfleet("wave", "run", "--results", str(tmp_path), *args)
    assert r.returncode == 254, r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)
    assert list(tmp_path.iterdir()) == [], "a rejected config must not start a wave"


def test_unknown_config_field_exits_254(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("tasks: 2\nworkload:\n  stepz: 4\n")
    r = sandfleet("wave", "run", str(cfg), "--results", str(tmp_path / "r"))
    assert r.returncode == 254
    assert "workload.stepz" in r.stderr and "steps" in r.stderr and "think_ms" in r.stderr


def test_missing_config_file_and_bad_flag_exit_254(tmp_path):
    assert sandfleet("wave", "run", str(tmp_path / "nope.yaml")).returncode == 254
    r = sandfleet("wave", "run", "--no-such-flag")
    assert r.returncode == 254 and "no-such-flag" in r.stderr


def test_grade_of_a_non_wave_dir_exits_254(tmp_path):
    r = sandfleet("grade", str(tmp_path))
    assert r.returncode == 254 and "plan.json" in r.stderr


@pytest.mark.parametrize("setup, args, needles", [
    (lambda d: (d / "f").write_text("x"), ["--results", "{d}/f"], ["--results", "is a file"]),
    (lambda d: (d / "f").write_text("x"), ["--results", "{d}/f/sub"], ["--results", "is a file"]),
    (lambda d: None, ["--faults", ""], ["faults", "none"]),
    (lambda d: (d / "c.yaml").write_text(""), ["{d}/c.yaml"], ["is empty"]),
    (lambda d: (d / "c.yaml").write_text("fault_timing: {PK1: {at_s: [-1, 2]}}\n"), ["{d}/c.yaml"],
     ["fault_timing.PK1.at_s", "0 <= lo <= hi"]),
    (lambda d: (d / "c.yaml").write_text("store: {url: 'http://127.0.0.1:9'}\n"), ["{d}/c.yaml"],
     ["store", "access_key"]),
    (lambda d: None, ["--runner", "durable", "--runner-cmd", "x"], ["--runner-cmd"]),
    (lambda d: None, ["--runner-cmd", "python3 agent.py", "--runner-workdir", "{d}/nope"], ["workdir", "nope"]),
    # hostile input (issue 20): each of these crashed, hung or was accepted before
    (lambda d: (d / "c.yaml").write_text(ALIAS_BOMB), ["{d}/c.yaml"], ["not valid YAML", "expand to", "100000"]),
    (lambda d: (d / "c.yaml").write_text("seed: " + "7" * 5000 + "\n"), ["{d}/c.yaml"], ["5000 digits", "line 1"]),
    (lambda d: None, ["--seed", "1" + "0" * 250], ["seed", "less than 9223372036854775808"]),
    (lambda d: (d / "c.yaml").write_text('runner: {command: [python3, a.py], env: {A: "x\\0y"}}\n'), ["{d}/c.yaml"],
     ["runner.env", "'A'", "control character", "U+0000"]),
    (lambda d: (d / "c.yaml").write_text("sandbox: {cpu_cores: 0.00001}\n"), ["{d}/c.yaml"],
     ["sandbox.cpu_cores", "1e-05", "0.01"]),
    (lambda d: None, ["--results", "/proc/sandfleet-x"], ["--results", "under /proc"]),
    (lambda d: None, ["--results", "/sys/x"], ["--results", "under /sys"]),
    (lambda d: (d / "c.yaml").mkdir(), ["{d}/c.yaml"], ["c.yaml", "is a directory"]),
])
def test_bad_input_exits_254_before_any_results(tmp_path, setup, args, needles):
    """Every argument and config error is caught before a results directory exists."""
    setup(tmp_path)
    results = tmp_path / "results"
    args = [a.replace("{d}", str(tmp_path)) for a in args]
    extra = [] if "--results" in args else ["--results", str(results)]
    r = sandfleet("wave", "run", *args, *extra)
    assert r.returncode == 254, r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)
    assert not results.exists() and not list(tmp_path.glob("**/plan.json"))
    assert "Traceback" not in r.stderr


def test_unreachable_address_fails_fast_with_exit_2(tmp_path):
    r = sandfleet("wave", "run", "--address", "127.0.0.1:1", "--results", str(tmp_path / "r"))
    assert r.returncode == 2 and "cannot reach a Ray cluster at 127.0.0.1:1" in r.stderr, r.stderr
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").iterdir())
