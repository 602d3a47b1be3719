"""`sandfleet up` / `status` / `down` and waves that attach to the fleet (`--address fleet`), through the CLI as a
user runs them: two waves side by side on one fleet both pass with their own keys at its one store (a key book that
overwrote the other's identities would make the other wave's store calls 403), nothing of the fleet is started
twice, `down` leaves nothing; a daemon killed with SIGKILL is found by `status` and ended by `sandfleet sweep`."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests import leftovers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _cli(*args, env, timeout=300, wait=True):
    argv = [sys.executable, "-m", "cluster.cli", *args]
    if not wait:
        return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _marked(marker: str) -> list[str]:
    """Command lines of processes that carry the fleet's own marker (its state dir or its Ray temp dir)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and p.name != str(os.getpid()):
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd:
                out.append(f"{p.name} {cmd[:120]}")
    return out


def _gone(info: dict, timeout_s: float = 20.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = _marked(info["state_dir"] + "/") + leftovers.ray_processes(info["ray"]["tmpdir"])
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _actor_pid(title: str, info: dict) -> int:
    """The pid of the fleet's actor process retitled `title` (one of its Ray's: its temp dir is open in it)."""
    from fleet.markers import proc_cmdline, of_ray

    found = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and proc_cmdline(pid).startswith(title)
             and of_ray(pid, proc_cmdline(pid), info["ray"]["tmpdir"])]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture
def fleet_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # not the test session's Ray
    env.update(RAY_USAGE_STATS_ENABLED="0", SANDFLEET_FLEET_FILE=str(tmp_path / "run" / "fleet.json"))
    yield env
    if Path(env["SANDFLEET_FLEET_FILE"]).exists():  # a failed test still stops what it started
        _cli("down", env=env, timeout=120)


