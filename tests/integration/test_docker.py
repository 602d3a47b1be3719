"""The docker sandbox backend on the real engine (started by `make test` with no bridge and no iptables): the
same isolation as process sandboxes, every preemption fault and DF1 through it, PK3 on a simulated cluster,
and a clear harness error when the engine is down. Images are built locally from Debian's packages, never
pulled; the suite's leftover check counts containers with a wave's label."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DOCKER = {"backend": "docker"}

PROBE = r'''
import json, os, socket, sys
out = {"uid": os.getuid(), "gid": os.getgid()}
out["capeff"] = next(l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff"))
out["nnp"] = next(l.split()[1] for l in open("/proc/self/status") if l.startswith("NoNewPrivs"))
out["ifaces"] = sorted(os.listdir("/sys/class/net"))
for path in ("/etc/sf-probe", "/usr/sf-probe", "/sf-probe"):
    try:
        open(path, "w").close(); out[path] = "WRITABLE"
    except OSError as e:
        out[path] = e.strerror
out["workspace_writable"] = os.access("/workspace", os.W_OK)
out["results_visible"] = os.path.exists(os.environ["SF_RESULTS"])
for target in (("10.0.0.1", 80), ("172.17.0.1", 80), ("192.168.1.1", 80), ("1.1.1.1", 443)):
    s = socket.socket(); s.settimeout(0.5)
    try:
        s.connect(target); out[target[0]] = "REACHED"
    except OSError as e:
        out[target[0]] = type(e).__name__
    finally:
        s.close()
s = socket.create_connection(("127.0.0.1", int(os.environ["AWS_ENDPOINT_URL_S3"].rsplit(":", 1)[1])), 2)
out["proxy_relay"] = "connected"; s.close()
print("PROBE " + json.dumps(out), flush=True)
sys.exit(3)
'''


def _receipts(d):
    return orjson.loads((d / "faults.json").read_bytes())


def test_docker_sandbox_is_isolated_like_a_process_sandbox(run_wave, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    tmp_path.chmod(0o755)  # a runner's code dir is readable by the sandbox user (pytest makes it 0700)
    runner = {"name": "probe", "command": [sys.executable, str(probe)], "env": {"SF_RESULTS": str(run_wave.root)}}
    result, d = run_wave(runner=runner, tasks=1, concurrency=1, faults="none", max_attempts=1, sandbox=DOCKER,
                         workload={"steps": 2})
    log = (d / "sandboxes" / "t000-a1" / "runner.log").read_text()
    got = orjson.loads(log.split("PROBE ", 1)[1].splitlines()[0])
    assert got["uid"] == 65534 and got["gid"] == 65534, got
    assert got["capeff"] == "0000000000000000" and got["nnp"] == "1", got
    assert got["ifaces"] == ["lo"], got  # network_mode none: loopback only
    assert all(got[p] != "WRITABLE" for p in ("/etc/sf-probe", "/usr/sf-probe", "/sf-probe")), got  # read-only root
    assert got["workspace_writable"] and not got["results_visible"], got
    assert all(got[a] != "REACHED" for a in ("10.0.0.1", "172.17.0.1", "192.168.1.1", "1.1.1.1")), got
    assert got["proxy_relay"] == "connected"  # the harness only through the project's own relays
    g = result["tasks"][0]
    assert g["attempts"] == 1 and "exit 3" in g["attempt_causes"][0], g["attempt_causes"]


FAULTS = {
    "PK1": dict(fault_timing={"PK1": {"after_model_calls": [2, 3]}}),
    "PK2": dict(fault_timing={"PK2": {"after_model_calls": [2, 3], "window_s": [0.5, 0.5]}}),
    "PK4": dict(fault_timing={"PK4": {"kills": 2, "window_s": [0.4, 0.5]}}, workload={"steps": 8, "think_ms": 200}),
    "PK5": dict(fault_timing={"PK5": {"after_checkpoints": [2, 4], "window": "after-commit:"}}),
    "PK6": dict(fault_timing={"PK6": {"after_model_calls": [2, 3]}}, lease_ttl_s=2.0),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_preemption_faults_on_docker(run_wave, fault):
    kw = dict(tasks=2, concurrency=2, faults=[fault], deadline_s=90, workload={"steps": 6, "think_ms": 80})
    kw.update(FAULTS[fault])
    result, d = run_wave(runner="durable", seed=21, sandbox=DOCKER, **kw)
    receipts = _receipts(d)
    assert receipts and all(r["status"] == "applied" for r in receipts if r["fault_id"] == fault), receipts
    assert result["verdict"] in ("pass", "not_applied"), [(g["task_id"], g["signature"]) for g in result["tasks"]]
    assert all(g["attempts"] >= 2 for g in result["tasks"] if g["verdict"] == "pass")
    if fault == "PK6":  # a zombie that made no request after its thaw leaves the fencing not exercised (not_applied)
        assert all(g["checks"]["fenced_writes_rejected"]["verdict"] in ("pass", "not_applied") for g in result["tasks"])
        assert all(g["attempts"] >= 2 and g["checks"]["completed"]["verdict"] == "pass" for g in result["tasks"])
    else:
        assert any(g["verdict"] == "pass" and g["attempts"] >= 2 for g in result["tasks"])
    assert not result["leaks"]["sandboxes"] and not result["leaks"]["sandboxes_sweeper"]


def test_df1_on_docker(run_wave):
    from faults.planner import task_seed
    from fleet import workloads

    at = workloads.get("longtool").tool_step(task_seed(6, 0), 6)
    result, d = run_wave(runner="durable", seed=6, tasks=1, concurrency=1, faults=["DF1"], sandbox=DOCKER,
                         fault_timing={"DF1": {"after_model_calls": [at + 1, at + 1], "window_s": [6.0, 6.0]}},
                         workload={"name": "longtool", "steps": 6, "think_ms": 20}, deadline_s=90)
    g = result["tasks"][0]
    assert result["verdict"] == "pass", (g["signature"], g["attempt_causes"])
    assert _receipts(d)[0]["status"] == "applied"
    assert g["attempts"] == 2 and "workspace full" in g["attempt_causes"][0], g["attempt_causes"]


def test_pk3_on_docker_through_the_cli(tmp_path):
    cfg = tmp_path / "wave.yaml"
    cfg.write_text("tasks: 3\nconcurrency: 3\nseed: 11\nfaults: [PK3]\nlease_ttl_s: 3\nsandbox: {backend: docker}\n"
                   "fault_timing: {PK3: {mode: abrupt, after_model_calls: [2, 3], down_s: [6, 7]}}\n"
                   "workload: {steps: 6, think_ms: 80}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--nodes", "3", "--results",
                        str(tmp_path / "r"), "--no-progress"], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=400)
    assert r.returncode in (0, 2), (r.stdout[-2000:], r.stderr[-2000:])
    wave = (tmp_path / "r" / "latest").resolve()
    tl = [orjson.loads(x) for x in (wave / "timeline.jsonl").read_bytes().splitlines()]
    assert next(e for e in tl if e["event"] == "wave_end")["harness_error"] is None
    applied = [x for x in _receipts(wave) if x["status"] == "applied"]
    assert applied and all("back as a new Ray node" in x["detail"] for x in applied)
    for x in applied:
        for sid in x["target"]["sandboxes"]:
            g = orjson.loads((wave / f"{sid.rsplit('-a', 1)[0]}.grade.json").read_bytes())
            assert g["verdict"] == "pass", g["checks"]


def test_docker_engine_down_is_a_clear_harness_error(tmp_path):
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    env = {k: v for k, v in env.items() if not k.startswith("RAY_")}
    cfg = tmp_path / "w.yaml"
    cfg.write_text("tasks: 1\nsandbox: {backend: docker}\n")
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--results", str(tmp_path / "r"),
                        "--no-progress"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "docker engine is unavailable" in r.stderr and "make setup" in r.stderr, r.stderr
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())
