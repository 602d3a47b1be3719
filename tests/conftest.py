"""Test set-up shared by every tier.

One session-scoped Ray (private temp dir, usage stats off, an explicit auth
token) with one ledger actor and one sandbox host actor, lent to every wave.
The session ends by asserting that nothing it started is left: marked
processes, sandbox cgroups, mounts, Ray processes, listening ports.
"""
from __future__ import annotations

import os
import secrets
import time

import pytest

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))

from tests import leftovers  # noqa: E402


def _can_run_real_parts() -> str | None:
    from fleet.sandbox import SandboxError, check_process_backend
    from fleet.cgroups import CgroupError

    try:
        check_process_backend()
    except (SandboxError, CgroupError) as exc:
        return str(exc)
    return None


SUITE_LOCK = "/run/sandfleet-test-suite.lock"


def _needs_the_machine(session) -> bool:
    """A session that runs a real part or checks the host for leftovers (the integration tier, or any test of
    the `baseline` fixture); a session of pure unit and harness tests shares the machine with a running suite."""
    return any("integration" in item.path.parts or "baseline" in getattr(item, "fixturenames", ())
               for item in session.items)


_LOCK_FD: list[int] = []


def _held_by_an_ancestor(path: str) -> bool:
    """The lock is already this process's: an ancestor took it (`flock LOCK pytest ...`, as the README and the
    benches say to wrap a run). Waiting for it would wait for ourselves (/proc/locks names the holder's PID)."""
    try:
        st = os.stat(path)
        ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"  # as the kernel prints it
        holders = set()
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
                    continue  # a waiter's line, or another kind of lock
                if parts[5] == ident:
                    holders.add(int(parts[4]))
    except (OSError, ValueError):
        return False
    pid = os.getpid()
    for _ in range(64):  # bounded: the chain of parents up to init
        if pid in holders:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def pytest_collection_finish(session):
    """One suite at a time on a machine: the leftover checks below see every sandfleet process,
    cgroup and mount on the host, so a second suite (or CI beside a developer's run) would read
    the first one's live waves as leaks. Waits (bounded, 30 min) for the other suite instead.
    Taken here, between collection and the first test, so that no per-test timeout cuts the wait
    short (a wait cut at the first test's 600 s failed every test of a suite queued behind a bench)."""
    import fcntl

    if _LOCK_FD or not _needs_the_machine(session) or _held_by_an_ancestor(SUITE_LOCK):
        return
    import threading

    fd = os.open(SUITE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    got = threading.Event()

    def take() -> None:  # a blocking wait queues with flock(1)'s waiters; polling lost to them every time
        fcntl.flock(fd, fcntl.LOCK_EX)
        got.set()

    threading.Thread(target=take, name="suite-lock", daemon=True).start()
    if not got.wait(30 * 60):
        pytest.exit(f"another sandfleet test suite held {SUITE_LOCK} for 30 minutes", returncode=3)
    _LOCK_FD.append(fd)


def pytest_sessionfinish(session):
    import fcntl

    while _LOCK_FD:
        fd = _LOCK_FD.pop()
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@pytest.fixture(scope="session", autouse=True)
def suite_lock(request):
    """The machine is this session's (taken at the end of collection, see above), when it needs it."""
    yield


@pytest.fixture(autouse=True)
def cwd_kept():
    """A test that leaves the process in another directory fails: Ray workers of a fleet started later import
    `tests` from the directory the driver was in (a leaked `os.chdir` once broke an unrelated test's actors)."""
    before = os.getcwd()
    yield
    after = os.getcwd()
    if after != before:
        os.chdir(before)
        pytest.fail(f"the test left the working directory at {after} (use monkeypatch.chdir)")


@pytest.fixture(scope="session")
def baseline(suite_lock):
    from fleet import cgroups

    return {"snapshot": leftovers.snapshot(), "ports": leftovers.listening_ports(), "harness": cgroups.harness_dirs()}


@pytest.fixture(scope="session")
def fleet(baseline):
    why = _can_run_real_parts()
    if why:
        pytest.fail(f"integration tests need the real parts: {why}")
    from cluster.raycluster import FleetSession

    # the session's fleet lends its store to every wave: that weed process is the session's, like its Ray, and
    # is part of the baseline every test's leftover check compares with until the session ends
    session = FleetSession("local", store=True).start()
    tmpdir = session.ray_session.tmpdir
    fleet_own = [p for p in leftovers.marked_processes() if session.state_dir in p]
    assert fleet_own, "the session fleet's store process is not found"
    baseline["snapshot"]["processes"] += fleet_own
    yield session
    session.stop()
    for p in fleet_own:
        baseline["snapshot"]["processes"].remove(p)
    deadline = time.monotonic() + 20
    while leftovers.ray_processes(tmpdir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not leftovers.ray_processes(tmpdir), "Ray processes left after the session"
    while leftovers.forwarders() and time.monotonic() < deadline:  # (they end with their host actors)
        time.sleep(0.2)
    assert not leftovers.forwarders(), f"sandbox hosts' relays left after the session: {leftovers.forwarders()}"
    left = leftovers.wait_clean(baseline["snapshot"])
    assert not left, f"left behind after the test session: {left}"
    from fleet import cgroups

    deadline = time.monotonic() + 20  # a killed actor's process (and so its cgroup) can take a moment to go
    while cgroups.harness_dirs() != baseline["harness"] and time.monotonic() < deadline:
        time.sleep(0.2)
    left = sorted(set(cgroups.harness_dirs()) - set(baseline["harness"]))
    assert not left, f"a harness cgroup was left behind: {[d for d in left if '.' not in d.rsplit('/', 1)[-1]]}"
    deadline = time.monotonic() + 20
    while (leftovers.listening_ports() - baseline["ports"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (leftovers.listening_ports() - baseline["ports"]), "listening ports left after the session"


@pytest.fixture
def results_root(tmp_path):
    return tmp_path / "results"