def test_waves_attach_to_a_fleet_that_is_up_side_by_side_and_down_leaves_nothing(fleet_env, tmp_path):
    env, record = fleet_env, Path(fleet_env["SANDFLEET_FLEET_FILE"])
    cfg = tmp_path / "wave.yaml"  # the kill at a boundary (after the 2nd and 3rd model call), not at a moment
    cfg.write_text("tasks: 2\nconcurrency: 2\nfaults: [PK1]\nfault_timing: {PK1: {after_model_calls: [2, 3]}}\n"
                   "workload: {steps: 5, think_ms: 50}\n")
    wave = ["wave", "run", str(cfg), "--address", "fleet", "--no-progress"]
    p = _cli(*wave, "--results", str(tmp_path / "r0"), env=env)
    assert p.returncode == 2 and "no fleet is up" in p.stderr and "sandfleet up" in p.stderr, p.stderr[-1000:]
    assert _cli("status", env=env).returncode == 1

    p = _cli("up", env=env, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    info = orjson.loads(record.read_bytes())
    assert record.stat().st_mode & 0o777 == 0o600 and record.parent.stat().st_mode & 0o777 == 0o700
    again = _cli("up", env=env)
    assert again.returncode == 0 and "already up" in again.stdout and str(info["pid"]) in again.stdout, again.stdout
    st = _cli("status", env=env)
    assert st.returncode == 0 and "ray_answers: True" in st.stdout and "store_answers: True" in st.stdout, st.stdout
    fleet_procs = sorted(_marked(info["state_dir"] + "/"))  # its store
    assert any("weed" in c for c in fleet_procs), fleet_procs

    waves = [_cli(*wave, "--seed", str(seed), "--results", str(tmp_path / f"r{seed}"), env=env, wait=False)
             for seed in (1, 2)]
    from cluster import localfleet

    seen: set = set()  # the waves the fleet names as attached, while they run (each is attached for seconds)
    deadline = time.monotonic() + 300
    while any(w.poll() is None for w in waves) and time.monotonic() < deadline:
        seen |= {x["pid"] for x in localfleet.attached_waves(info)}
        time.sleep(0.02)
    outs = [w.communicate(timeout=300) for w in waves]
    assert seen == {w.pid for w in waves}, (seen, [w.pid for w in waves])
    for w, (stdout, stderr) in zip(waves, outs):
        assert w.returncode == 0, (stdout[-1000:], stderr[-2000:])
    for seed in (1, 2):
        d = (tmp_path / f"r{seed}" / "latest").resolve()
        events = [orjson.loads(x) for x in (d / "timeline.jsonl").read_bytes().splitlines()]
        ready = next(e for e in events if e["event"] == "parts_ready")
        # the fleet's store, bucket and actors, none of its own: attached, not started
        assert ready["store_lent"] and ready["bucket"] == info["bucket"] and "fleet_attach_s" in ready, ready
        assert ready["pids"]["store"] == info["store"]["pid"], ready["pids"]
        assert ready["pids"]["sandbox hosts"] == [h["pid"] for h in info["host_info"]], ready["pids"]
        keys = {orjson.loads(x).get("key", "") for x in (d / "proxy-requests.jsonl").read_bytes().splitlines()}
        assert keys and all(k.startswith(d.name + "/") for k in keys if k), sorted(keys)[:5]
        verdict = orjson.loads((d / "verdict.json").read_bytes())
        assert verdict["verdict"] == "pass", verdict
    assert sorted(_marked(info["state_dir"] + "/")) == fleet_procs  # nothing of the fleet started twice
    assert "waves: none" in _cli("status", env=env).stdout and not localfleet.attached_waves(info)

    p = _cli("down", env=env, timeout=120)
    assert p.returncode == 0 and "fleet down" in p.stdout, (p.stdout, p.stderr[-2000:])
    assert not record.exists()
    assert not _gone(info)
    assert _cli("status", env=env).returncode == 1


def test_a_killed_fleet_daemon_is_named_by_status_and_ended_by_the_sweep(fleet_env):
    env, record = fleet_env, Path(fleet_env["SANDFLEET_FLEET_FILE"])
    assert _cli("up", env=env, timeout=180).returncode == 0
    info = orjson.loads(record.read_bytes())
    os.kill(info["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 20
    while Path(f"/proc/{info['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    st = _cli("status", env=env)
    assert st.returncode == 1 and "dead one" in st.stdout and "sandfleet sweep" in st.stdout, st.stdout
    up = _cli("up", env=env)
    assert up.returncode == 2 and "sandfleet sweep" in up.stderr, up.stderr  # not a second fleet over the first's
    sw = _cli("sweep", env=env, timeout=120)
    assert sw.returncode == 0, sw.stderr[-2000:]
    assert f"record of a `sandfleet up` fleet whose daemon is gone: {record}" in sw.stdout, sw.stdout
    assert not record.exists()
    assert not _gone(info)


def test_two_ups_at_once_make_one_fleet_and_down_ends_it_through_a_damaged_record(fleet_env):
    env, record = fleet_env, Path(fleet_env["SANDFLEET_FLEET_FILE"])
    ups = [_cli("up", env=env, wait=False) for _ in range(2)]
    outs = [u.communicate(timeout=180) for u in ups]
    assert [u.returncode for u in ups] == [0, 0], outs
    info = orjson.loads(record.read_bytes())
    assert all(f"pid {info['pid']}" in o[0] for o in outs), outs  # the second found the first's fleet
    from cluster import localfleet

    assert localfleet.daemons(record) == [info["pid"]]
    record.write_bytes(record.read_bytes()[:300])  # damaged while its daemon runs
    st = _cli("status", env=env)
    assert st.returncode == 2 and "is not the record of a `sandfleet up` fleet" in st.stderr, st.stderr
    p = _cli("down", env=env, timeout=120)
    assert p.returncode == 0 and f"fleet down (pid {info['pid']})" in p.stdout, (p.stdout, p.stderr[-2000:])
    assert not record.exists() and not _gone(info)


@pytest.mark.parametrize("part", ["sandbox host", "lease ledger"])
def test_a_wave_that_finds_a_fleet_part_hung_leaves_it_and_a_dead_part_stops_the_fleet(fleet_env, tmp_path, part):
    """A wave attached to the fleet never ends the fleet's actors (they serve other waves): a host or ledger it finds
    hung is its harness fault (exit 2), and the part runs on once it answers again (a hung ledger: the wave does not
    ask the sweep actor for a last pass that reads it). A part that died stops the fleet (no wave could run on it):
    the daemon says so, removes its record and leaves nothing."""
    env, record = fleet_env, Path(fleet_env["SANDFLEET_FLEET_FILE"])
    assert _cli("up", env=env, timeout=180).returncode == 0
    info = orjson.loads(record.read_bytes())
    host = info["host_info"][0]["pid"] if part == "sandbox host" else _actor_pid("ray::LeaseLedger", info)
    host_start = Path(f"/proc/{host}/stat").read_text().split(") ", 1)[1].split()[19]
    cfg = tmp_path / "wave.yaml"
    cfg.write_text("tasks: 1\nconcurrency: 1\nfaults: none\nworkload: {steps: 40, think_ms: 200}\n"
                   "health: {actor_timeout_s: 1, actor_strikes: 2}\n")
    wave = _cli("wave", "run", str(cfg), "--address", "fleet", "--results", str(tmp_path / "r"), "--no-progress",
                env=env, wait=False)
    timeline = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and wave.poll() is None:  # the condition: an attempt runs on the host
        timeline = next((tmp_path / "r").glob("w-*/timeline.jsonl"), None)
        if timeline is not None and b'"attempt_start"' in timeline.read_bytes():
            break
        time.sleep(0.1)
    assert timeline is not None and wave.poll() is None, wave.communicate()
    os.kill(host, signal.SIGSTOP)
    try:  # hung until the wave called it its harness fault (then it may reap what the wave's sweep kills)
        deadline = time.monotonic() + 120
        while b'"harness_fault"' not in timeline.read_bytes() and wave.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        os.kill(host, signal.SIGCONT)
    stdout, stderr = wave.communicate(timeout=120)
    assert wave.returncode == 2 and part in stderr, (stdout[-1000:], stderr[-2000:])
    if part == "lease ledger":  # no last pass of the sweep actor, which would wait out its timeouts on it
        sweeper = orjson.loads(next((tmp_path / "r").glob("w-*/sweeper.json")).read_bytes())
        assert sweeper.get("unavailable") and "the lease ledger is lost" in sweeper["errors"][0], sweeper
    assert Path(f"/proc/{host}/stat").read_text().split(") ", 1)[1].split()[19] == host_start  # not ended
    assert _cli("status", env=env).returncode == 0

    os.kill(host, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{info['pid']}").exists() and time.monotonic() < deadline:  # its watch sees the death
        time.sleep(0.2)
    assert not record.exists()
    died = "sandbox host node-0 died" if part == "sandbox host" else "lease ledger died"
    assert died in (record.parent / "fleet.log").read_text()
    assert _cli("status", env=env).returncode == 1
    assert not _gone(info)


def _holders(path: Path) -> list[int]:
    """Every process with a descriptor open on `path`."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if any(os.readlink(f) == str(path) for f in (p / "fd").iterdir()):
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def test_a_fleet_daemon_started_under_a_lock_does_not_hold_it(fleet_env, tmp_path):
    """Issue 42: a daemon starts clean. `sandfleet up` run by a caller holding an inherited flock (as `flock LOCK
    make test` does): once up, no process of the fleet (its daemon, its Ray, its store) holds the lock, and the
    daemon and its store each lead a session of their own."""
    from tests.unit.test_daemons_clean import held_lock

    env, record, lock = fleet_env, Path(fleet_env["SANDFLEET_FLEET_FILE"]), tmp_path / "make.lock"
    fd = held_lock(lock)
    try:
        p = subprocess.run([sys.executable, "-m", "cluster.cli", "up"], env=env, cwd=ROOT, capture_output=True,
                           text=True, timeout=180, pass_fds=(fd,))
        assert p.returncode == 0, p.stderr[-2000:]
        info = orjson.loads(record.read_bytes())
        assert _holders(lock) == [os.getpid()], (_holders(lock), info["pid"])
        assert os.getsid(info["pid"]) == info["pid"]
        store = [int(x.split()[0]) for x in _marked(info["state_dir"] + "/") if "weed" in x]
        assert store and all(os.getsid(pid) == pid for pid in store), store
    finally:
        os.close(fd)
        assert _cli("down", env=env, timeout=120).returncode == 0


def _wait_for(path: Path, text: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return True
        time.sleep(0.1)
    return False


def test_a_wave_on_a_fleet_stopped_at_once_leaves_no_key_of_its_own_at_the_fleets_store(fleet_env, tmp_path):
    """A second Ctrl-C ends the wave at once, but the fleet's store outlives it: the wave's keys die at it before
    the wave exits, the one issued ahead for an attempt still waiting on a busy lease (PK6's zombie) too."""
    env, record = fleet_env, Path(fleet_env["SANDFLEET_FLEET_FILE"])
    assert _cli("up", env=env, timeout=180).returncode == 0
    info = orjson.loads(record.read_bytes())
    cfg = tmp_path / "wave.yaml"  # the new attempt waits up to 20 s for the zombie's lease to run out
    cfg.write_text("tasks: 1\nconcurrency: 1\nfaults: [PK6]\nlease_ttl_s: 20\ndeadline_s: 90\n"
                   "fault_timing: {PK6: {after_model_calls: [2, 3]}}\nworkload: {steps: 6, think_ms: 80}\n")
    err = tmp_path / "wave.err"
    with err.open("w") as f:
        wave = subprocess.Popen([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--address", "fleet",
                                 "--no-progress", "--results", str(tmp_path / "r")], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=f)
    try:
        timeline = tmp_path / "r" / "latest" / "timeline.jsonl"
        assert _wait_for(timeline, '"lease_busy"', 120), err.read_text()[-2000:]
        wave.send_signal(signal.SIGINT)
        assert _wait_for(err, "stopping wave", 30), err.read_text()[-2000:]
        wave.send_signal(signal.SIGINT)
        wave.wait(60)
    finally:
        if wave.poll() is None:
            wave.kill()
            wave.wait(10)
    wave_id = (tmp_path / "r" / "latest").resolve().name
    [identities] = list(Path(info["state_dir"]).rglob("identities.json"))
    scope = f"{info['bucket']}/{wave_id}/"
    live = [i["name"] for i in orjson.loads(identities.read_bytes())["identities"]
            if any(scope in a for a in i.get("actions") or [])]
    assert not live, live
    assert _cli("down", env=env, timeout=120).returncode == 0
    assert not _gone(info)
