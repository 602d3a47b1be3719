"""The launcher config (infra/aws-spot.yaml) brought up here with Ray's fake multinode provider.

The fake provider starts each worker node as a real raylet on this machine (in its autoscaler's process), from the
config's node types and resources; it runs no ssh, setup or start command. So the test derives a fake config from
the AWS one (same node types, resources, min/max workers; the head type renamed to the provider's fixed name), starts
the head with the config's own `ray start --head` command (its venv path, env and flags; 127.0.0.1, a temp dir of its
own, random ports instead of the fixed ones), waits for the autoscaler to bring the spot workers up, checks that they
offer `sandfleet` and that discovery finds them, and runs a small PK1 wave on them with `sandfleet wave run
--address`. Everything is ended by PID: the processes whose command line carries this test's temp dir or that hold a
file under it open."""
from __future__ import annotations

import copy
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pytest
import yaml

from tests import leftovers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
AWS = ROOT / "infra" / "aws-spot.yaml"
FAKE_HEAD_TYPE = "ray.head.default"  # the fake provider tags its head with this type, whatever the config names it
# ports the YAML fixes for a security group; on a shared machine the local head takes random ones instead
FIXED_PORTS = ("--object-manager-port", "--node-manager-port", "--runtime-env-agent-port",
               "--dashboard-agent-grpc-port", "--dashboard-agent-listen-port", "--metrics-export-port")
# what AWS reads off the instance type (m6i.large: 2 vCPUs) and the fake provider must be told
FAKE_WORKER_HW = {"CPU": 2, "object_store_memory": 100 * 1024 * 1024}
PROBE = r"""
import json, sys, time
from cluster.raysession import token_auth_for_cluster
token_auth_for_cluster()
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
from ray.experimental.internal_kv import _internal_kv_get
from cluster.raycluster import discover_sandbox_nodes

def active():  # the autoscaler's own count of its running nodes by node type (what `ray status` prints)
    status = json.loads(_internal_kv_get("__autoscaling_status") or b"{}")
    return (status.get("autoscaler_report") or {}).get("active_nodes") or {}

deadline, want = time.monotonic() + float(sys.argv[2]), int(sys.argv[3])
while (len(discover_sandbox_nodes()) < want or active().get(sys.argv[4], 0) < want) and time.monotonic() < deadline:
    time.sleep(0.25)
print(json.dumps({"at": time.time(), "found": discover_sandbox_nodes(), "active": active(),
                  "nodes": [{"id": n["NodeID"], "alive": n["Alive"], "address": n["NodeManagerAddress"],
                             "resources": n["Resources"], "labels": n.get("Labels") or {}} for n in ray.nodes()]}))
ray.shutdown()
"""


def _aws() -> dict:
    return yaml.safe_load(AWS.read_text())


