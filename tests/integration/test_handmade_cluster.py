"""A Ray cluster started by hand, as a user with three machines starts one, and a wave run on it through the CLI.

The head machine: a network namespace of its own (its bridge at 198.18.0.1, an address that exists only there),
where `ray get-auth-token --generate` makes the head's token and `ray start --head` starts Ray with token auth (as
Ray 2.60 does when a token is at hand). Two worker machines: each in network, mount and pid namespaces of its own
with a private /tmp (cluster/isonode.py), linked to the head's bridge, joined with `ray start --address` and the
token, offering the `sandfleet` resource. The driver runs on the head machine (in its network namespace) with only
`~/.ray/auth_token`: `sandfleet wave run --address 198.18.0.1:6379`; mid-wave one worker's sandbox host actor
process is killed by its PID once an attempt runs there and its runner.log has come back while it ran. The wave
ends exit 2 (a harness fault) with a runner.log for every attempt that started, attempts only on the workers; then
`sandfleet sweep --cluster` (with only $RAY_AUTH_TOKEN) leaves nothing on any node: no sandbox process, cgroup,
mount, credentials file or host dir. Everything is ended by PID (or by the namespaces the test made); the machine's
own network namespace is unchanged."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pytest

from cluster import isolated
from tests import leftovers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
HEAD = f"{isolated.HEAD_IP}:6379"
# the head machine's network namespace, held by this process (its bridge and address die with it)
HOLDER = ("import sys; from cluster import isolated; isolated.enter_head(); print('ok', flush=True); "
          "sys.stdin.read()")
# the test's own look (not the driver's): both workers alive in the cluster with their sandfleet resource
JOINED = ("import sys, time, ray\nray.init(address=sys.argv[1], log_to_driver=False)\nend = time.time() + 150\n"
          "while time.time() < end:\n"
          "    if len([n for n in ray.nodes() if n['Alive'] and n['Resources'].get('sandfleet')]) == 2:\n"
          "        sys.exit(0)\n"
          "    time.sleep(0.5)\n"
          "sys.exit(3)\n")


def _machine_net() -> dict:
    def out(*args):
        return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout
    return {"addr": out("-o", "addr"), "route": out("route", "show", "table", "all"), "link": out("-o", "link"),
            "inode": os.stat("/proc/self/ns/net").st_ino}


def _ns(pid: int | str, kind: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def _pids_in(kind: str, inode: int) -> list[int]:
    """Every process of the machine in the namespace `inode` (one this test made)."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _ns(p, kind) == inode]


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _sandbox_pids(pidns: int) -> list[int]:
    out = []
    for pid in _pids_in("pid", pidns):
        try:
            if b"SANDFLEET_SANDBOX=" in Path(f"/proc/{pid}/environ").read_bytes():
                out.append(pid)
        except OSError:
            continue
    return out


def _in_head(argv: list[str], holder: int) -> list[str]:
    return ["nsenter", f"--net=/proc/{holder}/ns/net", "--", *argv]


def _wait(pred, what: str, timeout_s: float, every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every_s)
    raise AssertionError(f"waited {timeout_s:.0f} s for {what}")


def _timeline(wave: Path) -> list[dict]:
    try:
        raw = (wave / "timeline.jsonl").read_bytes()
    except OSError:
        return []
    out = []
    for line in raw.splitlines():
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:  # (a line being written)
            continue
    return out


def _node_leftovers(node: isolated.Node, wave_id: str) -> dict:
    """What is left of the wave on a worker machine, seen in its own namespaces."""
    root = Path(f"/proc/{node.proc.pid}/root")
    mounts = [line.split()[4] for line in Path(f"/proc/{node.proc.pid}/mountinfo").read_text().splitlines()
              if " - " in line and line.split(" - ", 1)[1].split()[1].startswith(("sandfleet-ws.", "sandfleet-vol."))]
    cgroups = [str(p) for d in node.cgroup_dirs.values() for p in d.rglob(wave_id) if p.is_dir()]
    return {"sandbox processes": _sandbox_pids(node.ns["pid"]), "mounts": mounts, "cgroups": cgroups,
            "credentials": [str(p) for p in (root / "tmp").rglob("credentials.json")],
            "host dirs": [str(p) for p in (root / "tmp").glob("sandfleet-host-*")]}


