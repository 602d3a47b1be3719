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
    # the kill after the 2nd-4th commit leaves at least 4 steps of 150 ms to run: it lands (by pid, at once) long
    # before the runner could finish on a loaded host
    "PK5": dict(fault_timing={"PK5": {"after_checkpoints": [2, 4], "window": "after-commit:"}},
                workload={"steps": 8, "think_ms": 150}),
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
    assert f"docker engine at unix://{tmp_path}/no-docker.sock is unavailable" in r.stderr, r.stderr  # names it
    assert "make setup" in r.stderr, r.stderr
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_a_sweep_that_cannot_list_containers_says_so_and_exits_2(tmp_path):
    """A docker socket with no engine behind it (a stopped engine's stale socket): `sandfleet sweep` must not say
    "nothing left" as if it had looked; it warns that containers were not listed and exits 2."""
    import socket

    sock = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()  # the file stays; nothing answers on it
    env = dict(os.environ, DOCKER_HOST=f"unix://{sock}")
    for args in (["sweep", "--dry-run"], ["sweep"]):
        r = subprocess.run([sys.executable, "-m", "cluster.cli", *args], env=env, cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert f"containers at unix://{sock} were not listed" in r.stderr, r.stderr
        assert "could be looked at" in r.stdout or "found:" in r.stdout or "would remove:" in r.stdout, r.stdout


@pytest.fixture
def private_engine():
    """A second docker engine this test starts (its own socket, data root and exec root; no bridge, no iptables)
    and ends by its pid: the machine's shared engine is never the one killed. Yields (url, start, pid)."""
    import signal
    import tempfile
    import time

    import docker

    from fleet.dockerimage import ensure_base_image

    d = Path(tempfile.mkdtemp(prefix="sfd-", dir="/tmp"))
    url = f"unix://{d}/docker.sock"
    procs = []

    def answers() -> bool:
        try:
            return bool(docker.DockerClient(base_url=url, timeout=2).ping())
        except Exception:  # noqa: BLE001
            return False

    def end_orphaned_containerd() -> None:
        """A SIGKILLed engine can leave its containerd behind, half alive: the next engine then waits on its socket
        and gives up ("timeout waiting for containerd to start", seen under load). It is ours by its dirs."""
        left = [pid for pid in ours() if "containerd-shim" not in _cmdline(str(pid))]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{pid}") for pid in left) and time.monotonic() < deadline:
            time.sleep(0.05)
        for stale in (d / "docker.pid", d / "exec" / "containerd" / "containerd.pid"):
            stale.unlink(missing_ok=True)

    def start() -> int:
        for _ in range(3):  # bounded: an engine that does not come up three times is a failure of the test machine
            if procs and procs[-1].poll() is not None:  # a killed or failed engine: its leftovers go first
                end_orphaned_containerd()
            log = open(d / "dockerd.log", "ab")
            p = subprocess.Popen(["dockerd", "--host", url, "--data-root", str(d / "root"), "--exec-root",
                                  str(d / "exec"), "--pidfile", str(d / "docker.pid"), "--bridge=none",
                                  "--iptables=false", "--ip6tables=false", "--ip-masq=false"],
                                 stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
            procs.append(p)
            deadline = time.monotonic() + 60
            while not answers() and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            if answers():
                return p.pid
            if p.poll() is None:
                p.kill()
                p.wait(10)
        raise AssertionError((d / "dockerd.log").read_text()[-2000:])

    def ours() -> list[int]:  # the engine's processes and its containerd: their command lines name our dirs
        return [int(x) for x in os.listdir("/proc") if x.isdigit() and str(d) in _cmdline(x)]

    try:
        start()
        tag = ensure_base_image(docker.from_env(timeout=120))  # the machine's engine has it (built, never pulled)
        docker.DockerClient(base_url=url, timeout=120).images.load(
            b"".join(docker.from_env(timeout=120).images.get(tag).save(named=True)))
        yield url, start, lambda: procs[-1].pid
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # it stops its containers and its containerd
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        for pid in ours():  # a containerd (or shim) left by the SIGKILLed engine: ours by its dirs
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while ours() and time.monotonic() < deadline:
            time.sleep(0.1)
        for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
            if str(d) in line.split()[4]:
                subprocess.run(["umount", "-l", line.split()[4]], check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", str(d)], check=False)
        assert not ours(), "a process of the private docker engine was left"


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSTOP"])
def test_a_docker_engine_that_dies_mid_wave_ends_it_as_unknown_and_leaves_no_runner(fleet, private_engine, tmp_path,
                                                                                       sig):
    """dockerd SIGKILLed (dead) or SIGSTOPped (hung) while containers run: their runners keep running under their
    shims, so the harness ends them by pid (marker-checked), the wave ends as a harness fault naming the engine with
    `unknown` verdicts (never a hang, never a runner blamed), and once the engine answers again `sandfleet sweep`
    removes the records."""
    import signal
    import time

    import docker
    import ray

    from tests import leftovers

    url, start, engine_pid = private_engine
    env = dict(os.environ, DOCKER_HOST=url)
    cfg = tmp_path / "wave.yaml"
    cfg.write_text("tasks: 2\nconcurrency: 2\nseed: 5\nfaults: none\nsandbox: {backend: docker}\n"
                   "workload: {steps: 150, think_ms: 300}\ndeadline_s: 180\nhealth: {answer_s: 1.5}\n")  # a runner needs 45 s or more
    results = tmp_path / "r"
    before = leftovers.snapshot()
    p = subprocess.Popen([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--address",
                          ray.get_runtime_context().gcs_address, "--results", str(results), "--no-progress"],
                         env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    priv = docker.DockerClient(base_url=url, timeout=10)
    try:
        deadline = time.monotonic() + 120
        running = []
        while time.monotonic() < deadline and p.poll() is None and len(running) < 2:
            running = priv.containers.list(filters={"label": "sandfleet.wave", "status": "running"})
            time.sleep(0.1)
        assert len(running) >= 2, "two containers never ran at once on the private engine"
        wave = running[0].labels["sandfleet.wave"]
        # two runners are at work (each has had a model answer) and their processes (marked) are seen before the
        # engine goes: they are what the harness must end by pid (looked for after the kill, they raced the
        # harness's own kill)
        log, deadline = results / wave / "model-calls.jsonl", time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None:
            lines = log.read_bytes().splitlines(keepends=True) if log.exists() else []
            working = {orjson.loads(x)["task"] for x in lines if x.endswith(b"\n")}  # whole lines only
            runners = [x for x in leftovers.marked_processes() if x not in before["processes"]]
            if len(working) >= 2 and runners:
                break
            time.sleep(0.1)
        assert len(working) >= 2 and runners, ("no two runners at work in the containers: nothing for the harness "
                                               f"to end ({working}, {runners})")
        os.kill(engine_pid(), getattr(signal, sig))
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        if sig == "SIGSTOP":
            os.kill(engine_pid(), signal.SIGCONT)
    assert p.returncode == 2, (out[-2000:], err[-2000:])
    assert "harness fault: docker engine" in err, err[-2000:]
    d = results / wave
    grades = [orjson.loads(g.read_bytes()) for g in d.glob("t*.grade.json")]
    assert grades and not [g["task_id"] for g in grades if g["verdict"] == "fail"], "a runner was blamed"
    assert any(g["verdict"] == "unknown" and (g["harness_fault"] or "").startswith("docker engine") for g in grades)
    # the runners that outlived the engine were ended by the harness (the engine stayed dead or hung all along):
    # none ran on to its last step
    calls = [orjson.loads(x) for x in (d / "model-calls.jsonl").read_bytes().splitlines() if x.strip()]
    assert calls and not [c for c in calls if c.get("kind") == "final"], "a runner ran to its end"
    assert not leftovers.wait_clean(before), "a runner or sandbox of the wave outlived it"
    records = {"label": f"sandfleet.wave={wave}"}
    if sig == "SIGKILL":
        start()  # the engine comes back: the wave's containers are records of a dead wave; the sweep removes them
        assert priv.containers.list(all=True, filters=records)
    # (a resumed engine may yet carry out removals the harness sent while it was stopped)
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "sweep"], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert sig != "SIGKILL" or f"found: {wave}" in r.stdout, (r.stdout, r.stderr)
    deadline = time.monotonic() + 20
    while priv.containers.list(all=True, filters=records) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not priv.containers.list(all=True, filters=records)


def test_a_container_keeps_its_log_bounded(tmp_path):
    """Issue 42: containers were made with no log_config, and the engine's json-file log of a runner that printed
    3 GiB kept 2.59 GB per attempt. The harness reads the engine's log (`docker logs --follow`), so the driver stays
    json-file, capped: the container the backend creates says so in its HostConfig."""
    from fleet.docker_backend import DockerBackend
    from fleet.sandbox import SandboxSpec

    be = DockerBackend()
    spec = SandboxSpec(wave_id="w-20261206T000000-s1-logcap", sandbox_id="t000-a1", task_id="t000", attempt=1,
                       argv=["true"], env={}, state_dir=str(tmp_path), backend="docker")
    os.makedirs(spec.workspace)
    c = be._create(spec)
    try:
        log = be.ctl.inspect_container(c.id)["HostConfig"]["LogConfig"]
    finally:
        c.remove(force=True)
    assert log == {"Type": "json-file", "Config": {"max-size": "16m", "max-file": "3"}}, log