def _start_command(cmds: list[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """The `ray start` line of a start-command list -> (the wrapper before `env`, the env it sets, the argv after the
    venv's `ray`)."""
    line = next(c for c in cmds if " start " in c)
    tokens = shlex.split(line)
    i = next(k for k, t in enumerate(tokens) if t.endswith("/.venv/bin/ray"))
    e = tokens.index("env")
    return tokens[:e], dict(t.split("=", 1) for t in tokens[e + 1:i]), tokens[i + 1:]


def _ours(marker: str) -> list[int]:
    """PIDs whose command line carries this test's temp dir, or that hold a file under it open (the fake workers'
    agents retitle themselves `ray::DashboardAgent`, and outlive their raylet): the only processes this test ends."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or p.name == str(os.getpid()):
            continue
        try:
            if marker.encode() in (p / "cmdline").read_bytes() or any(
                    _link(fd).startswith(marker + "/") for fd in (p / "fd").iterdir()):
                out.append(int(p.name))
        except OSError:
            continue
    return out


def _link(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except OSError:  # (closed meanwhile)
        return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fake_config(aws: dict, gcs_port: int) -> dict:
    """The fake multinode twin of the AWS config: the same node types, resources, min/max workers and start commands
    (the fake provider never runs them: no node updaters); no instance config, file mounts or setup."""
    cfg = copy.deepcopy(aws)
    # one node per launch call (the provider's default): with launch_multiple, its slow in-process starts race the
    # autoscaler's count, which then launched a third worker in one run out of three here
    cfg["provider"] = {"type": "fake_multinode", "gcs_address": f"127.0.0.1:{gcs_port}",
                       "use_node_id_as_ip": True,  # several raylets on 127.0.0.1: the monitor keys them by node id
                       "disable_node_updaters": True, "disable_launch_config_check": True}
    types = {}
    for name, t in aws["available_node_types"].items():
        head = name == aws["head_node_type"]
        types[FAKE_HEAD_TYPE if head else name] = {
            "node_config": {}, "resources": {**({"CPU": 1} if head else FAKE_WORKER_HW), **t["resources"]},
            "min_workers": t.get("min_workers", 0), "max_workers": t["max_workers"]}
    cfg.update(available_node_types=types, head_node_type=FAKE_HEAD_TYPE, auth={}, docker={}, file_mounts={},
               cluster_synced_files=[], file_mounts_sync_continuously=False, initialization_commands=[],
               setup_commands=[], head_setup_commands=[], worker_setup_commands=[])
    return cfg


def test_the_launcher_config_runs_the_venvs_ray_as_root_in_a_delegated_scope():
    """What the fake provider cannot run, read from the YAML: Ray from the venv `make setup` builds in the synced
    checkout, under sudo in a systemd scope with Delegate=yes, token auth; workers offer `sandfleet`, the head does
    not; no venv, results or .git is synced; Ray's own schema accepts the filled-out config."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    aws = _aws()
    filled = prepare_config(copy.deepcopy(aws))
    validate_config(filled)
    assert filled["head_setup_commands"] == filled["setup_commands"], "a default head setup command crept in (pip)"
    assert any("make setup" in c for c in aws["setup_commands"])
    assert aws["file_mounts"]["/home/admin/sandfleet"] == "."
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        wrapper, env, argv = _start_command(aws[key])
        assert wrapper[:2] == ["sudo", "systemd-run"] and "--scope" in wrapper and "Delegate=yes" in wrapper, wrapper
        assert env == {"HOME": "$HOME", "RAY_AUTH_MODE": "token"}, env
        line = next(c for c in aws[key] if " start " in c)
        assert "$HOME/sandfleet/.venv/bin/ray start" in " ".join(line.split()), line
        assert argv[0] == "start" and all(any(a.startswith(p + "=") for a in argv) for p in FIXED_PORTS), argv
    head = aws["head_node_type"]
    for name, t in aws["available_node_types"].items():
        assert ("sandfleet" in t["resources"]) == (name != head), (name, t["resources"])
    assert {".venv", "/results", ".git"} <= set(aws["rsync_exclude"])


def test_the_kuberay_manifest_has_the_same_layout():
    """infra/kuberay-raycluster.yaml (not run here: no Kubernetes): a head without sandboxes, spot workers that
    offer `sandfleet`, token auth from one secret, and the privileges the sandboxes need on every container."""
    rc = yaml.safe_load((ROOT / "infra" / "kuberay-raycluster.yaml").read_text())
    assert (rc["apiVersion"], rc["kind"]) == ("ray.io/v1", "RayCluster")

    def offers(group: dict) -> dict:  # KubeRay's quoted-JSON form of `ray start --resources`
        return json.loads(json.loads(group["rayStartParams"].get("resources", '"{}"')))

    head, workers = rc["spec"]["headGroupSpec"], rc["spec"]["workerGroupSpecs"]
    assert "sandfleet" not in offers(head) and all(offers(w).get("sandfleet") == 1 for w in workers)
    assert [w["groupName"] for w in workers] == ["spot-worker"]
    for group in [head, *workers]:
        for c in group["template"]["spec"]["containers"]:
            assert c["securityContext"] == {"privileged": True}, c["name"]
            env = {e["name"]: e for e in c["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token" and "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]


def test_the_launcher_config_brings_up_spot_workers_that_run_a_wave(suite_lock, tmp_path):
    """The AWS config's cluster, faked on this machine: the autoscaler starts the spot-worker nodes with the
    `sandfleet` resource, discovery finds both, and a PK1 wave (a kill after the 2nd-3rd model answer) passes with
    every attempt on a worker, through the gate on a fixed `gateway.port`."""
    from fleet import cgroups

    before = {"snapshot": leftovers.snapshot(), "harness": set(cgroups.harness_dirs())}  # (a session fleet's stay)
    aws = _aws()
    want = aws["available_node_types"]["spot-worker"]["min_workers"]
    tmp = tempfile.mkdtemp(prefix="sflaunch-", dir="/tmp")  # short: Ray's unix sockets live under it
    port, gate = _free_port(), _free_port()
    cfg_file = Path(tmp) / "fake-cluster.yaml"
    cfg_file.write_text(yaml.safe_dump(_fake_config(aws, port)))
    _, env_set, argv = _start_command(aws["head_start_ray_commands"])  # (no sudo, no systemd scope: root, cgroup v1)
    argv = [a for a in argv if not a.startswith(FIXED_PORTS)]
    argv = [f"--port={port}" if a.startswith("--port=") else
            f"--autoscaling-config={cfg_file}" if a.startswith("--autoscaling-config=") else a for a in argv]
    head_res = aws["available_node_types"][aws["head_node_type"]]["resources"]
    argv += ["--block", "--temp-dir", tmp, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
             "--resources", json.dumps(head_res)]
    token = secrets.token_hex(32)
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    head_env = dict(base, RAY_AUTH_MODE=env_set["RAY_AUTH_MODE"], RAY_AUTH_TOKEN=token, RAY_FAKE_CLUSTER="1",
                    RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", AUTOSCALER_UPDATE_INTERVAL_S="1")
    # the driver as a user runs it: only the token (sandfleet sets RAY_AUTH_MODE itself)
    user_env = dict(base, RAY_AUTH_TOKEN=token, RAY_USAGE_STATS_ENABLED="0")
    ray_bin = str(Path(sys.executable).parent / "ray")
    t0 = time.time()
    head = subprocess.Popen([ray_bin, *argv], env=head_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    timings = {}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert head.poll() is None, head.stderr.read().decode()[-3000:]
                assert time.monotonic() < deadline, "the head's GCS did not listen within 60 s"
                time.sleep(0.2)
        timings["head_s"] = round(time.time() - t0, 1)
        probe = subprocess.run([sys.executable, "-c", PROBE, f"127.0.0.1:{port}", "90", str(want), "spot-worker"],
                               env=dict(user_env, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"), cwd=ROOT,
                               capture_output=True, text=True, timeout=150)
        assert probe.returncode == 0, probe.stderr[-3000:]
        seen = json.loads(probe.stdout.strip().splitlines()[-1])
        timings["cluster_up_s"] = round(seen["at"] - t0, 1)
        alive = [n for n in seen["nodes"] if n["alive"]]
        workers = [n for n in alive if "sandfleet" in n["resources"]]
        monitor = sorted(Path(tmp).glob("session_*/logs/monitor.*"))
        # (at least min_workers: the fake provider's in-process starts can race the autoscaler's count into one more)
        count = len(workers)
        if not want <= count <= aws["available_node_types"]["spot-worker"]["max_workers"]:
            for m in monitor:
                print(f"--- {m}\n{m.read_text()[-6000:]}")
        assert want <= count <= aws["available_node_types"]["spot-worker"]["max_workers"], alive
        assert len(alive) == count + 1 and all(a["address"] == "127.0.0.1" for a in alive), alive
        active = seen["active"]  # the autoscaler's count by node type, as `ray status` prints it
        assert set(active) == {FAKE_HEAD_TYPE, "spot-worker"} and active["spot-worker"] >= want, active
        assert sorted(seen["found"].values()) == sorted(w["id"] for w in workers), seen["found"]

        wave_cfg = tmp_path / "wave.yaml"
        wave_cfg.write_text(yaml.safe_dump({
            "tasks": 2, "concurrency": 2, "seed": 3, "faults": ["PK1"],
            "fault_timing": {"PK1": {"after_model_calls": [2, 3]}}, "workload": {"steps": 5, "think_ms": 50},
            "gateway": {"port": gate}}))
        t1 = time.time()
        r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(wave_cfg), "--address",
                            f"127.0.0.1:{port}", "--min-sandbox-nodes", str(want), "--results", str(tmp_path / "r"),
                            "--no-progress"], env=user_env, cwd=ROOT, capture_output=True, text=True, timeout=240)
        timings["wave_s"] = round(time.time() - t1, 1)
        assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
        assert "pass (pass 2)" in r.stdout, r.stdout[-2000:]
        wave = (tmp_path / "r" / "latest").resolve()
        starts = [orjson.loads(line) for line in (wave / "timeline.jsonl").read_text().splitlines()
                  if '"attempt_start"' in line]
        assert len(starts) >= 3, starts  # 2 tasks, at least one killed and resumed
        nodes = {r["name"]: r for r in orjson.loads((wave / "nodes.json").read_bytes())}
        sandbox_nodes = {name for name, r in nodes.items() if r["sandboxes"]}
        assert set(seen["found"]) <= sandbox_nodes and [name for name, r in nodes.items() if r["head"]] == ["node-0"]
        assert {s["node"] for s in starts} <= sandbox_nodes, ({s["node"] for s in starts}, nodes)
        assert all((wave / "sandboxes" / s["sandbox"] / "runner.log").is_file() for s in starts)
        # every listener of this cluster is on loopback
        ss = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True).stdout
        pids = set(_ours(tmp))
        mine = [line for line in ss.splitlines() if any(f"pid={p}," in line for p in pids)]
        hosts = {line.split()[3].rsplit(":", 1)[0].strip("[]") for line in mine}
        assert mine and hosts <= {"127.0.0.1", "::ffff:127.0.0.1"}, hosts
    finally:
        if head.poll() is None:
            os.kill(head.pid, signal.SIGTERM)
            try:
                head.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(head.pid, signal.SIGKILL)
                head.wait(5)
        head.stderr.close()
        deadline = time.monotonic() + 20  # the fake workers' raylets are the autoscaler's, not the head's children
        while _ours(tmp) and time.monotonic() < deadline:
            for pid in _ours(tmp):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        left = _ours(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"fake launcher cluster: {timings}")
    assert not left, f"processes of the fake cluster left: {left}"
    assert not leftovers.wait_clean(before["snapshot"]), "a sandbox, mount or marked process was left"
    deadline = time.monotonic() + 20  # (a killed host's harness cgroup goes once its process has)
    while set(cgroups.harness_dirs()) - before["harness"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not set(cgroups.harness_dirs()) - before["harness"], "a sandbox host's harness cgroup was left"
    assert not list(Path("/tmp").glob("sandfleet-host-node-127.0.0.1-*")), "a sandbox host's dir was left"