def test_a_hand_made_cluster_runs_a_wave_through_the_cli_and_the_sweep_leaves_nothing(tmp_path, monkeypatch):
    before_net, before = _machine_net(), leftovers.snapshot()
    host_dirs = set(Path("/tmp").glob("sandfleet-host-*"))  # the suite's own fleet may hold one: only new ones count
    home = tmp_path / "head-home"  # the head machine's user's home: its ~/.ray/auth_token
    home.mkdir()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    base_env["RAY_USAGE_STATS_ENABLED"] = "0"
    ray_tmp = tempfile.mkdtemp(prefix="sfhand-", dir="/tmp")  # short: Ray's unix sockets live under it
    tag = os.path.basename(ray_tmp)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, start_new_session=True)
    nodes: isolated.IsolatedNodes | None = None
    head = None
    head_net = None
    t0 = time.monotonic()
    try:
        assert holder.stdout.readline().strip() == b"ok"
        head_net = _ns(holder.pid, "net")
        assert head_net != before_net["inode"]

        # the head machine: its token, then `ray start --head` (token auth on: a token is at hand)
        head_env = dict(base_env, HOME=str(home))
        subprocess.run(_in_head([RAY, "get-auth-token", "--generate"], holder.pid), env=head_env, check=True,
                       capture_output=True, timeout=60)
        token = (home / ".ray" / "auth_token").read_text().strip()
        assert token
        head_log = open(tmp_path / "head.log", "wb")
        head = subprocess.Popen(_in_head([RAY, "start", "--head", "--block", "--port", "6379", "--node-ip-address",
                                          isolated.HEAD_IP, "--temp-dir", ray_tmp, "--include-dashboard", "false",
                                          "--num-cpus", "1", "--disable-usage-stats"], holder.pid),
                                env=head_env, stdout=head_log, stderr=subprocess.STDOUT, start_new_session=True)
        probe = _in_head([sys.executable, "-c", f"import socket; socket.create_connection(('{isolated.HEAD_IP}', "
                                                "6379), 1)"], holder.pid)
        _wait(lambda: head.poll() is not None or subprocess.run(probe, capture_output=True).returncode == 0,
              "the head's GCS", 60)
        assert head.poll() is None, (tmp_path / "head.log").read_text()[-2000:]

        # two worker machines: `ray start --address` with the head's token (as exported there), offering sandfleet
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        monkeypatch.setenv("RAY_AUTH_TOKEN", token)
        nodes = isolated.IsolatedNodes(tag, {}, head_ns_pid=holder.pid)
        for i in (1, 2):
            nodes.start_node(f"node-{i}", i, HEAD, {"sandfleet": 1}, 100 * 1024 * 1024)
        workers = {f"node-{isolated.node_ip(i)}": nodes.nodes[f"node-{i}"] for i in (1, 2)}
        joined = subprocess.run(_in_head([sys.executable, "-c", JOINED, HEAD], holder.pid), cwd=ROOT,
                                env=dict(base_env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token), capture_output=True,
                                text=True, timeout=200)
        assert joined.returncode == 0, (joined.stderr[-2000:], {n: w.log[-5:] for n, w in workers.items()})
        monkeypatch.delenv("RAY_AUTH_MODE")
        monkeypatch.delenv("RAY_AUTH_TOKEN")
        t_cluster = time.monotonic() - t0

        # the driver, on the head machine, with only ~/.ray/auth_token
        cfg = tmp_path / "wave.yaml"
        cfg.write_text("tasks: 4\nconcurrency: 4\nseed: 11\nfaults: [PK1]\n"
                       "fault_timing: {PK1: {after_model_calls: [2, 3]}}\nworkload: {steps: 8, think_ms: 300}\n"
                       "min_sandbox_nodes: 2\n")
        results = tmp_path / "r"
        out_log = open(tmp_path / "driver.out", "wb")
        t_wave = time.monotonic()
        driver = subprocess.Popen(_in_head([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--address",
                                            HEAD, "--results", str(results), "--no-progress"], holder.pid),
                                  env=head_env, cwd=ROOT, stdout=out_log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        try:
            # mid-wave: once an attempt runs on the first worker and its runner.log has come back while it ran,
            # that worker's sandbox host actor process is killed (by its PID, seen from this machine)
            target = workers[f"node-{isolated.node_ip(1)}"]

            def streamed():
                if driver.poll() is not None:
                    raise AssertionError(f"the wave ended first: {(tmp_path / 'driver.out').read_text()[-3000:]}")
                wave = results / "latest"
                tl = _timeline(wave)
                ended = {e["sandbox"] for e in tl if e["event"] == "attempt_end"}
                for e in tl:
                    if e["event"] == "attempt_start" and e["node"] == f"node-{isolated.node_ip(1)}" \
                            and e["sandbox"] not in ended:
                        log = wave / "sandboxes" / e["sandbox"] / "runner.log"
                        if log.is_file() and log.stat().st_size > 0 and _sandbox_pids(target.ns["pid"]):
                            return e["sandbox"], log.stat().st_size
                return None

            victim, streamed_bytes = _wait(streamed, "an attempt on node-1 whose runner.log came back while it ran",
                                           240, 0.1)
            hosts = [p for p in _pids_in("pid", target.ns["pid"]) if _cmd(p).startswith("ray::SandboxHost")]
            assert len(hosts) == 1, [(p, _cmd(p)[:80]) for p in _pids_in("pid", target.ns["pid"])]
            os.kill(hosts[0], signal.SIGKILL)
            killed_in = time.monotonic() - t_wave
            driver.wait(400)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait(10)
        wall = time.monotonic() - t_wave
        said = (tmp_path / "driver.out").read_text()
        assert driver.returncode == 2, said[-3000:]
        print(said[-1500:])

        wave = (results / "latest").resolve()
        wave_id = wave.name
        tl = _timeline(wave)
        starts = [e for e in tl if e["event"] == "attempt_start"]
        assert starts and {e["node"] for e in starts} <= set(workers), [e["node"] for e in starts]
        nodes_json = orjson.loads((wave / "nodes.json").read_bytes())
        assert {n["name"] for n in nodes_json if n.get("sandboxes")} == set(workers), nodes_json
        assert [n["address"] for n in nodes_json if n["head"]] == [isolated.HEAD_IP], nodes_json
        logs = {e["sandbox"]: wave / "sandboxes" / e["sandbox"] / "runner.log" for e in starts}
        missing = [s for s, p in logs.items() if not p.is_file()]
        assert not missing, f"attempts without a runner.log: {missing} of {len(logs)}"
        said_something = [s for s, p in logs.items() if p.stat().st_size > 0]
        victim_log = logs[victim].read_bytes()
        assert len(victim_log) >= streamed_bytes and b"resumed attempt=" in victim_log, victim_log[:300]
        on_victim_node = [e["sandbox"] for e in starts if e["node"] == f"node-{isolated.node_ip(1)}"]

        # the dead host's sandboxes, cgroups, mounts and dir (credentials included) are still on its node
        left = _node_leftovers(target, wave_id)
        assert left["host dirs"], left

        # `sandfleet sweep --cluster`, on the head machine, with only $RAY_AUTH_TOKEN
        sw = subprocess.run(_in_head([sys.executable, "-m", "cluster.cli", "sweep", "--cluster", HEAD], holder.pid),
                            env=dict(base_env, RAY_AUTH_TOKEN=token), cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
        assert sw.returncode == 0, (sw.stdout[-3000:], sw.stderr[-3000:])
        for ip in (isolated.node_ip(1), isolated.node_ip(2)):
            assert f"node {ip} (" in sw.stdout, sw.stdout
        assert "the dir of a dead sandbox host" in sw.stdout, sw.stdout
        print("\n".join(line for line in sw.stdout.splitlines() if isolated.node_ip(1) in line)[-1500:])
        for name, node in workers.items():
            deadline = time.monotonic() + 20
            while any((got := _node_leftovers(node, wave_id)).values()) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not any(got.values()), (name, got)
        print(f"\ncluster up in {t_cluster:.1f} s; wave wall {wall:.1f} s (host killed {killed_in:.1f} s in); "
              f"attempts {len(starts)} ({len(on_victim_node)} on the "
              f"killed host's node); runner.logs {len(logs) - len(missing)}/{len(logs)}, "
              f"{len(said_something)} non-empty; victim's log streamed {streamed_bytes} B before the kill, "
              f"{len(victim_log)} B kept")
    finally:
        if nodes is not None:
            nodes.stop()  # each worker's pid namespace, by its first process's pid
        if head is not None and head.poll() is None:
            os.killpg(head.pid, signal.SIGTERM)
            try:
                head.wait(15)
            except subprocess.TimeoutExpired:
                pass
        if head_net is not None:  # whatever is left in the head machine's namespace is this test's: by PID
            for _ in range(50):
                pids = [p for p in _pids_in("net", head_net) if p != holder.pid]
                if not pids:
                    break
                for p in pids:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.2)
        holder.stdin.close()
        holder.wait(10)
        import shutil

        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert _machine_net() == before_net, "the machine's own network namespace changed"
    assert not [d for d in isolated.leftover_node_cgroups() if f".{tag}." in d]
    assert _pids_in("net", head_net) == [], "processes left in the head machine's namespace"
    left = leftovers.wait_clean(before)
    assert not left, f"left behind: {left}"
    assert not set(Path("/tmp").glob("sandfleet-host-*")) - host_dirs
