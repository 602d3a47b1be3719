"""`--address` on a separately started Ray head (`ray start --head --block` on 127.0.0.1, its own temp dir,
its own auth token), as a user with an existing cluster runs it: the wave passes, every Ray listener is on
loopback, and the head is stopped by PID (then anything left with its temp dir in its command line)."""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _ours(marker: str) -> list[int]:
    """PIDs whose command line carries this head's temp dir (the only processes this test may end)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if marker.encode() in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                continue
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("offers", [False, True], ids=["plain head", "head offers sandfleet"])
def test_a_wave_runs_on_a_separately_started_ray_head(tmp_path, offers):
    """A plain one-node cluster runs the sandboxes on the driver's node. A node that offers a `sandfleet`
    resource is discovered as a sandbox node and used as another machine would be (its host pinned by node id,
    the runner's code shipped, the services through the gate on the driver's node address)."""
    tmp = tempfile.mkdtemp(prefix="sfhead-", dir="/tmp")  # short: Ray's unix sockets live under it
    port = _free_port()
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_USAGE_STATS_ENABLED="0",
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--port", str(port),
                             "--temp-dir", tmp, "--include-dashboard", "false", "--node-ip-address", "127.0.0.1",
                             "--num-cpus", "2", "--disable-usage-stats"]
                            + (["--resources", '{"sandfleet": 1}'] if offers else []), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert head.poll() is None, head.stderr.read().decode()[-2000:]
                time.sleep(0.2)
        cfg = tmp_path / "wave.yaml"
        cfg.write_text("tasks: 2\nconcurrency: 2\nseed: 3\nfaults: [PK1]\n"
                       "fault_timing: {PK1: {after_model_calls: [2, 3]}}\nworkload: {steps: 5, think_ms: 50}\n")
        r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--address",
                            f"127.0.0.1:{port}", "--results", str(tmp_path / "r"), "--no-progress"],
                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
        assert "pass (pass 2)" in r.stdout
        wave = (tmp_path / "r" / "latest").resolve()
        plan = __import__("orjson").loads((wave / "plan.json").read_bytes())
        starts = [line for line in (wave / "timeline.jsonl").read_text().splitlines() if '"attempt_start"' in line]
        assert starts and all('"node":"node-127.0.0.1"' in s_ if offers else '"node":"node-0"' in s_ for s_ in starts), \
            (starts[:2], plan.get("placement"))
        if offers:  # the remote path: every runner.log came back in its attempt's result
            assert all((wave / "sandboxes" / __import__("json").loads(s_)["sandbox"] / "runner.log").is_file()
                       for s_ in starts)
        # every listener of that Ray is on loopback
        ss = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True).stdout
        pids = set(_ours(tmp))
        mine = [l for l in ss.splitlines() if any(f"pid={p}," in l for p in pids)]
        hosts = {l.split()[3].rsplit(":", 1)[0].strip("[]") for l in mine}
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
        deadline = time.monotonic() + 20  # `ray start --block` does not always take its gcs and raylet along
        while _ours(tmp) and time.monotonic() < deadline:
            for pid in _ours(tmp):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        left = _ours(tmp)
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    assert not left, f"processes of the separate head left: {left}"
