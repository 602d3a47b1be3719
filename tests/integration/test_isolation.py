"""Hostile runners, each in its own sandbox beside honest tasks, on the real parts: every attack is
contained, the sandbox is killed and reaped, the honest tasks pass, and the host is unchanged."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import orjson
import pytest

from fleet import cgroups
from tests import leftovers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
HOSTILE = str(ROOT / "tests" / "runners" / "hostile.py")
ATTACKS = ["write_outside", "read_identities", "write_results", "foreign_prefix", "proxy_control",
           "cgroup_escape", "setsid_daemon", "ignore_sigterm", "fill_workspace", "memory", "fork_bomb",
           "spin_cpu", "net_outside", "stale_key", "new_userns", "list_cgroups"]
HOST_PATHS = ["/etc/sf-pwned", "/usr/sf-pwned", "/root/sf-pwned", "/work/sf-pwned", "/var/sf-pwned"]


def _limits() -> dict:
    out = {}
    files = ((cgroups.UNIFIED, f) for f in ("memory.max", "memory.swap.max", "pids.max", "cpu.weight", "cpu.max",
                                             "cgroup.freeze")) if cgroups.unified() else \
        (("memory", "memory.limit_in_bytes"), ("pids", "pids.max"), ("cpu", "cpu.shares"), ("freezer", "freezer.state"))
    for c, f in files:
        p = cgroups.own_dirs()[c] / f
        out[str(p)] = p.read_text() if p.exists() else None
    return out


def test_hostile_runners_are_contained_and_honest_tasks_pass(run_wave):
    plan = {f"t{i:03d}": a for i, a in enumerate(ATTACKS)}
    plan["t%03d" % len(ATTACKS)] = "none"  # an honest task in the same wave
    before, left_before = _limits(), leftovers.snapshot()
    assert not [p for p in HOST_PATHS if Path(p).exists()]
    runner = {"name": "hostile", "command": [sys.executable, HOSTILE],
              "env": {"ATTACKS": ",".join(f"{t}={a}" for t, a in plan.items()), "HOST_RESULTS": str(run_wave.root)}}
    result, d = run_wave(runner=runner, tasks=len(plan), concurrency=4, faults=[], seed=17,
                         workload={"steps": 6, "think_ms": 20}, deadline_s=150,
                         sandbox={"memory_mb": 256, "pids_max": 96, "cpu_cores": 1.0})
    outcomes = {}
    for tid, attack in plan.items():
        if attack == "none":
            continue
        logs = "".join(p.read_text() for p in sorted((d / "sandboxes").glob(f"{tid}-a*/runner.log")))
        m = re.search(rf"ATTACK {attack} RESULT (\w+) (.*)", logs)
        outcomes[attack] = (m.group(1), m.group(2)) if m else ("missing", logs[-500:])
    escaped = {a: o for a, o in outcomes.items() if o[0] != "blocked"}
    assert not escaped, escaped
    # contained, killed, reaped: every task (attacked or honest) still passes, nothing is left behind; the one
    # that tried to write into other tasks' prefixes fails as the writer (attributed by its attempt's key), and the
    # two that left a process running past their exit 0 fail `no_outliving_process`, which names it
    bad = {g["task_id"]: g["signature"] or g["verdict"] for g in result["tasks"] if g["verdict"] != "pass"}
    writer = next(t for t, a in plan.items() if a == "foreign_prefix")
    outlivers = {t for t, a in plan.items() if a in ("setsid_daemon", "ignore_sigterm")}
    assert bad == {writer: "no_foreign_writes", **{t: "no_outliving_process" for t in outlivers}}, bad
    for g in result["tasks"]:
        if g["task_id"] in outlivers:
            c = g["checks"]["no_outliving_process"]
            assert [p["name"] for o in c["outlived"] if o["exit_code"] == 0 for p in o["processes"]] == ["python"], c
    fw = next(g for g in result["tasks"] if g["task_id"] == writer)["checks"]["no_foreign_writes"]
    assert fw["writes"] and all(w["status"] == 403 for w in fw["writes"]), fw
    assert result["wave_checks"]["no_leaked_sandbox"] == "pass"
    assert not leftovers.wait_clean(left_before), "a sandbox process, cgroup or mount was left behind"
    assert not [p for p in HOST_PATHS if Path(p).exists()], "a runner wrote outside its workspace"
    assert not list(run_wave.root.rglob("sf-pwned")), "a runner wrote into results/"
    assert _limits() == before, "a cgroup limit of the harness changed"

    # the store refused the foreign and the stale writes (real 403s, seen by the proxy)
    reqs = [orjson.loads(line) for line in (d / "proxy-requests.jsonl").read_bytes().splitlines() if line.strip()]
    foreign = [r for r in reqs if r["method"] == "PUT" and r["key"].endswith("pwned")]
    assert foreign and all(r["status"] == 403 for r in foreign), foreign
    zombie = [r for r in reqs if r["key"].endswith("zombie-write")]
    assert zombie and all(r["status"] == 403 for r in zombie), zombie


def test_harness_processes_live_beside_the_sandboxes_never_above(fleet):
    """The host actor (and the driver, during a wave) sit in `sandfleet-harness/`, the sandboxes in
    `sandfleet/<wave>/`: siblings under the same parent, so a runner's CPU use competes with the
    harness by shares and the harness is never the parent of a sandbox's cgroup."""
    for info in fleet.host_info:
        v2 = cgroups.unified()
        line = next(l for l in Path(f"/proc/{info['pid']}/cgroup").read_text().splitlines()
                    if (l.startswith("0::") if v2 else "cpu" in l.split(":")[1].split(",")))
        path = line.split(":", 2)[2]
        assert "/sandfleet-harness/host-" in path and "/sandfleet/" not in path
        base = cgroups.own_dirs()[cgroups.UNIFIED if v2 else "cpu"]
        assert (base / cgroups.HARNESS).is_dir()
        f, default = ("cpu.weight", 100) if v2 else ("cpu.shares", 1024)
        assert int((Path(info["cgroup"]) / f).read_text()) > default
